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
	"github.com/areev/runlease/internal/testkit"
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

// TestKeeperTrustedUntilEndsWithTheKeeper: a driver that uses
// Keeper.TrustedUntil as the deadline of its side effects must see no trust
// left (a moment that has passed, as Slots.TrustedUntil reports after a
// loss) once the lease is known lost or the keeper has ended, however it
// ended; while the keeper runs, it is in the future.
func TestKeeperTrustedUntilEndsWithTheKeeper(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	cases := []struct {
		name string
		end  func(t *testing.T, s runlease.Store, k *runlease.Keeper)
		// lost: the keeper ends with the lease's loss (RUN-E021).
		lost bool
	}{{
		name: "released_by_an_operator_found_by_Renew",
		lost: true,
		end: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			info, err := runlease.Peek(t.Context(), s, "r1")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
			require.ErrorIs(t, k.Lease().Renew(t.Context()), runlease.ErrReleased)
		},
	}, {
		name: "released_by_an_operator_found_by_the_keepers_renewal",
		lost: true,
		end: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			info, err := runlease.Peek(t.Context(), s, "r1")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
			<-k.Done()
		},
	}, {
		name: "taken_over_found_by_the_keepers_renewal",
		lost: true,
		end: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			cur := get(t, s, "runlease:r1")
			ok, err := s.MetaCAS(t.Context(), "runlease:r1", &cur, `{"holder":"B","fence":9,"until_ms":1}`)
			require.NoError(t, err)
			require.True(t, ok)
			<-k.Done()
		},
	}, {
		name: "stopped",
		end:  func(t *testing.T, _ runlease.Store, k *runlease.Keeper) { k.Stop() },
	}, {
		name: "released",
		end: func(t *testing.T, _ runlease.Store, k *runlease.Keeper) {
			require.NoError(t, k.Release(t.Context()))
		},
	}, {
		name: "the_lease_released_by_its_driver",
		end: func(t *testing.T, _ runlease.Store, k *runlease.Keeper) {
			require.NoError(t, k.Lease().Release(t.Context()))
		},
	}, {
		name: "its_context_ended",
		end: func(t *testing.T, _ runlease.Store, k *runlease.Keeper) {
			// The case's context is cancelled below, before end runs.
			<-k.Done()
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := bubbleStore(t)
				l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				k, err := runlease.Keep(ctx, l)
				require.NoError(t, err)
				defer k.Stop()
				time.Sleep(2 * time.Second) // one renewal has landed
				require.True(t, k.TrustedUntil().After(time.Now()), "a running keeper trusts its lease")

				if tc.name == "its_context_ended" {
					cancel()
				}
				tc.end(t, s, k)
				endedAt := time.Now()
				require.Error(t, k.Err())
				if tc.lost {
					require.ErrorIs(t, k.Err(), runlease.ErrLeaseLost)
				}
				// At the moment of the end, and ever after: the lease may
				// even be renewed by hand, which does not revive the keeper.
				assert.False(t, k.TrustedUntil().After(endedAt), "TrustedUntil is %v after the keeper ended",
					k.TrustedUntil().Sub(endedAt))
				time.Sleep(time.Second)
				if !tc.lost && tc.name != "released" && tc.name != "the_lease_released_by_its_driver" {
					require.NoError(t, l.Renew(t.Context()))
				}
				assert.False(t, k.TrustedUntil().After(endedAt), "TrustedUntil is %v after the keeper ended",
					k.TrustedUntil().Sub(endedAt))
			})
		})
	}
}

// uncertainClock is a store whose clock (see runlease.Clock) is the local
// one, read with the given uncertainty.
type uncertainClock struct {
	*runlease.SQLiteStore
	u time.Duration
}

func (c uncertainClock) ClockNow() (time.Time, time.Duration) { return time.Now(), c.u }

// TestKeeperMarginCoversTheStoreClocksUncertainty checks that a keeper
// stops trusting its lease the store clock's uncertainty earlier than the
// margin alone says, for the default margin and for an explicit zero.
func TestKeeperMarginCoversTheStoreClocksUncertainty(t *testing.T) {
	t.Parallel()
	const ttl, u = 10 * time.Second, 2 * time.Second
	for _, c := range []struct {
		name   string
		opts   []runlease.Option
		margin time.Duration
	}{
		{"default_margin", nil, ttl/10 + u},
		{"explicit_zero_margin", []runlease.Option{runlease.KeepMargin(0)}, u},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := uncertainClock{bubbleStore(t), u}
				f := &testkit.Faulty{Store: base}
				start := time.Now()
				l, err := runlease.Acquire(t.Context(), storeWithClock{f, base}, "r1", "A", runlease.WithTTL(ttl))
				require.NoError(t, err)
				k, err := runlease.Keep(t.Context(), l, c.opts...)
				require.NoError(t, err)
				defer k.Stop()
				require.Equal(t, start.Add(ttl-c.margin), k.TrustedUntil())

				// With every renewal failing, the keeper gives up by then.
				f.FailWrites(testkit.Prefix(runlease.LeasePrefix))
				time.Sleep(ttl - c.margin)
				require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
			})
		})
	}
}

// storeWithClock is a Faulty store that serves the clock of the store it
// wraps (Faulty alone hides it).
type storeWithClock struct {
	*testkit.Faulty
	c runlease.Clock
}

func (s storeWithClock) ClockNow() (time.Time, time.Duration) { return s.c.ClockNow() }
