package runlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

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

func TestSlotFaultsAreNeverLosses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	mem := []runlease.Scope{runlease.MemScope(1)}

	t.Run("a_slot_renewal_whose_reply_was_lost_is_not_a_loss", func(t *testing.T) {
		t.Parallel()
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		sl, err := runlease.ClaimSlots(ctx, f, "a", mem, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(time.Second)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		err = sl.Renew(ctx)
		require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
		require.NotErrorIs(t, err, runlease.ErrSlotLost)
		clk.Advance(time.Second)
		require.NoError(t, sl.Renew(ctx), "the row that landed is the run's own")
		require.Len(t, sl.Held(), 1)
		require.NoError(t, sl.Release(ctx))
		assert.Empty(t, rows(t, f), "and Release deletes it")
	})

	t.Run("a_runs_own_expired_slot_does_not_bypass_the_limit", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		ttl := runlease.WithTTL(5 * time.Second)
		// A host with limit 2: run a's slot 0 expires, run b's slot 1 lives.
		_, err := runlease.ClaimSlots(ctx, s, "a", []runlease.Scope{runlease.MemScope(2)}, ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(4 * time.Second)
		_, err = runlease.ClaimSlots(ctx, s, "b", []runlease.Scope{runlease.MemScope(2)}, ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(2 * time.Second)
		// A host with limit 1 sees one live holder: no run may join it.
		for _, run := range []string{"c", "a"} {
			_, err = runlease.ClaimSlots(ctx, s, run, mem, ttl, runlease.WithClock(clk.Now))
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "run %s", run)
		}
	})

	t.Run("a_retryable_fault_of_a_batched_claim_is_retried", func(t *testing.T) {
		t.Parallel()
		f := &testkit.Faulty{Store: newSQLite(t)}
		retryable := &runlease.StorageError{Op: "MetaBatch", Retryable: true, Err: assert.AnError}
		for range 3 {
			f.Next(testkit.Fault{Err: retryable})
		}
		sl, err := runlease.ClaimSlots(ctx, f, "a", mem)
		require.NoError(t, err, "on a store that works a claim is won or refused")
		require.Len(t, sl.Held(), 1)
	})

	t.Run("without_batches_a_claim_refused_in_a_later_scope_puts_the_first_back", func(t *testing.T) {
		t.Parallel()
		inner := newSQLite(t)
		f := &testkit.Faulty{Store: inner}
		scopes := []runlease.Scope{runlease.MemScope(1), runlease.PrincipalScope("p", 1)}
		f.Next(testkit.Fault{Apply: true}, testkit.Fault{Apply: false, Then: func() {
			// another run takes the principal's only slot between the
			// scan and the write
			_, err := runlease.ClaimSlots(ctx, inner, "other", scopes[1:])
			require.NoError(t, err)
		}})
		_, err := runlease.ClaimSlots(ctx, testkit.PlainStore{Store: f}, "a", scopes)
		require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
		occ, err := runlease.Occupancy(ctx, inner)
		require.NoError(t, err)
		for _, o := range occ {
			assert.NotEqual(t, "a", o.RunID, "a refused claim holds no slot afterwards: %+v", o)
		}
		_, err = runlease.ClaimSlots(ctx, inner, "c", scopes[:1])
		require.NoError(t, err, "the first scope's slot is free at once, not after a TTL")
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
