package etcdstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestClockSkew tests what the package documentation says clock skew
// between nodes does on this store, where each node judges expiry by its own
// clock: a node ahead by less than the holder's margin never takes a lease
// its holder trusts; one ahead by more can; one behind only waits longer;
// and a holder's own clock, however far ahead, never stretches its trust.
// Each node is a client of its own with its clock offset by WithClock.
func TestClockSkew(t *testing.T) {
	requireCluster(t)
	const ttl = runlease.MinTTL
	margin := ttl / 10 // the default KeepMargin
	skewed := func(d time.Duration) runlease.Option {
		return runlease.WithClock(func() time.Time { return time.Now().Add(d) })
	}

	t.Run("a_node_ahead_by_less_than_the_margin_never_takes_a_trusted_lease", func(t *testing.T) {
		t.Parallel()
		a := newStore(t)
		b := reopen(t, a)
		la, err := runlease.Acquire(t.Context(), a, "run", "A", runlease.WithTTL(ttl))
		require.NoError(t, err)
		k, err := runlease.Keep(t.Context(), la)
		require.NoError(t, err)
		ahead := skewed(margin - 100*time.Millisecond)
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			_, err := runlease.Acquire(t.Context(), b, "run", "B", runlease.WithTTL(ttl), ahead)
			require.ErrorIs(t, err, runlease.ErrTakenOver, "the holder renews: its lease stays live by B's clock too")
		}
		// The holder stops renewing (a paused driver), still trusting
		// what it last confirmed. B takes over only after that trust ends.
		trusted := k.TrustedUntil()
		k.Stop()
		for {
			_, err := runlease.Acquire(t.Context(), b, "run", "B", runlease.WithTTL(ttl), ahead)
			if err == nil {
				break
			}
			require.ErrorIs(t, err, runlease.ErrTakenOver)
			time.Sleep(20 * time.Millisecond)
		}
		assert.True(t, time.Now().After(trusted), "B took the run %v before the holder's trust ended", trusted.Sub(time.Now()))
	})

	t.Run("a_node_ahead_by_more_than_the_margin_can_take_a_lease_its_holder_trusts", func(t *testing.T) {
		t.Parallel()
		a := newStore(t)
		b := reopen(t, a)
		la, err := runlease.Acquire(t.Context(), a, "run", "A", runlease.WithTTL(ttl))
		require.NoError(t, err)
		k, err := runlease.Keep(t.Context(), la)
		require.NoError(t, err)
		defer k.Stop()
		// A node a TTL ahead sees every row expired as soon as it is
		// written.
		_, err = runlease.Acquire(t.Context(), b, "run", "B", runlease.WithTTL(ttl), skewed(ttl))
		require.NoError(t, err, "the fast node takes the run over")
		require.NoError(t, k.Err(), "while its holder still trusts it: skew past the margin defeats the trust window")
		select {
		case <-k.Done():
		case <-time.After(ttl):
			t.Fatal("the holder never found out")
		}
		require.ErrorIs(t, k.Err(), runlease.ErrTakenOver, "the holder learns at its next renewal")
	})

	t.Run("a_node_behind_only_waits_longer_to_take_over", func(t *testing.T) {
		t.Parallel()
		a := newStore(t)
		b := reopen(t, a)
		_, err := runlease.Acquire(t.Context(), a, "run", "A", runlease.WithTTL(ttl))
		require.NoError(t, err)
		info, err := runlease.Peek(t.Context(), a, "run")
		require.NoError(t, err)
		const behind = 2 * time.Second
		for {
			_, err := runlease.Acquire(t.Context(), b, "run", "B", runlease.WithTTL(ttl), skewed(-behind))
			if err == nil {
				break
			}
			require.ErrorIs(t, err, runlease.ErrTakenOver)
			time.Sleep(20 * time.Millisecond)
		}
		assert.False(t, time.Now().Before(info.Until.Add(behind)),
			"B took over %v after the row expired, before its own clock said so", time.Since(info.Until))
	})

	t.Run("a_holder_ahead_never_trusts_past_its_ttl", func(t *testing.T) {
		t.Parallel()
		a := newStore(t)
		b := reopen(t, a)
		la, err := runlease.Acquire(t.Context(), a, "run", "A", runlease.WithTTL(ttl), skewed(10*time.Minute))
		require.NoError(t, err)
		k, err := runlease.Keep(t.Context(), la)
		require.NoError(t, err)
		defer k.Stop()
		// Its rows say ten minutes more than the TTL; its trust, counted
		// on its monotonic clock from each renewal's start, does not.
		for end := time.Now().Add(2 * ttl / 3); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			require.NoError(t, k.Err())
			left := time.Until(k.TrustedUntil())
			require.LessOrEqual(t, left, ttl-margin, "trusted for %v more", left)
		}
		info, err := runlease.Peek(t.Context(), b, "run")
		require.NoError(t, err)
		assert.Greater(t, time.Until(info.Until), 9*time.Minute, "its row outlives its trust by the skew")
		_, err = runlease.Acquire(t.Context(), b, "run", "B", runlease.WithTTL(ttl))
		require.ErrorIs(t, err, runlease.ErrTakenOver, "others wait for the row's own expiry, ten minutes late: a cost, not a hazard")
	})
}
