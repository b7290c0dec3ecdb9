package runlease_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// slowSlotWrites is a slowReplies whose batches reply late too. It reports
// on landed the send of every write of slot rows that landed, once its
// reply has come back, and can make the writes of slot rows fail (landing
// nothing) while those of the lease go on landing.
type slowSlotWrites struct {
	*slowReplies
	landed chan time.Time
	fail   atomic.Bool
}

var errSlotWritesFail = errors.New("slot writes fail")

func newSlowSlotWrites(t *testing.T, delay time.Duration) *slowSlotWrites {
	return &slowSlotWrites{slowReplies: &slowReplies{SQLiteStore: bubbleStore(t), delay: delay},
		landed: make(chan time.Time, 16)}
}

func (s *slowSlotWrites) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return s.slotWrite(isSlotKey(key), "MetaCAS", func() (bool, error) {
		return s.slowReplies.MetaCAS(ctx, key, expected, value)
	})
}

func (s *slowSlotWrites) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	slot := slices.ContainsFunc(ops, func(op runlease.Op) bool { return isSlotKey(op.Key) })
	return s.slotWrite(slot, "MetaBatch", func() (bool, error) {
		return s.write(ctx, "MetaBatch", func() (bool, error) { return s.SQLiteStore.MetaBatch(ctx, conds, ops) })
	})
}

// slotWrite runs do, a write that reaches slot rows when slot is true.
func (s *slowSlotWrites) slotWrite(slot bool, op string, do func() (bool, error)) (bool, error) {
	if !slot {
		return do()
	}
	if s.fail.Load() {
		return false, &runlease.StorageError{Op: op, Err: errSlotWritesFail, Retryable: true}
	}
	sent := time.Now()
	landed, err := do()
	if landed && err == nil {
		s.landed <- sent
	}
	return landed, err
}

func isSlotKey(key string) bool { return strings.HasPrefix(key, runlease.SlotPrefix) }

// TestSlotTrustStartsWhenTheLastWriteWasSent proves for slots what
// TestKeeperTrustStartsWhenTheLastWriteWasSent proves for a lease: a slot's
// trust window is "last renewal that landed + TTL − TTL/10" (README,
// Slots) counted from the send of the claim or renewal, because its row is
// stamped from a reading taken as the write is sent; a reply that comes
// back late must not move the start later. The clock that judges expiry
// stands still or lags, so that the second bound (the row's until_ms less
// the margin, by that clock) lies later and cannot hide a window counted
// from the reply.
//
// Each case claims through one of the paths a claim takes, checks
// Slots.TrustedUntil after the claim and after the keeper's first renewal
// of the slots, then makes every write of slot rows fail while the lease
// goes on renewing: the first slot renewed is given up exactly at its
// renewal's send + TTL − margin, reported to SlotsLost by a KeepSlots
// keeper, and ending a KeepSlotsStrict keeper, whose TrustedUntil is the
// slots' until then.
func TestSlotTrustStartsWhenTheLastWriteWasSent(t *testing.T) {
	t.Parallel()
	const delay = time.Second // each reply's lateness
	const trust = runlease.MinTTL - runlease.MinTTL/10
	claims := []struct {
		name  string
		claim func(ctx context.Context, s runlease.Store, l *runlease.Lease, opts []runlease.Option) (*runlease.Slots, error)
	}{
		{"a_claim_of_one_scope", func(ctx context.Context, s runlease.Store, l *runlease.Lease, opts []runlease.Option) (*runlease.Slots, error) {
			return runlease.ClaimSlots(ctx, s, l.RunID(), []runlease.Scope{runlease.MemScope(2)}, opts...)
		}},
		{"a_batched_claim_of_two_scopes", func(ctx context.Context, s runlease.Store, l *runlease.Lease, opts []runlease.Option) (*runlease.Slots, error) {
			return runlease.ClaimSlots(ctx, s, l.RunID(), []runlease.Scope{runlease.MemScope(2), runlease.PrincipalScope("p", 2)}, opts...)
		}},
		{"a_claim_fenced_by_the_lease", func(ctx context.Context, _ runlease.Store, l *runlease.Lease, _ []runlease.Option) (*runlease.Slots, error) {
			return l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(2)})
		}},
		{"a_claim_admitted_from_the_queue", func(ctx context.Context, _ runlease.Store, l *runlease.Lease, _ []runlease.Option) (*runlease.Slots, error) {
			return l.ClaimSlotsWait(ctx, []runlease.Scope{runlease.MemScope(2)})
		}},
	}
	keeps := []struct {
		name   string
		keep   func(*runlease.Slots) runlease.Option
		strict bool
	}{
		{"kept", runlease.KeepSlots, false},
		{"kept_strictly", runlease.KeepSlotsStrict, true},
	}
	clocks := []struct {
		name  string
		clock func(start time.Time) func() time.Time
	}{
		{"with_an_expiry_clock_that_stands_still", stillClock},
		{"with_an_expiry_clock_that_lags", laggingClock},
	}
	for _, c := range claims {
		for _, kp := range keeps {
			for _, clk := range clocks {
				t.Run(c.name+"/"+kp.name+"/"+clk.name, func(t *testing.T) {
					t.Parallel()
					synctest.Test(t, func(t *testing.T) {
						ctx := t.Context()
						s := newSlowSlotWrites(t, delay)
						opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.clock(time.Now()))}
						l, err := runlease.Acquire(ctx, s, "r1", "A", opts...)
						require.NoError(t, err)

						slots, err := c.claim(ctx, s, l, opts)
						require.NoError(t, err)
						sent := <-s.landed
						require.Equal(t, sent.Add(delay), time.Now(), "the claim's reply came late")
						units := len(slots.Held())
						require.NotZero(t, units)
						assert.Equal(t, sent.Add(trust), slots.TrustedUntil(), "trusted from the claim's send")

						lost := make(chan runlease.SlotLossEvent, 1)
						r := &runlease.Renewer{}
						defer r.Close()
						k, err := r.Keep(ctx, l, kp.keep(slots),
							runlease.WithHooks(runlease.Hooks{SlotsLost: func(e runlease.SlotLossEvent) { lost <- e }}))
						require.NoError(t, err)

						// The keeper's first renewal of the slots, right after
						// the lease's, one slot after another: once it has
						// recorded its outcome, the first window to end is
						// that of the first slot, counted from its send.
						sent = <-s.landed
						last := sent
						for range units - 1 {
							last = <-s.landed
						}
						synctest.Wait()
						require.Equal(t, last.Add(delay), time.Now(), "the renewal's replies came late")
						assert.Equal(t, sent.Add(trust), slots.TrustedUntil(), "trusted from the renewal's send")

						// No write of the slots lands any more; the lease's
						// do, so the first slot's own window is the one that
						// ends.
						s.fail.Store(true)
						time.Sleep(time.Until(sent.Add(trust)) - time.Millisecond)
						require.Len(t, slots.Held(), units, "trusted until a millisecond before the end")
						assert.Equal(t, sent.Add(trust), slots.TrustedUntil())
						if kp.strict {
							assert.Equal(t, sent.Add(trust), k.TrustedUntil(), "a strict keeper trusts no longer than its slots")
						}
						require.NoError(t, k.Err())
						time.Sleep(time.Millisecond)
						synctest.Wait()

						if kp.strict {
							select {
							case <-k.Done():
							default:
								t.Fatalf("the strict keeper still trusts its slots at the renewal's send + TTL - margin")
							}
							require.ErrorIs(t, k.Err(), runlease.ErrSlotLost)
							require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
							require.ErrorIs(t, context.Cause(k.Context()), runlease.ErrTrustExpired)
						} else {
							select {
							case e := <-lost:
								require.ErrorIs(t, e.Err, runlease.ErrTrustExpired)
							default:
								t.Fatalf("no slot loss reported at the renewal's send + TTL - margin")
							}
							require.NoError(t, k.Err(), "the lease, still renewed, is the authority")
						}
						assert.Len(t, slots.Held(), units-1, "the first slot is not trusted at its renewal's send + TTL - margin")
					})
				})
			}
		}
	}
}

// keptRun acquires run with a 5 s lease, claims one slot of a scope of
// limit 1 with the same TTL, and keeps both with keep (KeepSlots or
// KeepSlotsStrict).
func keptRun(t *testing.T, s runlease.Store, run string, ev *events, keep func(*runlease.Slots) runlease.Option) (*runlease.Keeper, *runlease.Slots) {
	t.Helper()
	five := runlease.WithTTL(5 * time.Second)
	l, err := runlease.Acquire(t.Context(), s, run, "A", five)
	require.NoError(t, err)
	sl, err := runlease.ClaimSlots(t.Context(), s, run, []runlease.Scope{runlease.MemScope(1)}, five)
	require.NoError(t, err)
	k, err := runlease.Keep(t.Context(), l, keep(sl), runlease.WithHooks(ev.hooks()))
	require.NoError(t, err)
	return k, sl
}

func TestKeptSlots(t *testing.T) {
	t.Parallel()

	t.Run("a_slot_that_cannot_be_renewed_is_given_up_before_its_row_expires", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			ev := &events{}
			k, sl := keptRun(t, f, "a", ev, runlease.KeepSlots)
			defer k.Stop()
			f.FailWrites(testkit.Prefix(runlease.SlotPrefix)) // lease writes go on, slot writes fail

			// Step through time; at every step, at most one run believes it
			// holds the only slot.
			var b *runlease.Slots
			for range 100 {
				time.Sleep(100 * time.Millisecond)
				if b == nil {
					b, _ = runlease.ClaimSlots(t.Context(), f.Store, "b", []runlease.Scope{runlease.MemScope(1)},
						runlease.WithTTL(5*time.Second))
				}
				if b != nil {
					require.Empty(t, sl.Held(), "run a still lists a slot run b holds")
				}
			}
			require.NotNil(t, b, "the slot freed once its row expired")
			require.NoError(t, k.Err(), "not strict: the lease is the authority")
			ev.mu.Lock()
			defer ev.mu.Unlock()
			require.Len(t, ev.slots, 1, "the loss is reported once")
			require.ErrorIs(t, ev.slots[0].Err, runlease.ErrTrustExpired)
		})
	})

	t.Run("a_strictly_kept_slot_ends_the_keeper_while_its_row_is_still_live", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			k, sl := keptRun(t, f, "a", &events{}, runlease.KeepSlotsStrict)
			held := sl.Held()
			require.Len(t, held, 1)
			work := k.Context()
			f.FailWrites(testkit.Prefix(runlease.SlotPrefix))
			<-work.Done()
			require.ErrorIs(t, context.Cause(work), runlease.ErrSlotLost)
			require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
			require.Less(t, time.Now().UnixMilli(), slotUntilMS(t, f, held[0].Key),
				"the run stopped before any other run could take the slot")
		})
	})

	t.Run("slot_faults_are_retried_within_the_trust_window", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			ev := &events{}
			k, sl := keptRun(t, f, "a", ev, runlease.KeepSlotsStrict)
			defer k.Stop()
			time.Sleep(time.Second)
			f.FailWrites(testkit.Prefix(runlease.SlotPrefix))
			time.Sleep(2 * time.Second) // the slot renewal due meanwhile fails, and is retried
			f.FailWrites(nil)
			time.Sleep(30 * time.Second)
			require.NoError(t, k.Err())
			require.Len(t, sl.Held(), 1)
			assert.Empty(t, ev.slots)
		})
	})
}

// slotUntilMS returns the stored expiry of the slot row at key.
func slotUntilMS(t *testing.T, s runlease.Store, key string) int64 {
	t.Helper()
	occ, err := runlease.Occupancy(t.Context(), s)
	require.NoError(t, err)
	for _, o := range occ {
		if o.Key == key {
			return o.Until.UnixMilli()
		}
	}
	t.Fatalf("no live slot at %q", key)
	return 0
}

func TestSlotsTrustedUntil(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	mem := []runlease.Scope{runlease.MemScope(1)}
	margin := 500 * time.Millisecond // a tenth of the TTL; the SQLite clock has no uncertainty

	t.Run("is_the_claims_trust_window_and_moves_on_with_each_renewal", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			sl, err := runlease.ClaimSlots(t.Context(), s, "a", mem, five)
			require.NoError(t, err)
			assert.Equal(t, time.Now().Add(5*time.Second-margin), sl.TrustedUntil())
			time.Sleep(2 * time.Second)
			require.NoError(t, sl.Renew(t.Context()))
			assert.Equal(t, time.Now().Add(5*time.Second-margin), sl.TrustedUntil())
			require.NoError(t, sl.Release(t.Context()))
			assert.Equal(t, time.Now(), sl.TrustedUntil(), "released: no trust left")
			time.Sleep(time.Second)
			require.NoError(t, sl.Renew(t.Context()))
			assert.Less(t, sl.TrustedUntil(), time.Now(), "nothing to renew after a release")
		})
	})

	t.Run("never_moves_past_a_slot_that_was_taken", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			sl, err := runlease.ClaimSlots(t.Context(), s, "a", mem, five)
			require.NoError(t, err)
			key := sl.Held()[0].Key
			row := get(t, s, key)
			// An operator frees the slot and run b takes it.
			ok, err := s.MetaDelete(t.Context(), key, row)
			require.NoError(t, err)
			require.True(t, ok)
			_, err = runlease.ClaimSlots(t.Context(), s, "b", mem, five)
			require.NoError(t, err)
			time.Sleep(time.Second)
			require.ErrorIs(t, sl.Renew(t.Context()), runlease.ErrSlotLost)
			lostAt := time.Now()
			time.Sleep(time.Second)
			assert.Equal(t, lostAt, sl.TrustedUntil(), "trust ends when the loss is seen")
			assert.Empty(t, sl.Held())
		})
	})

	t.Run("bounds_a_strict_keepers_trust_and_not_a_lenient_one", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f, g := &testkit.Faulty{Store: bubbleStore(t)}, &testkit.Faulty{Store: bubbleStore(t)}
			strict, ss := keptRun(t, f, "a", &events{}, runlease.KeepSlotsStrict)
			defer strict.Stop()
			lenient, _ := keptRun(t, g, "a", &events{}, runlease.KeepSlots)
			defer lenient.Stop()
			claimed := time.Now()
			// Lease renewals land, slot renewals fail.
			f.FailWrites(testkit.Prefix(runlease.SlotPrefix))
			g.FailWrites(testkit.Prefix(runlease.SlotPrefix))
			time.Sleep(3 * time.Second)
			assert.Equal(t, claimed.Add(5*time.Second-margin), ss.TrustedUntil(), "the claim's window, not renewed")
			assert.Equal(t, ss.TrustedUntil(), strict.TrustedUntil(), "strict: the slots' window bounds the keeper's")
			assert.Greater(t, lenient.TrustedUntil(), claimed.Add(5*time.Second), "lenient: the lease alone")
			<-strict.Done()
			assert.Equal(t, claimed.Add(5*time.Second-margin), strict.TrustedUntil(), "and it stays there once ended")
		})
	})

	// takeSlot frees the slot of sl behind its back, as an operator would,
	// and lets run b take it.
	takeSlot := func(t *testing.T, s runlease.Store, sl *runlease.Slots) {
		t.Helper()
		key := sl.Held()[0].Key
		ok, err := s.MetaDelete(t.Context(), key, get(t, s, key))
		require.NoError(t, err)
		require.True(t, ok)
		_, err = runlease.ClaimSlots(t.Context(), s, "b", mem, five)
		require.NoError(t, err)
	}

	t.Run("a_loss_the_runs_own_Renew_reports_ends_a_strict_keeper_at_once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			ev := &events{}
			k, sl := keptRun(t, s, "a", ev, runlease.KeepSlotsStrict)
			defer k.Stop()
			work := k.Context()
			takeSlot(t, s, sl)
			require.ErrorIs(t, sl.Renew(t.Context()), runlease.ErrSlotLost, "the caller of Renew hears of the loss")
			// No time passes: the keeper ends in the Renew that found the loss,
			// not at its next look.
			require.ErrorIs(t, work.Err(), context.Canceled)
			require.ErrorIs(t, k.Err(), runlease.ErrSlotLost)
			require.ErrorIs(t, k.Err(), runlease.ErrTakenOver)
			require.ErrorIs(t, context.Cause(work), runlease.ErrSlotLost)
			assert.False(t, time.Now().Before(k.TrustedUntil()))
		})
	})

	t.Run("a_strict_keeper_of_a_claim_that_lost_a_slot_before_Keep_ends_in_Keep", func(t *testing.T) {
		for _, found := range []string{"renew", "strict-keeper"} {
			t.Run(found, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					s := bubbleStore(t)
					l, err := runlease.Acquire(t.Context(), s, "a", "A", five)
					require.NoError(t, err)
					sl, err := runlease.ClaimSlots(t.Context(), s, "a", mem, five)
					require.NoError(t, err)
					takeSlot(t, s, sl)
					if found == "renew" {
						require.ErrorIs(t, sl.Renew(t.Context()), runlease.ErrSlotLost)
					} else {
						// An earlier strict keeper found the loss, took it off
						// the Slots and was stopped.
						first, err := runlease.Keep(t.Context(), l, runlease.KeepSlotsStrict(sl))
						require.NoError(t, err)
						time.Sleep(5 * time.Second)
						require.ErrorIs(t, first.Err(), runlease.ErrSlotLost)
						require.NoError(t, l.Renew(t.Context()))
					}
					k, err := runlease.Keep(t.Context(), l, runlease.KeepSlotsStrict(sl))
					require.NoError(t, err)
					require.ErrorIs(t, k.Err(), runlease.ErrSlotLost, "ended before Keep returned")
					require.ErrorIs(t, k.Context().Err(), context.Canceled)
					lenient, err := runlease.Keep(t.Context(), l, runlease.KeepSlots(sl))
					require.NoError(t, err)
					defer lenient.Stop()
					require.NoError(t, lenient.Err(), "not strict: the lease is the authority")
				})
			})
		}
	})

	t.Run("releasing_the_slots_of_a_strict_keeper_ends_it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			k, sl := keptRun(t, s, "a", &events{}, runlease.KeepSlotsStrict)
			defer k.Stop()
			require.NoError(t, sl.Release(t.Context()))
			require.ErrorIs(t, k.Err(), runlease.ErrSlotLost)
			require.ErrorIs(t, k.Err(), runlease.ErrReleased)
			require.ErrorIs(t, k.Context().Err(), context.Canceled)
		})
	})

	t.Run("Keeper_Release_stops_a_strict_keeper_before_its_slots_go", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			k, _ := keptRun(t, s, "a", &events{}, runlease.KeepSlotsStrict)
			require.NoError(t, k.Release(t.Context()))
			require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
			require.NotErrorIs(t, k.Err(), runlease.ErrSlotLost)
		})
	})
}

// slowSlotStore passes every call through, but once armed, a CAS of a
// slot row (a slot renewal) is held up until released, whatever its
// context says: a store slow to honour a cancellation (a connection
// blackholed mid-statement).
type slowSlotStore struct {
	*runlease.SQLiteStore
	mu      sync.Mutex
	armed   bool
	release chan struct{}
}

func (s *slowSlotStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	s.mu.Lock()
	armed := s.armed
	s.mu.Unlock()
	if armed && strings.HasPrefix(key, runlease.SlotPrefix) {
		<-s.release
	}
	return s.SQLiteStore.MetaCAS(ctx, key, expected, value)
}

// TestAStrictKeeperEndsWhenItsSlotsTrustEndsWhileASlotRenewalHangs: the
// README promises that a slot kept with KeepSlotsStrict that is "not renewed
// within its trust window also ends the keeper ... whose work context is
// cancelled with it, before any other run can take the slot by expiry", and
// CONCURRENCY.md that the loop wakes at the trust deadline "whatever
// renewals are in flight". While a slot renewal is in flight, dueLocked
// (renewer.go, `if k.ks != nil && k.ks.job == nil`) no longer bounds the
// keeper's next look by the slots' trust end: only the lease's schedule
// wakes it. Here the lease (renewed after the claim) keeps renewing fine,
// the slot renewal hangs: the slot's row expires, run b takes the slot, and
// run a's strict keeper's work context is still live.
func TestAStrictKeeperEndsWhenItsSlotsTrustEndsWhileASlotRenewalHangs(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := &slowSlotStore{SQLiteStore: bubbleStore(t), release: make(chan struct{})}
		five := runlease.WithTTL(5 * time.Second)
		mem := []runlease.Scope{runlease.MemScope(1)}
		l, err := runlease.Acquire(t.Context(), s, "a", "A", five)
		require.NoError(t, err)
		sl, err := runlease.ClaimSlots(t.Context(), s, "a", mem, five)
		require.NoError(t, err)
		claimed := time.Now()
		time.Sleep(time.Second)
		require.NoError(t, l.Renew(t.Context())) // the lease is a second younger than the claim
		s.mu.Lock()
		s.armed = true
		s.mu.Unlock()
		k, err := runlease.Keep(t.Context(), l, runlease.KeepSlotsStrict(sl))
		require.NoError(t, err)
		defer func() { close(s.release); k.Stop() }()
		work := k.Context()

		// The slot's row expires 5 s after the claim; run b may take it then.
		time.Sleep(claimed.Add(5*time.Second + time.Millisecond).Sub(time.Now()))
		b, err := runlease.ClaimSlots(t.Context(), s.SQLiteStore, "b", mem, five)
		require.NoError(t, err, "the slot's row has expired: run b takes it")
		require.Len(t, b.Held(), 1)
		synctest.Wait()
		require.Error(t, work.Err(),
			"run b holds the slot (since %v after the claim), yet run a's strict keeper's work context is live; k.TrustedUntil() = claim + %v",
			time.Since(claimed), k.TrustedUntil().Sub(claimed))
	})
}
