package runleaseotel_test

import (
	"testing"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/runleaseotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
)

const (
	attempts = "runlease.lease.acquire.attempts"
	acquireS = "runlease.lease.acquire.duration"
	renewS   = "runlease.lease.renew.duration"
	timeLeft = "runlease.lease.renew.time_left"
	lost     = "runlease.lease.lost"
)

var (
	acquired = runleaseotel.OutcomeKey.String("acquired")
	refused  = runleaseotel.OutcomeKey.String("refused")
	failed   = runleaseotel.OutcomeKey.String("failed")
)

func Test_acquire_attempts_are_counted_by_outcome_with_their_latency(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := t.Context()
	lease, err := runlease.Acquire(ctx, b.store, "run-1", "driver-a", b.hooks())
	require.NoError(t, err)
	_, err = runlease.Acquire(ctx, b.store, "run-1", "driver-b", b.hooks())
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	_, err = runlease.Acquire(ctx, b.store, "run-1", "driver-c", b.hooks())
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	ok, err := b.store.MetaCAS(ctx, runlease.LeasePrefix+"broken", nil, "not a lease row")
	require.NoError(t, err)
	require.True(t, ok)
	_, err = runlease.Acquire(ctx, b.store, "broken", "driver-a", b.hooks())
	require.ErrorIs(t, err, runlease.ErrCorruptRow)
	require.NoError(t, lease.Release(ctx))

	c := b.collect(t)
	assert.EqualValues(t, 1, c.value(t, attempts, acquired))
	assert.EqualValues(t, 2, c.value(t, attempts, refused, runleaseotel.ErrorTypeKey.String(runlease.CodeLeaseLost)))
	assert.EqualValues(t, 1, c.value(t, attempts, failed, runleaseotel.ErrorTypeKey.String(runlease.CodeCorruptRow)))
	_, points := c.int64s(t, attempts)
	assert.Equal(t, 3, points, "one series per outcome and error type")

	for _, tc := range []struct {
		name    string
		outcome attribute.KeyValue
		count   uint64
	}{
		{"acquired", acquired, 1},
		{"refused", refused, 2},
		{"failed", failed, 1},
	} {
		h := c.histogram(t, acquireS, tc.outcome)
		assert.Equal(t, tc.count, h.Count, tc.name)
		assert.Greater(t, h.Sum, 0.0, "%s: an acquisition on a real store takes time", tc.name)
		assert.Less(t, h.Sum, 60.0, "%s: latency is in seconds", tc.name)
	}
	assert.NotContains(t, c.attributeKeys(), runleaseotel.RunIDKey, "no run id attribute by default")
}

func Test_the_run_id_is_an_attribute_only_when_asked_for(t *testing.T) {
	t.Parallel()
	b := newBench(t, runleaseotel.WithRunIDAttribute(), runleaseotel.WithScopes(runlease.MemScope(1)))
	lease, err := runlease.Acquire(t.Context(), b.store, "run-7", "driver-a", b.hooks())
	require.NoError(t, err)
	_, err = lease.ClaimSlots(t.Context(), []runlease.Scope{runlease.MemScope(1)})
	require.NoError(t, err)
	c := b.collect(t)
	assert.EqualValues(t, 1, c.value(t, "runlease.slot.count", scope("mem"), held))
	assert.EqualValues(t, 1, c.value(t, attempts, acquired, runleaseotel.RunIDKey.String("run-7")))
	for _, key := range []string{"runlease.lease.count", "runlease.slot.count"} {
		m, ok := c.metric(key)
		require.True(t, ok, key)
		assert.NotContains(t, collected{rmOf(m)}.attributeKeys(), runleaseotel.RunIDKey, "%s carries no run id", key)
	}
}

func Test_renewals_by_a_keeper_record_their_latency_and_the_trust_time_left(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := t.Context()
	own, renewed, _, _ := events()
	const ttl = 5 * time.Second
	lease, err := runlease.Acquire(ctx, b.store, "run-1", "driver-a", runlease.WithTTL(ttl),
		runlease.WithHooks(runleaseotel.Chain(b.metrics.Hooks(), own)))
	require.NoError(t, err)
	keeper, err := runlease.Keep(ctx, lease, runlease.KeepInterval(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(keeper.Stop)
	for range 3 {
		require.NoError(t, await(t, renewed, "renewal").Err)
	}
	keeper.Stop()
	n := uint64(3) + uint64(len(renewed)) // renewals reported before Stop returned

	c := b.collect(t)
	h := c.histogram(t, renewS, runleaseotel.OutcomeKey.String("renewed"))
	assert.Equal(t, n, h.Count, "one point per renewal the keeper reported")
	assert.Greater(t, h.Sum, 0.0)
	left := c.histogram(t, timeLeft)
	assert.Equal(t, n, left.Count)
	maxLeft, ok := left.Max.Value()
	require.True(t, ok)
	minLeft, ok := left.Min.Value()
	require.True(t, ok)
	assert.LessOrEqual(t, maxLeft, ttl.Seconds(), "the trust window is shorter than the TTL")
	assert.Greater(t, minLeft, 1.0, "renewing every 100ms leaves most of a 4.5s window")
}

func Test_a_lost_lease_is_counted_by_its_reason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		reason string
		take   func(t *testing.T, b *bench)
	}{
		{"taken_over", "taken_over", func(t *testing.T, b *bench) {
			// A contender whose clock is past the TTL sees the lease
			// expired and takes it over.
			_, err := runlease.Acquire(t.Context(), b.store, "run-1", "driver-b", ahead(time.Minute), b.hooks())
			require.NoError(t, err)
		}},
		{"released by an operator", "released", func(t *testing.T, b *bench) {
			info, err := runlease.Peek(t.Context(), b.store, "run-1")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(t.Context(), b.store, info))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			own, _, lostCh, _ := events()
			lease, err := runlease.Acquire(t.Context(), b.store, "run-1", "driver-a", runlease.WithTTL(5*time.Second),
				runlease.WithHooks(runleaseotel.Chain(b.metrics.Hooks(), own)))
			require.NoError(t, err)
			keeper, err := runlease.Keep(t.Context(), lease, runlease.KeepInterval(100*time.Millisecond))
			require.NoError(t, err)
			t.Cleanup(keeper.Stop)
			tc.take(t, b)
			require.ErrorIs(t, await(t, lostCh, "loss").Err, runlease.ErrLeaseLost)

			c := b.collect(t)
			assert.EqualValues(t, 1, c.value(t, lost, runleaseotel.ReasonKey.String(tc.reason)))
			_, points := c.int64s(t, lost)
			assert.Equal(t, 1, points, "one reason only")
		})
	}
}
