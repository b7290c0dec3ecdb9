package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/testkit"
)

// The rules of a keeper that takes slots over while it runs
// (Keeper.KeepSlots, Keeper.KeepSlotsStrict, Keeper.ClaimSlotsWait). The
// timed ones run on SQLite in a synctest bubble, where the TTLs and the
// waits pass in fake time, and on Postgres in real time (left to runs
// without -short when they sleep for several TTLs).

// onKeeperStores runs fn on SQLite inside a synctest bubble and, when the
// Postgres tests are enabled (and, for a long test, not under -short), on
// Postgres in real time.
func onKeeperStores(t *testing.T, long bool, fn func(t *testing.T, s runlease.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) { fn(t, bubbleStore(t)) })
	})
	t.Run("postgres", func(t *testing.T) {
		if long && testing.Short() {
			t.Skip("sleeps for several TTLs in real time: runs without -short")
		}
		t.Parallel()
		fn(t, openPG(t, pgtest.DSN(t), pgtest.NewTable(t, pgtest.Pool(t))))
	})
}

// keptLease acquires run for holder A with the shortest TTL, and keeps it.
func keptLease(t *testing.T, ctx context.Context, s runlease.Store, run string, opts ...runlease.Option) (*runlease.Lease, *runlease.Keeper) {
	t.Helper()
	l, err := runlease.Acquire(t.Context(), s, run, "A", append([]runlease.Option{runlease.WithTTL(runlease.MinTTL)}, opts...)...)
	require.NoError(t, err)
	k, err := runlease.Keep(ctx, l)
	require.NoError(t, err)
	return l, k
}

// waitUnder starts k.ClaimSlotsWait of scopes in the background, with a
// poll of an hour so that only the store's wake-ups admit it.
func waitUnder(ctx context.Context, k *runlease.Keeper, scopes []runlease.Scope) <-chan waitResult {
	res := make(chan waitResult, 1)
	go func() {
		sl, err := k.ClaimSlotsWait(ctx, scopes, runlease.WithWaitPoll(time.Hour))
		res <- waitResult{sl, err}
	}()
	return res
}

// slotsOf returns the live slots run holds.
func slotsOf(t *testing.T, s runlease.Store, run string) []runlease.SlotInfo {
	t.Helper()
	occ, err := runlease.Occupancy(context.Background(), s)
	require.NoError(t, err)
	var out []runlease.SlotInfo
	for _, o := range occ {
		if o.RunID == run {
			out = append(out, o)
		}
	}
	return out
}

// requireLeaseUnchanged checks that run's row is live, still holder A's at
// fence.
func requireLeaseUnchanged(t *testing.T, s runlease.Store, run string, fence uint64) {
	t.Helper()
	info, err := runlease.Peek(t.Context(), s, run)
	require.NoError(t, err)
	require.True(t, info.Live, "the lease row is live")
	require.Equal(t, "A", info.Holder)
	require.Equal(t, fence, info.Fence, "the fence is unchanged: nobody took the run over")
}

func TestKeeperKeepsTheLeaseThroughALongWaitForSlots(t *testing.T) {
	t.Parallel()
	onKeeperStores(t, true, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		ttl := runlease.MinTTL
		scopes := []runlease.Scope{runlease.MemScope(1)}
		other, err := runlease.ClaimSlots(ctx, s, "x", scopes, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		ev := &events{}
		l, k := keptLease(t, ctx, s, "r", runlease.WithHooks(ev.hooks()))
		fence := l.Fence()

		res := waitUnder(ctx, k, scopes)
		awaitWaiting(t, s, "r", res)
		time.Sleep(3 * ttl) // the wait outlasts the lease's TTL three times
		select {
		case got := <-res:
			t.Fatalf("admitted while the units were held: %v, %v", got.err, held(got.slots))
		default:
		}
		require.NoError(t, k.Err(), "the keeper kept the lease throughout the wait")
		requireLeaseUnchanged(t, s, "r", fence)
		_, err = runlease.Acquire(ctx, s, "r", "B", runlease.WithTTL(ttl))
		require.ErrorIs(t, err, runlease.ErrLeaseLost, "a contender is refused")

		require.NoError(t, other.Release(ctx))
		got := <-res
		require.NoError(t, got.err)
		require.Same(t, got.slots, k.Slots(), "the keeper keeps the slots admitted")
		admitted := got.slots.Held()
		require.Len(t, admitted, 1)

		time.Sleep(2 * ttl) // past the slots' TTL: only the keeper renews them
		require.NoError(t, k.Err())
		require.Len(t, got.slots.Held(), 1, "the slot is still held and trusted")
		require.Greater(t, slotUntilMS(t, s, admitted[0].Key), admitted[0].Until.UnixMilli(),
			"the slot row was renewed since the admission")
		_, err = runlease.ClaimSlots(ctx, s, "y", scopes, runlease.WithTTL(ttl))
		require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the slot is still the run's")
		requireLeaseUnchanged(t, s, "r", fence)
		ev.mu.Lock()
		assert.Empty(t, ev.lost, "no Lost hook ran")
		assert.Empty(t, ev.slots, "no slot was reported lost")
		ev.mu.Unlock()

		require.NoError(t, k.Release(ctx))
		assert.Empty(t, slotsOf(t, s, "r"), "Release releases the slots the keeper took")
	})
}

// TestKeeperRefusesSlotsItCannotKeep checks each refusal of a hand-over:
// the keeper does not take the slots, which stay the caller's, held and
// live, and the keeper runs on where it ran.
func TestKeeperRefusesSlotsItCannotKeep(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		claim := func(t *testing.T, run, scope string, ttl time.Duration) *runlease.Slots {
			t.Helper()
			sl, err := runlease.ClaimSlots(ctx, s, run, []runlease.Scope{runlease.NamedScope(scope, 1)}, runlease.WithTTL(ttl))
			require.NoError(t, err)
			return sl
		}
		// stillTheCallers checks that k did not take sl: the keeper's
		// Release leaves it held and live, and the caller releases it.
		stillTheCallers := func(t *testing.T, k *runlease.Keeper, sl *runlease.Slots) {
			t.Helper()
			require.Nil(t, k.Slots(), "the keeper took no slots")
			require.Len(t, sl.Held(), 1, "the caller still holds them")
			_ = k.Release(ctx)
			require.Len(t, slotsOf(t, s, sl.RunID()), 1, "the keeper's Release left them")
			require.NoError(t, sl.Release(ctx))
			require.Empty(t, slotsOf(t, s, sl.RunID()))
		}
		handOvers := []struct {
			name string
			call func(k *runlease.Keeper, sl *runlease.Slots) error
		}{
			{"KeepSlots", (*runlease.Keeper).KeepSlots},
			{"KeepSlotsStrict", (*runlease.Keeper).KeepSlotsStrict},
		}

		for _, h := range handOvers {
			t.Run(h.name+"/invalid", func(t *testing.T) {
				ttl := 2 * runlease.MinTTL
				_, k := keptLease(t, ctx, s, "inv-"+h.name, runlease.WithTTL(ttl))
				for _, bad := range []struct {
					name string
					sl   *runlease.Slots
				}{
					{"nil", nil},
					{"another_runs", claim(t, "other-"+h.name, "inv-a-"+h.name, ttl)},
					{"a_shorter_ttl", claim(t, "inv-"+h.name, "inv-b-"+h.name, runlease.MinTTL)},
				} {
					err := h.call(k, bad.sl)
					require.ErrorIs(t, err, runlease.ErrInvalidArgument, bad.name)
					require.Equal(t, runlease.CodeInvalidArgument, runlease.Code(err), bad.name)
					require.NoError(t, k.Err(), "%s: the keeper runs on", bad.name)
					require.Nil(t, k.Slots(), bad.name)
					if bad.sl != nil {
						require.Len(t, bad.sl.Held(), 1, bad.name)
						require.NoError(t, bad.sl.Release(ctx))
					}
				}
				require.NoError(t, k.Release(ctx))
			})
		}

		ends := []struct {
			name string
			want error
			end  func(t *testing.T, k *runlease.Keeper, cancel context.CancelCauseFunc)
		}{
			{"stopped", runlease.ErrKeeperStopped, func(t *testing.T, k *runlease.Keeper, _ context.CancelCauseFunc) { k.Stop() }},
			{"released", runlease.ErrKeeperStopped, func(t *testing.T, k *runlease.Keeper, _ context.CancelCauseFunc) {
				require.NoError(t, k.Release(ctx))
			}},
			{"keep-context-ended", errDriverDone, func(t *testing.T, k *runlease.Keeper, cancel context.CancelCauseFunc) {
				cancel(errDriverDone)
			}},
			{"lost", runlease.ErrTakenOver, func(t *testing.T, k *runlease.Keeper, _ context.CancelCauseFunc) {
				key := runlease.LeasePrefix + k.Lease().RunID()
				cur := get(t, s, key)
				ok, err := s.MetaCAS(ctx, key, &cur, `{"holder":"B","fence":9,"until_ms":1}`)
				require.NoError(t, err)
				require.True(t, ok)
				require.ErrorIs(t, k.Lease().Renew(ctx), runlease.ErrTakenOver) // found by a call on the lease
			}},
		}
		for _, h := range handOvers {
			for _, e := range ends {
				t.Run(h.name+"/"+e.name, func(t *testing.T) {
					run := "end-" + h.name + "-" + e.name
					keepCtx, cancel := context.WithCancelCause(ctx)
					defer cancel(nil)
					_, k := keptLease(t, keepCtx, s, run)
					e.end(t, k, cancel)
					sl := claim(t, run, "end-"+h.name+"-"+e.name, runlease.MinTTL)
					err := h.call(k, sl)
					require.ErrorIs(t, err, e.want)
					require.Equal(t, k.Err(), err, "refused with the keeper's reason")

					_, err = k.ClaimSlotsWait(ctx, []runlease.Scope{runlease.NamedScope("w-"+run, 1)})
					require.Equal(t, k.Err(), err, "an ended keeper waits for nothing")
					for _, r := range queueRows(t, s) {
						require.NotContains(t, r.Key, run, "an ended keeper's wait queued")
					}
					stillTheCallers(t, k, sl)
				})
			}
		}

		t.Run("a_keeper_keeps_one_slots", func(t *testing.T) {
			_, k := keptLease(t, ctx, s, "one")
			a := claim(t, "one", "one-a", runlease.MinTTL)
			b := claim(t, "one", "one-b", runlease.MinTTL)
			require.NoError(t, k.KeepSlots(a))
			require.NoError(t, k.KeepSlots(a), "the same slots in the same mode: nothing to do")
			err := k.KeepSlotsStrict(a)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument, "the same slots in the other mode")
			require.ErrorIs(t, k.KeepSlots(b), runlease.ErrInvalidArgument)
			require.ErrorIs(t, k.KeepSlotsStrict(b), runlease.ErrInvalidArgument)
			_, err = k.ClaimSlotsWait(ctx, []runlease.Scope{runlease.NamedScope("one-c", 1)})
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			require.Empty(t, queueRows(t, s), "a refused wait queued")
			require.NoError(t, k.Err())
			require.Same(t, a, k.Slots())
			require.NoError(t, k.Release(ctx))
			require.Len(t, slotsOf(t, s, "one"), 1, "b is still the caller's")
			require.Len(t, b.Held(), 1)
			require.NoError(t, b.Release(ctx))
		})

		t.Run("a_strict_keeper_refuses_a_broken_claim", func(t *testing.T) {
			_, k := keptLease(t, ctx, s, "broken")
			sl := claim(t, "broken", "broken", runlease.MinTTL)
			// Another run takes the slot over; the run's own renewal finds it.
			key := sl.Held()[0].Key
			cur := get(t, s, key)
			ok, err := s.MetaCAS(ctx, key, &cur, fmt.Sprintf(`{"holder":"z","fence":1,"until_ms":%d}`, time.Now().Add(time.Hour).UnixMilli()))
			require.NoError(t, err)
			require.True(t, ok)
			require.ErrorIs(t, sl.Renew(ctx), runlease.ErrSlotLost)

			err = k.KeepSlotsStrict(sl)
			require.ErrorIs(t, err, runlease.ErrSlotLost)
			require.ErrorIs(t, err, runlease.ErrTakenOver)
			require.NoError(t, k.Err(), "the keeper runs on: it took nothing")
			require.Nil(t, k.Slots())
			require.NoError(t, k.KeepSlots(sl), "kept leniently, as Keep keeps it")
			require.NoError(t, k.Err())
			require.NoError(t, k.Release(ctx))
		})
	})
}

var errDriverDone = errors.New("driver done")

// TestAKeeperThatEndsStopsItsWaitForSlots checks that a wait under a
// keeper ends when the keeper does, with its reason, and never admits the
// run: not while it waits, and not when the units free as the lease is
// lost.
func TestAKeeperThatEndsStopsItsWaitForSlots(t *testing.T) {
	t.Parallel()
	takeOver := func(t *testing.T, s runlease.Store, run string) {
		t.Helper()
		key := runlease.LeasePrefix + run
		cur := get(t, s, key)
		ok, err := s.MetaCAS(t.Context(), key, &cur,
			fmt.Sprintf(`{"holder":"B","fence":9,"until_ms":%d}`, time.Now().Add(time.Hour).UnixMilli()))
		require.NoError(t, err)
		require.True(t, ok)
	}
	cases := []struct {
		name string
		want error
		// end ends the keeper; free frees the units as it does, or nil
		// to free them once the wait returned.
		end  func(t *testing.T, s runlease.Store, k *runlease.Keeper, cancel context.CancelCauseFunc, free func())
		free bool
	}{
		{name: "taken_over", want: runlease.ErrTakenOver, end: func(t *testing.T, s runlease.Store, k *runlease.Keeper, _ context.CancelCauseFunc, _ func()) {
			takeOver(t, s, "r")
		}},
		{name: "taken_over_as_the_units_free", want: runlease.ErrLeaseLost, free: true, end: func(t *testing.T, s runlease.Store, k *runlease.Keeper, _ context.CancelCauseFunc, free func()) {
			takeOver(t, s, "r")
			free()
		}},
		{name: "stopped", want: runlease.ErrKeeperStopped, end: func(t *testing.T, s runlease.Store, k *runlease.Keeper, _ context.CancelCauseFunc, _ func()) {
			k.Stop()
		}},
		{name: "keep_context_ended", want: errDriverDone, end: func(t *testing.T, s runlease.Store, k *runlease.Keeper, cancel context.CancelCauseFunc, _ func()) {
			cancel(errDriverDone)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			onKeeperStores(t, false, func(t *testing.T, s runlease.Store) {
				ctx := t.Context()
				scopes := []runlease.Scope{runlease.MemScope(1)}
				other, err := runlease.ClaimSlots(ctx, s, "x", scopes, runlease.WithTTL(time.Hour))
				require.NoError(t, err)
				keepCtx, cancel := context.WithCancelCause(ctx)
				defer cancel(nil)
				_, k := keptLease(t, keepCtx, s, "r")
				// Bounded, so that a wait the keeper's end does not stop
				// fails the test rather than hanging it.
				waitCtx, stop := context.WithTimeoutCause(ctx, time.Minute, errors.New("the wait outlived its keeper"))
				defer stop()
				res := waitUnder(waitCtx, k, scopes)
				awaitWaiting(t, s, "r", res)

				freed := false
				c.end(t, s, k, cancel, func() { require.NoError(t, other.Release(ctx)); freed = true })
				got := <-res
				require.ErrorIs(t, got.err, c.want)
				require.Nil(t, got.slots)
				<-k.Done()
				require.Error(t, k.Err())
				require.Nil(t, k.Slots(), "the keeper took no slots")
				if !freed {
					require.NoError(t, other.Release(ctx))
				}
				require.Empty(t, slotsOf(t, s, "r"), "the run was admitted under an ended keeper")
				require.Empty(t, queueRows(t, s), "its place is gone")
			})
		})
	}

	t.Run("trust_ran_out", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			ctx := t.Context()
			scopes := []runlease.Scope{runlease.MemScope(1)}
			other, err := runlease.ClaimSlots(ctx, f, "x", scopes, runlease.WithTTL(time.Hour))
			require.NoError(t, err)
			_, k := keptLease(t, ctx, f, "r")
			waitCtx, stop := context.WithTimeoutCause(ctx, time.Minute, errors.New("the wait outlived its keeper"))
			defer stop()
			res := waitUnder(waitCtx, k, scopes)
			awaitWaiting(t, f, "r", res)
			f.FailWrites(testkit.Prefix(runlease.LeasePrefix)) // the lease cannot be renewed
			got := <-res
			require.ErrorIs(t, got.err, runlease.ErrTrustExpired)
			require.Equal(t, k.Err(), got.err)
			f.FailWrites(nil)
			require.NoError(t, other.Release(ctx))
			time.Sleep(runlease.MinTTL)
			require.Empty(t, slotsOf(t, f, "r"), "the run was admitted under a keeper whose trust ran out")
			require.Empty(t, queueRows(t, f))
		})
	})
}

// TestSlotsHandedToARunningKeeperAreRenewedInTime hands slots claimed
// most of a trust window ago to a keeper between two renewals of its
// lease: the keeper must renew them before their trust runs out, not at
// its lease's next renewal, which comes after.
func TestSlotsHandedToARunningKeeperAreRenewedInTime(t *testing.T) {
	t.Parallel()
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				s := bubbleStore(t)
				ctx := t.Context()
				ev := &events{}
				ttl := runlease.WithTTL(5 * time.Second)
				sl, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{runlease.MemScope(1)}, ttl)
				require.NoError(t, err)
				l, err := runlease.Acquire(ctx, s, "r", "A", ttl, runlease.WithHooks(ev.hooks()))
				require.NoError(t, err)
				k, err := runlease.Keep(ctx, l)
				require.NoError(t, err)
				// The lease renews at about 1.67 s and 3.33 s, next at 5 s;
				// the slot's trust ends at 4.5 s.
				time.Sleep(3900 * time.Millisecond)
				require.NotEmpty(t, sl.Held())
				if strict {
					require.NoError(t, k.KeepSlotsStrict(sl))
				} else {
					require.NoError(t, k.KeepSlots(sl))
				}
				time.Sleep(20 * time.Second)
				require.NoError(t, k.Err())
				require.Len(t, sl.Held(), 1, "the slot was renewed before its trust ran out")
				synctest.Wait()
				ev.mu.Lock()
				assert.Empty(t, ev.slots, "no slot was lost")
				ev.mu.Unlock()
				require.NoError(t, k.Release(ctx))
			})
		})
	}
}

// TestAStrictHandOverEndsTheKeeperFromTheMomentItReturns checks that a
// slot given up after KeepSlotsStrict returned ends the keeper: released
// through the Slots (before Release returns, with no look of the loop in
// between), or not renewed (before its row expires).
func TestAStrictHandOverEndsTheKeeperFromTheMomentItReturns(t *testing.T) {
	t.Parallel()
	t.Run("released", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			ctx := t.Context()
			_, k := keptLease(t, ctx, s, "r")
			sl, err := k.Lease().ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
			require.NoError(t, err)
			require.NoError(t, k.KeepSlotsStrict(sl))
			synctest.Wait() // the keeper's look at the slots is done: the loop sleeps
			done := k.Done()
			require.NoError(t, sl.Release(ctx))
			select {
			case <-done:
			default:
				t.Fatal("the keeper runs on after a strictly kept slot was released")
			}
			require.ErrorIs(t, k.Err(), runlease.ErrSlotLost)
			require.ErrorIs(t, k.Err(), runlease.ErrReleased)
		})
	})
	t.Run("not_renewed", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			ctx := t.Context()
			_, k := keptLease(t, ctx, f, "r")
			sl, err := k.Lease().ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
			require.NoError(t, err)
			key := sl.Held()[0].Key
			require.NoError(t, k.KeepSlotsStrict(sl))
			work := k.Context()
			f.FailWrites(testkit.Prefix(runlease.SlotPrefix))
			<-work.Done()
			require.ErrorIs(t, k.Err(), runlease.ErrSlotLost)
			require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
			require.Less(t, time.Now().UnixMilli(), slotUntilMS(t, f, key),
				"the keeper ended before any other run could take the slot")
		})
	})
}

// TestKeeperSlotHandOversRace hands several claims of one run to one
// keeper at once while the keeper ends: at most one is taken, the keeper
// keeps exactly that one (its Release releases it), and every other stays
// the caller's, held and live.
func TestKeeperSlotHandOversRace(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx := t.Context()
	const claims = 4
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	for round := range rounds {
		run := fmt.Sprintf("r%d", round)
		keepCtx, cancel := context.WithCancelCause(ctx)
		_, k := keptLease(t, keepCtx, s, run)
		var all []*runlease.Slots
		for i := range claims {
			sl, err := runlease.ClaimSlots(ctx, s, run, []runlease.Scope{runlease.NamedScope(fmt.Sprintf("s%d-%d", round, i), 1)},
				runlease.WithTTL(runlease.MinTTL))
			require.NoError(t, err)
			all = append(all, sl)
		}
		errs := make([]error, claims)
		var wg sync.WaitGroup
		for i, sl := range all {
			wg.Go(func() {
				if i%2 == 0 {
					errs[i] = k.KeepSlotsStrict(sl)
				} else {
					errs[i] = k.KeepSlots(sl)
				}
			})
		}
		wg.Go(func() {
			switch round % 3 {
			case 0:
				k.Stop()
			case 1:
				cancel(errDriverDone)
			case 2:
				_ = k.Err()
			}
		})
		wg.Wait()
		k.Stop()
		cancel(nil)

		var taken *runlease.Slots
		for i, err := range errs {
			switch {
			case err == nil:
				require.Nil(t, taken, "round %d: two claims taken", round)
				taken = all[i]
			case errors.Is(err, runlease.ErrInvalidArgument):
				// another claim was taken first
			default:
				require.Equal(t, k.Err(), err, "round %d: refused with the keeper's reason", round)
			}
		}
		require.Same(t, taken, k.Slots(), "round %d", round)
		require.NoError(t, k.Release(ctx))
		live := slotsOf(t, s, run)
		want := claims
		if taken != nil {
			want--
			require.Empty(t, taken.Held(), "round %d: the keeper's Release released what it took", round)
		}
		require.Len(t, live, want, "round %d: the refused claims are the callers' still", round)
		for _, sl := range all {
			if sl != taken {
				require.Len(t, sl.Held(), 1, "round %d", round)
				require.NoError(t, sl.Release(ctx))
			}
		}
		require.Empty(t, slotsOf(t, s, run))
	}
}
