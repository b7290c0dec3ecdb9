package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// Races of a running keeper taking slots over (Keeper.KeepSlots,
// Keeper.KeepSlotsStrict, Keeper.ClaimSlotsWait) with the keeper's end,
// its other calls and its renewals: whatever the order, a run's slots are
// either the keeper's (renewed, and released by its Release) or the
// caller's, never nobody's, and the run waits in no queue once the call
// returned.

var errHandOverDone = errors.New("driver gone")

// hoKept acquires run for holder A with the shortest TTL and keeps it on
// ctx with opts.
func hoKept(t *testing.T, ctx context.Context, s runlease.Store, run string, opts ...runlease.Option) *runlease.Keeper {
	t.Helper()
	l, err := runlease.Acquire(t.Context(), s, run, "A", runlease.WithTTL(runlease.MinTTL))
	require.NoError(t, err)
	k, err := runlease.Keep(ctx, l, opts...)
	require.NoError(t, err)
	return k
}

// hoLive returns the keys of the live slot rows of run.
func hoLive(t *testing.T, s runlease.Store, run string) []string {
	t.Helper()
	occ, err := runlease.Occupancy(context.Background(), s)
	require.NoError(t, err)
	var keys []string
	for _, o := range occ {
		if o.RunID == run {
			keys = append(keys, o.Key)
		}
	}
	return keys
}

// hoKeys returns the keys of the slots s holds.
func hoKeys(s *runlease.Slots) []string {
	if s == nil {
		return nil
	}
	var keys []string
	for _, h := range s.Held() {
		keys = append(keys, h.Key)
	}
	return keys
}

// hoRunQueued returns the queue rows that name run.
func hoRunQueued(t *testing.T, s runlease.Store, run string) []runlease.Row {
	t.Helper()
	var out []runlease.Row
	for _, r := range queueRows(t, s) {
		if strings.Contains(r.Key, run) || strings.Contains(r.Value, `"`+run+`"`) {
			out = append(out, r)
		}
	}
	return out
}

// admitHook is a Batcher store that runs a function once, around the first
// batch that writes slot rows (an admission of ClaimSlotsWait): before it
// is sent, or after it landed and before its reply.
type admitHook struct {
	runlease.Store
	mu     sync.Mutex
	fn     func()
	before bool
	lose   bool // the reply of the batch fn ran around is lost
}

func (h *admitHook) on(before, lose bool, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fn, h.before, h.lose = fn, before, lose
}

func (h *admitHook) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	var fn func()
	before, lose := false, false
	for _, op := range ops {
		if strings.HasPrefix(op.Key, runlease.SlotPrefix) && !op.Delete {
			h.mu.Lock()
			fn, before, lose, h.fn = h.fn, h.before, h.lose, nil
			h.mu.Unlock()
			break
		}
	}
	if fn != nil && before {
		fn()
	}
	ok, err := h.Store.(runlease.Batcher).MetaBatch(ctx, conds, ops)
	if fn != nil && !before {
		fn()
	}
	if fn != nil && lose && err == nil {
		return false, &runlease.StorageError{Op: "MetaBatch", Unknown: true, Err: errors.New("reply lost")}
	}
	return ok, err
}

// TestKeeperClaimSlotsWaitAdmittedAsItsKeeperEnds ends the keeper while
// the admission of its ClaimSlotsWait is being written (before the batch
// is sent, or after it landed, before its reply): the keeper takes nothing,
// the call returns the keeper's reason, and the slots admitted go back
// before it returns, so the run holds nothing and waits nowhere.
func TestKeeperClaimSlotsWaitAdmittedAsItsKeeperEnds(t *testing.T) {
	t.Parallel()
	type ender struct {
		name string
		// end ends k from inside the admission's write, and returns once
		// k has ended; wait returns once whatever end started is done.
		end  func(t *testing.T, k *runlease.Keeper, cancel context.CancelCauseFunc) (wait func())
		want error
	}
	enders := []ender{
		{name: "stopped", want: runlease.ErrKeeperStopped, end: func(t *testing.T, k *runlease.Keeper, _ context.CancelCauseFunc) func() {
			k.Stop()
			return func() {}
		}},
		{name: "keep_context_ended", want: errHandOverDone, end: func(t *testing.T, k *runlease.Keeper, cancel context.CancelCauseFunc) func() {
			cancel(errHandOverDone)
			<-k.Done()
			return func() {}
		}},
		{name: "released", want: runlease.ErrKeeperStopped, end: func(t *testing.T, k *runlease.Keeper, _ context.CancelCauseFunc) func() {
			// Release waits for the lease's write token, which the
			// admission holds: it goes on in the background.
			done := make(chan error, 1)
			go func() { done <- k.Release(context.Background()) }()
			<-k.Done()
			return func() { require.NoError(t, <-done) }
		}},
	}
	moments := []struct {
		name         string
		before, lose bool
	}{{"before_the_batch", true, false}, {"after_it_landed", false, false}, {"after_it_landed_reply_lost", false, true}}
	for _, e := range enders {
		for _, m := range moments {
			t.Run(e.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				h := &admitHook{Store: newSQLite(t)}
				ctx := t.Context()
				keepCtx, cancel := context.WithCancelCause(ctx)
				defer cancel(nil)
				k := hoKept(t, keepCtx, h, "r")
				wait := func() {}
				h.on(m.before, m.lose, func() { wait = e.end(t, k, cancel) })

				callCtx, stop := context.WithTimeout(ctx, time.Minute)
				defer stop()
				sl, err := k.ClaimSlotsWait(callCtx, []runlease.Scope{runlease.MemScope(2)}, runlease.WithWaitPoll(runlease.MinWaitPoll))
				wait()
				if err == nil {
					// Taken before the end: the keeper's Release must
					// give it back; no end here releases it.
					require.Same(t, sl, k.Slots())
					t.Fatalf("admitted while its keeper ended, and handed over: %v", hoKeys(sl))
				}
				require.ErrorIs(t, err, e.want)
				require.Nil(t, sl)
				require.Error(t, k.Err())
				require.Nil(t, k.Slots(), "the keeper took no slots")
				require.Empty(t, hoLive(t, h, "r"), "the slots admitted as the keeper ended were left behind")
				require.Empty(t, hoRunQueued(t, h, "r"), "the run still waits")
			})
		}
	}
}

// TestKeeperClaimSlotsWaitTwiceAtOnce waits for slots twice at once under
// one keeper, in a scope with room for both: the keeper keeps one claim,
// the other call fails, and whatever it was admitted to goes back, so the
// run holds only what the keeper keeps and its Release frees everything.
func TestKeeperClaimSlotsWaitTwiceAtOnce(t *testing.T) {
	t.Parallel()
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			keeperClaimSlotsWaitTwiceAtOnce(t, st.open(t))
		})
	}
}

func keeperClaimSlotsWaitTwiceAtOnce(t *testing.T, s runlease.Store) {
	ctx := t.Context()
	for round := range 5 {
		run := fmt.Sprintf("r%d", round)
		k := hoKept(t, ctx, s, run)
		scope := runlease.NamedScope(fmt.Sprintf("g%d", round), 4)
		type res struct {
			sl  *runlease.Slots
			err error
		}
		out := make(chan res, 2)
		for range 2 {
			go func() {
				sl, err := k.ClaimSlotsWait(ctx, []runlease.Scope{scope}, runlease.WithWaitPoll(runlease.MinWaitPoll))
				out <- res{sl, err}
			}()
		}
		var kept *runlease.Slots
		for range 2 {
			r := <-out
			if r.err != nil {
				require.Nil(t, r.sl)
				if !errors.Is(r.err, runlease.ErrInvalidArgument) {
					require.ErrorIs(t, r.err, runlease.ErrAlreadyQueued, "round %d", round)
				}
				continue
			}
			require.Nil(t, kept, "round %d: both calls returned slots", round)
			kept = r.sl
		}
		require.NotNil(t, kept, "round %d: neither call was admitted", round)
		require.Same(t, kept, k.Slots(), "round %d", round)
		require.ElementsMatch(t, hoKeys(kept), hoLive(t, s, run), "round %d: the run holds only what its keeper keeps", round)
		require.Empty(t, hoRunQueued(t, s, run), "round %d", round)

		// A third call fails at once, queueing nowhere.
		sl, err := k.ClaimSlotsWait(ctx, []runlease.Scope{scope})
		require.ErrorIs(t, err, runlease.ErrInvalidArgument)
		require.Nil(t, sl)
		require.Empty(t, queueRows(t, s))
		require.ElementsMatch(t, hoKeys(kept), hoLive(t, s, run))

		require.NoError(t, k.Release(ctx))
		require.Empty(t, hoLive(t, s, run), "round %d: Release freed the kept slots", round)
	}
}

// TestKeeperClaimSlotsWaitAfterItsKeeperEnded calls ClaimSlotsWait on a
// keeper that has ended: it fails at once with the keeper's Err and writes
// nothing (the run is queued nowhere); KeepSlots and KeepSlotsStrict fail
// with it too, taking nothing, so that the keeper's Release leaves the
// slots to the caller.
func TestKeeperClaimSlotsWaitAfterItsKeeperEnded(t *testing.T) {
	t.Parallel()
	ends := map[string]func(k *runlease.Keeper, cancel context.CancelCauseFunc){
		"released": func(k *runlease.Keeper, _ context.CancelCauseFunc) { _ = k.Release(context.Background()) },
		"stopped":  func(k *runlease.Keeper, _ context.CancelCauseFunc) { k.Stop() },
		// Keep's context ended, and its watch may not have ended the
		// keeper yet.
		"keep_context_ended": func(_ *runlease.Keeper, cancel context.CancelCauseFunc) { cancel(errHandOverDone) },
	}
	for name, end := range ends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSQLite(t)
			ctx := t.Context()
			keepCtx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			k := hoKept(t, keepCtx, s, "r")
			claimed, err := k.Lease().ClaimSlots(ctx, []runlease.Scope{runlease.NamedScope("one", 1)})
			require.NoError(t, err)
			end(k, cancel)
			before := rows(t, s)
			sl, err := k.ClaimSlotsWait(ctx, []runlease.Scope{runlease.MemScope(1)})
			require.Nil(t, sl)
			require.Error(t, err)
			require.Equal(t, k.Err(), err)
			require.ErrorIs(t, err, runlease.ErrKeeperStopped)
			require.Equal(t, before, rows(t, s), "a call on an ended keeper wrote")
			// Nor does it take slots handed over: they stay the caller's.
			require.Equal(t, k.Err(), k.KeepSlots(claimed))
			require.Equal(t, k.Err(), k.KeepSlotsStrict(claimed))
			require.Nil(t, k.Slots())
			require.NoError(t, k.Release(ctx))
			require.Len(t, claimed.Held(), 1, "the keeper's Release released slots it refused")
			require.Len(t, hoLive(t, s, "r"), 1)
		})
	}
}

// TestKeeperReleaseRacesAHandOver releases a keeper while slots are handed
// to it (KeepSlots, KeepSlotsStrict, or admitted by its ClaimSlotsWait):
// slots the keeper took are released by its Release, slots it refused are
// still the caller's (held and live) or, admitted by ClaimSlotsWait, gone;
// no slot is left that nobody holds.
func TestKeeperReleaseRacesAHandOver(t *testing.T) {
	t.Parallel()
	for _, st := range slotStores {
		for _, how := range []string{"KeepSlots", "KeepSlotsStrict", "ClaimSlotsWait"} {
			t.Run(st.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				s := st.open(t)
				ctx := t.Context()
				rounds := 30
				if testing.Short() {
					rounds = 8
				}
				for round := range rounds {
					run := fmt.Sprintf("r%d", round)
					k := hoKept(t, ctx, s, run)
					scopes := []runlease.Scope{runlease.NamedScope(fmt.Sprintf("h%d", round), 1)}
					var claimed *runlease.Slots
					if how != "ClaimSlotsWait" {
						var err error
						claimed, err = k.Lease().ClaimSlots(ctx, scopes)
						require.NoError(t, err)
					}
					delay := time.Duration(rand.IntN(3000)) * time.Microsecond
					var wg sync.WaitGroup
					var relErr error
					wg.Go(func() {
						time.Sleep(delay)
						relErr = k.Release(ctx)
					})
					var got *runlease.Slots
					var err error
					switch how {
					case "KeepSlots":
						err = k.KeepSlots(claimed)
						got = claimed
					case "KeepSlotsStrict":
						err = k.KeepSlotsStrict(claimed)
						got = claimed
					default:
						got, err = k.ClaimSlotsWait(ctx, scopes, runlease.WithWaitPoll(runlease.MinWaitPoll))
					}
					wg.Wait()
					require.NoError(t, relErr, "round %d", round)
					require.Empty(t, hoRunQueued(t, s, run), "round %d", round)
					switch {
					case err == nil:
						require.Empty(t, got.Held(), "round %d: the keeper's Release released the slots it took", round)
						require.Empty(t, hoLive(t, s, run), "round %d: slots taken by a released keeper were left live", round)
					case how == "ClaimSlotsWait":
						require.Nil(t, got)
						require.Empty(t, hoLive(t, s, run), "round %d: slots admitted as the keeper was released were left live: %v", round, err)
					default:
						require.ErrorIs(t, err, runlease.ErrKeeperStopped, "round %d", round)
						require.ElementsMatch(t, hoKeys(claimed), hoLive(t, s, run), "round %d: refused slots are the caller's", round)
						require.NoError(t, claimed.Release(ctx))
					}
				}
			})
		}
	}
}

// TestKeeperHandOverUnderLoad hands slots to a keeper renewing as often as
// it may, while its hooks and other goroutines call every method of the
// keeper that reads its slots, and ends it in each way: for the race
// detector, and to check that the keeper's Slots is what it took and that
// its Release frees it.
func TestKeeperHandOverUnderLoad(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx := t.Context()
	rounds := 6
	if testing.Short() {
		rounds = 3
	}
	for round := range rounds {
		run := fmt.Sprintf("r%d", round)
		keepCtx, cancel := context.WithCancelCause(ctx)
		var kp atomic.Pointer[runlease.Keeper]
		var hooked atomic.Int64
		touch := func() {
			if k := kp.Load(); k != nil {
				_ = k.Slots()
				_ = k.TrustedUntil()
				_ = k.Err()
				hooked.Add(1)
			}
		}
		hooks := runlease.Hooks{
			Renewed:   func(runlease.RenewEvent) { touch() },
			Lost:      func(runlease.LossEvent) { touch() },
			SlotsLost: func(runlease.SlotLossEvent) { touch() },
		}
		k := hoKept(t, keepCtx, s, run, runlease.KeepInterval(runlease.MinKeepInterval), runlease.WithHooks(hooks))
		kp.Store(k)
		sl, err := k.Lease().ClaimSlots(ctx, []runlease.Scope{runlease.NamedScope(fmt.Sprintf("u%d", round), 1), runlease.MemScope(100)})
		require.NoError(t, err)

		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					touch()
					_ = k.Context()
					_ = k.Done()
					if got := k.Slots(); got != nil && got != sl {
						t.Errorf("round %d: Slots is a claim never handed over", round)
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		strict := round%2 == 1
		if strict {
			err = k.KeepSlotsStrict(sl)
		} else {
			err = k.KeepSlots(sl)
		}
		require.NoError(t, err, "round %d", round)
		require.Same(t, sl, k.Slots())
		// Renewals of both, with the readers going.
		time.Sleep(350 * time.Millisecond)
		require.NoError(t, k.Err(), "round %d", round)
		if strict {
			require.False(t, k.TrustedUntil().After(sl.TrustedUntil()), "round %d: a strict keeper trusts past its slots", round)
		}
		switch round % 3 {
		case 0:
			require.NoError(t, k.Release(ctx))
		case 1:
			cancel(errHandOverDone)
			<-k.Done()
			require.NoError(t, k.Release(ctx))
		case 2:
			var rwg sync.WaitGroup
			rwg.Go(func() { k.Stop() })
			rwg.Go(func() { assert.NoError(t, k.Release(ctx)) })
			rwg.Wait()
		}
		close(stop)
		wg.Wait()
		cancel(nil)
		require.Empty(t, sl.Held(), "round %d", round)
		require.Empty(t, hoLive(t, s, run), "round %d: the keeper's Release left slots it kept", round)
		require.Positive(t, hooked.Load())
	}
}

// TestAKeeperWaitingForSlotsReportsItsLossOnce takes the lease over while
// the keeper waits for slots under it: the wait ends with the loss, the
// Lost hook runs once, no SlotsLost is reported, and the run is admitted
// nowhere.
func TestAKeeperWaitingForSlotsReportsItsLossOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := bubbleStore(t)
		ctx := t.Context()
		ev := &events{}
		scopes := []runlease.Scope{runlease.MemScope(1)}
		other, err := runlease.ClaimSlots(ctx, s, "x", scopes, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		k := hoKept(t, ctx, s, "r", runlease.WithHooks(ev.hooks()))
		res := make(chan waitResult, 1)
		go func() {
			sl, err := k.ClaimSlotsWait(ctx, scopes, runlease.WithWaitPoll(time.Hour))
			res <- waitResult{sl, err}
		}()
		awaitWaiting(t, s, "r", res)
		time.Sleep(3 * time.Second) // a renewal or two while it waits
		synctest.Wait()
		require.NoError(t, k.Err())

		key := runlease.LeasePrefix + "r"
		cur := get(t, s, key)
		ok, err := s.MetaCAS(ctx, key, &cur, fmt.Sprintf(`{"holder":"B","fence":9,"until_ms":%d}`, time.Now().Add(time.Hour).UnixMilli()))
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, other.Release(ctx)) // room: a fenced admission must fail

		got := <-res
		require.ErrorIs(t, got.err, runlease.ErrLeaseLost)
		require.Nil(t, got.slots)
		<-k.Done()
		require.ErrorIs(t, k.Err(), runlease.ErrTakenOver)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.Empty(t, hoLive(t, s, "r"))
		require.Empty(t, hoRunQueued(t, s, "r"))
		ev.mu.Lock()
		defer ev.mu.Unlock()
		require.Len(t, ev.lost, 1, "the loss is reported once")
		require.Empty(t, ev.slots)
	})
}

// TestAStrictHandOverNeverTrustsPastItsSlots hands slots of every age to a
// strict keeper on a store whose replies are slow, and looks at every
// step of fake time while the keeper runs: its TrustedUntil is never later
// than the slots', and the slot rows are live.
func TestAStrictHandOverNeverTrustsPastItsSlots(t *testing.T) {
	t.Parallel()
	for _, age := range []time.Duration{0, 900 * time.Millisecond, 2 * time.Second, 3500 * time.Millisecond, 4400 * time.Millisecond} {
		for _, delay := range []time.Duration{0, 300 * time.Millisecond} {
			t.Run(fmt.Sprintf("age=%v/delay=%v", age, delay), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					s := &slowReplies{SQLiteStore: bubbleStore(t), delay: delay}
					ctx := t.Context()
					ev := &events{}
					sl, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{runlease.MemScope(2), runlease.NamedScope("gpu", 1)}, runlease.WithTTL(runlease.MinTTL))
					require.NoError(t, err)
					time.Sleep(age)
					k := hoKept(t, ctx, s, "r", runlease.KeepInterval(2*time.Second), runlease.WithHooks(ev.hooks()))
					time.Sleep(time.Second)
					synctest.Wait()
					if err := k.KeepSlotsStrict(sl); err != nil {
						// Only a claim whose trust ran out is refused.
						require.ErrorIs(t, err, runlease.ErrSlotLost)
						require.NoError(t, k.Err())
						k.Stop()
						return
					}
					for range 300 {
						synctest.Wait()
						if k.Err() != nil {
							break
						}
						kt, st := k.TrustedUntil(), sl.TrustedUntil()
						require.False(t, kt.After(st), "the keeper trusts until %v, its slots until %v", kt, st)
						require.Len(t, hoLive(t, s, "r"), 2, "a slot row expired while its strict keeper ran")
						time.Sleep(50 * time.Millisecond)
					}
					if age+time.Second < 3*time.Second && delay == 0 {
						// Handed over with trust to spare: kept.
						require.NoError(t, k.Err())
					}
					k.Stop()
				})
			})
		}
	}
}

// TestASharedRenewerTakesSlotsOverUnderLoad hands slots, strictly or not,
// to keepers of one Renewer renewing in batches, at random moments, while
// their leases renew, and then releases, stops or closes them all: every
// slot taken is renewed (none lost) and freed by its keeper's Release.
func TestASharedRenewerTakesSlotsOverUnderLoad(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx := t.Context()
	var r runlease.Renewer
	ev := &events{}
	const n = 8
	keepers := make([]*runlease.Keeper, n)
	claims := make([]*runlease.Slots, n)
	for i := range n {
		run := fmt.Sprintf("r%d", i)
		l, err := runlease.Acquire(ctx, s, run, "A", runlease.WithTTL(runlease.MinTTL), runlease.WithHooks(ev.hooks()))
		require.NoError(t, err)
		keepers[i], err = r.Keep(ctx, l, runlease.KeepInterval(runlease.MinKeepInterval))
		require.NoError(t, err)
		claims[i], err = l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(2 * n), runlease.NamedScope(fmt.Sprintf("one%d", i), 1)})
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	for i, k := range keepers {
		wg.Go(func() {
			time.Sleep(time.Duration(rand.IntN(250)) * time.Millisecond)
			if i%2 == 0 {
				assert.NoError(t, k.KeepSlotsStrict(claims[i]))
			} else {
				assert.NoError(t, k.KeepSlots(claims[i]))
			}
			for range 20 {
				assert.Same(t, claims[i], k.Slots())
				if i%2 == 0 {
					assert.False(t, k.TrustedUntil().After(claims[i].TrustedUntil()))
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	for i, k := range keepers {
		require.NoError(t, k.Err(), "keeper %d", i)
		require.Len(t, claims[i].Held(), 2, "keeper %d", i)
	}
	var ends sync.WaitGroup
	for i, k := range keepers {
		ends.Go(func() {
			if i%3 == 0 {
				k.Stop()
			}
			assert.NoError(t, k.Release(ctx))
		})
	}
	ends.Go(r.Close)
	ends.Wait()
	for i := range n {
		require.Empty(t, hoLive(t, s, fmt.Sprintf("r%d", i)), "keeper %d left its slots", i)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	require.Empty(t, ev.slots, "a slot taken over was lost")
}

// TestAStrictlyHandedOverKeeperEndsOnceAndSaysWhy ends a keeper that
// strictly keeps slots it took over in two ways at once (its lease taken
// over, a slot released through its Slots, or a stop): it ends once, with
// one of the reasons, and its Lost hook runs exactly when its Err is a loss
// of the lease.
func TestAStrictlyHandedOverKeeperEndsOnceAndSaysWhy(t *testing.T) {
	t.Parallel()
	takeOver := func(t *testing.T, s runlease.Store) {
		key := runlease.LeasePrefix + "r"
		for { // the keeper renews meanwhile: again until the row is B's
			cur, _, err := s.MetaGet(context.Background(), key)
			if !assert.NoError(t, err) {
				return
			}
			ok, err := s.MetaCAS(context.Background(), key, &cur, fmt.Sprintf(`{"holder":"B","fence":9,"until_ms":%d}`, time.Now().Add(time.Hour).UnixMilli()))
			if !assert.NoError(t, err) || ok {
				return
			}
		}
	}
	type end func(t *testing.T, s runlease.Store, k *runlease.Keeper, sl *runlease.Slots)
	ends := map[string]end{
		"taken_over": func(t *testing.T, s runlease.Store, k *runlease.Keeper, _ *runlease.Slots) {
			takeOver(t, s)
			_ = k.Lease().Renew(context.Background()) // finds it
		},
		"slot_released": func(t *testing.T, _ runlease.Store, _ *runlease.Keeper, sl *runlease.Slots) {
			assert.NoError(t, sl.Release(context.Background()))
		},
		"stopped": func(_ *testing.T, _ runlease.Store, k *runlease.Keeper, _ *runlease.Slots) { k.Stop() },
	}
	for a, endA := range ends {
		for b, endB := range ends {
			if a >= b {
				continue
			}
			t.Run(a+"+"+b, func(t *testing.T) {
				t.Parallel()
				for round := range 10 {
					s := newSQLite(t)
					ctx := t.Context()
					ev := &events{}
					l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithHooks(ev.hooks()))
					require.NoError(t, err)
					k, err := runlease.Keep(ctx, l, runlease.KeepInterval(runlease.MinKeepInterval))
					require.NoError(t, err)
					sl, err := l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
					require.NoError(t, err)
					require.NoError(t, k.KeepSlotsStrict(sl))
					time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond)
					var wg sync.WaitGroup
					wg.Go(func() { endA(t, s, k, sl) })
					wg.Go(func() { endB(t, s, k, sl) })
					wg.Wait()
					<-k.Done()
					kerr := k.Err()
					require.Error(t, kerr)
					require.True(t, errors.Is(kerr, runlease.ErrLeaseLost) || errors.Is(kerr, runlease.ErrSlotLost) || errors.Is(kerr, runlease.ErrKeeperStopped), "round %d: %v", round, kerr)
					want := 0
					if errors.Is(kerr, runlease.ErrLeaseLost) {
						want = 1
					}
					k.Stop() // waits for the hooks of its own renewal
					// The Lost hook runs after the keeper ended, on the
					// goroutine that found the loss.
					require.Eventually(t, func() bool {
						ev.mu.Lock()
						defer ev.mu.Unlock()
						return len(ev.lost) >= want
					}, time.Minute, time.Millisecond, "round %d: Err %v", round, kerr)
					time.Sleep(20 * time.Millisecond) // a second report would come now
					ev.mu.Lock()
					require.Len(t, ev.lost, want, "round %d: Err %v, Lost hooks %v", round, kerr, ev.lost)
					ev.mu.Unlock()
					_ = k.Release(ctx)
				}
			})
		}
	}
}

// TestKeeperReleaseRacesClaimSlotsWaitOnPostgres releases a keeper while
// its ClaimSlotsWait is being admitted: whatever the order, the run must
// hold no slot once both calls returned. The keeper's end cuts the
// admission's write short, which the server may still commit after the
// wait's clean-up first looked for its rows.
func TestKeeperReleaseRacesClaimSlotsWaitOnPostgres(t *testing.T) {
	// The store's calls of each round are traced (the store is wrapped with
	// every method and optional interface of its own kept), so that a
	// failure says which calls the admission, its clean-up and the
	// Release made, in what order, and what each returned.
	h := &claimEndHooks{}
	s := &pgEndHooks{PostgresStore: pgStore(t, pgtest.Pool(t)), h: h}
	ctx := t.Context()
	for round := range 60 {
		run := fmt.Sprintf("r%d", round)
		k := hoKept(t, ctx, s, run)
		scopes := []runlease.Scope{runlease.NamedScope(fmt.Sprintf("h%d", round), 1)}
		trace := newCallTrace()
		h.set(trace.record)
		var wg sync.WaitGroup
		var rerr error
		wg.Go(func() {
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			trace.note("Release")
			rerr = k.Release(ctx)
			trace.note(fmt.Sprintf("Release returned %v", rerr))
		})
		got, err := k.ClaimSlotsWait(ctx, scopes, runlease.WithWaitPoll(runlease.MinWaitPoll))
		trace.note(fmt.Sprintf("ClaimSlotsWait returned %v", err))
		wg.Wait()
		h.set(nil)
		say := func(what string) string {
			return fmt.Sprintf("round %d: %s\nClaimSlotsWait: %v\nRelease: %v\nthe round's store calls:\n%s", round, what, err, rerr, trace)
		}
		require.NoError(t, rerr, say("the keeper's Release failed"))
		if err == nil {
			require.Empty(t, got.Held(), say("the slots kept were not released"))
		}
		require.Empty(t, liveSlotRows(t, s, run), say("slots admitted as the keeper was released were left live"))
		require.Empty(t, hoRunQueued(t, s, run), say("the run still waits"))
	}
}

// TestHandOverAtTheLeasesDueInstant hands slots to a keeper just as its
// lease falls due, on a store slow to answer: slots with less trust left
// than the lease are renewed at once, not after the lease's write.
func TestHandOverAtTheLeasesDueInstant(t *testing.T) {
	t.Parallel()
	for i := range 16 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				s := &slowReplies{SQLiteStore: bubbleStore(t), delay: 400 * time.Millisecond}
				ctx := t.Context()
				ev := &events{}
				l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithHooks(ev.hooks()))
				require.NoError(t, err)
				k, err := runlease.Keep(ctx, l, runlease.KeepInterval(2*time.Second))
				require.NoError(t, err)
				time.Sleep(time.Until(start.Add(600 * time.Millisecond)))
				sl, err := l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
				require.NoError(t, err)
				time.Sleep(time.Until(start.Add(4 * time.Second)))
				leaseFrom := k.TrustedUntil().Add(-4500 * time.Millisecond)
				due := leaseFrom.Add(2 * time.Second)
				time.Sleep(time.Until(due))
				require.NoError(t, k.KeepSlots(sl))
				time.Sleep(3 * time.Second)
				synctest.Wait()
				require.NoError(t, k.Err())
				ev.mu.Lock()
				lost := ev.slots
				ev.mu.Unlock()
				require.Empty(t, lost, "a slot handed over with trust to spare was lost while its keeper ran")
				require.Len(t, sl.Held(), 1)
				k.Stop()
			})
		})
	}
}

// TestKeeperClaimSlotsWaitForNoScopesTakesNothing: a wait for no scope
// returns an empty Slots the keeper does not take, so a later call can
// still hand it slots.
func TestKeeperClaimSlotsWaitForNoScopesTakesNothing(t *testing.T) {
	s := newSQLite(t)
	ctx := t.Context()
	k := hoKept(t, ctx, s, "r")
	empty, err := k.ClaimSlotsWait(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, empty.Held())
	require.Nil(t, k.Slots(), "the keeper took slots that hold nothing")
	got, err := k.ClaimSlotsWait(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.NoError(t, err)
	require.Same(t, got, k.Slots())
	require.NoError(t, k.Release(ctx))
}
