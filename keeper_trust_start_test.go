package runlease_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// plainStore hides every capability of the store it wraps but the Store
// methods: a lease on it renews alone, never in a batch.
type plainStore struct{ runlease.Store }

// TestKeeperTrustStartsWhenTheLastWriteWasSent proves the README's
// "trusted until = start of the last successful write + TTL − margin": a
// row is stamped from a reading taken as its write is sent, so a reply that
// comes back late must not move the start of the trust window later. The
// clock that judges expiry stands still or lags the monotonic clock, so
// that the second bound (the row's until_ms less the margin, by that clock)
// lies later and cannot hide a trust window counted from the reply.
//
// Each case checks TrustedUntil after the acquisition and after a renewal
// (alone, or in a batch with another lease of the Renewer), then hangs the
// store and checks that the keeper ends exactly at the renewal's send +
// TTL − margin, with ErrTrustExpired and its work context cancelled.
func TestKeeperTrustStartsWhenTheLastWriteWasSent(t *testing.T) {
	t.Parallel()
	const delay = time.Second // each reply's lateness
	const trust = runlease.MinTTL - runlease.MinTTL/10
	for _, c := range []struct {
		name  string
		clock func(start time.Time) func() time.Time
		batch bool
	}{
		{"alone_with_an_expiry_clock_that_stands_still", stillClock, false},
		{"alone_with_an_expiry_clock_that_lags", laggingClock, false},
		{"in_a_batch_with_an_expiry_clock_that_stands_still", stillClock, true},
		{"in_a_batch_with_an_expiry_clock_that_lags", laggingClock, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx := t.Context()
				s := &slowReplies{SQLiteStore: bubbleStore(t), delay: delay}
				var store runlease.Store = plainStore{s}
				if c.batch {
					store = s
				}
				renewed := make(chan runlease.RenewEvent, 16)
				opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(c.clock(time.Now())),
					runlease.WithHooks(runlease.Hooks{Renewed: func(e runlease.RenewEvent) { renewed <- e }})}

				// Acquired together, the leases of the batch case come due
				// on one beat: their renewals share one MetaCASMany.
				runs := []string{"r1"}
				if c.batch {
					runs = append(runs, "r2")
				}
				leases := make([]*runlease.Lease, len(runs))
				sent := time.Now()
				var wg sync.WaitGroup
				for i, run := range runs {
					wg.Go(func() {
						l, err := runlease.Acquire(ctx, store, run, "A", opts...)
						assert.NoError(t, err)
						leases[i] = l
					})
				}
				wg.Wait()
				require.NotContains(t, leases, (*runlease.Lease)(nil))
				require.Equal(t, sent.Add(delay), time.Now(), "the acquisitions' replies came late")

				r := &runlease.Renewer{}
				defer r.Close()
				keepers := make([]*runlease.Keeper, len(leases))
				for i, l := range leases {
					k, err := r.Keep(ctx, l)
					require.NoError(t, err)
					keepers[i] = k
					assert.Equal(t, sent.Add(trust), k.TrustedUntil(), "trusted from the acquisition's send")
				}

				// The first renewal of each: once its Renewed hook has run,
				// its outcome is recorded and the next one is not due yet.
				for range leases {
					require.NoError(t, (<-renewed).Err)
				}
				sent = s.lastSent()
				if c.batch {
					s.mu.Lock()
					require.Equal(t, 1, s.many, "the renewals shared one MetaCASMany")
					s.mu.Unlock()
				}
				require.Equal(t, sent.Add(delay), time.Now(), "the renewal's reply came late")
				for _, k := range keepers {
					assert.Equal(t, sent.Add(trust), k.TrustedUntil(), "trusted from the renewal's send")
				}

				// No write lands any more: each keeper ends when the trust
				// counted from that send runs out, not a reply's delay later.
				s.hang()
				time.Sleep(time.Until(sent.Add(trust)) - time.Millisecond)
				for _, k := range keepers {
					require.NoError(t, k.Err(), "trusted until a millisecond before its end")
				}
				time.Sleep(time.Millisecond)
				synctest.Wait()
				for _, k := range keepers {
					select {
					case <-k.Done():
					default:
						t.Fatalf("the keeper still trusts its lease at the renewal's send + TTL - margin")
					}
					require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
					require.ErrorIs(t, context.Cause(k.Context()), runlease.ErrTrustExpired)
				}
			})
		})
	}
}
