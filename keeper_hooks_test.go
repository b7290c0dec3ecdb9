package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// hookCase is a way to make a keeper call one of its hooks, and the
// goroutine the hook then runs on.
type hookCase struct {
	name string
	// slots: the keeper keeps slots beside its lease.
	slots bool
	// hooks returns the keeper's hooks, each calling fire.
	hooks func(fire func()) runlease.Hooks
	// trigger makes the hook run, on the keeper of lease l.
	trigger func(t *testing.T, s testkit.FaultyMulti, l *runlease.Lease, sl *runlease.Slots)
}

var hookCases = []hookCase{{
	// On the renewal's goroutine, before the renewal is recorded.
	name:  "Renewed",
	hooks: func(fire func()) runlease.Hooks { return runlease.Hooks{Renewed: func(runlease.RenewEvent) { fire() }} },
	trigger: func(t *testing.T, _ testkit.FaultyMulti, _ *runlease.Lease, _ *runlease.Slots) {
		time.Sleep(5 * time.Second) // the first renewal is due after 5/3 s
	},
}, {
	// On the renewal's goroutine, which found the loss while it held the
	// lease's write token.
	name:  "Lost_found_by_the_keepers_renewal",
	hooks: func(fire func()) runlease.Hooks { return runlease.Hooks{Lost: func(runlease.LossEvent) { fire() }} },
	trigger: func(t *testing.T, s testkit.FaultyMulti, _ *runlease.Lease, _ *runlease.Slots) {
		info, err := runlease.Peek(t.Context(), s, "r1")
		require.NoError(t, err)
		require.NoError(t, runlease.ForceRelease(t.Context(), s, info)) // an operator's `runlease release`
		time.Sleep(5 * time.Second)
	},
}, {
	// On the goroutine of a call on the lease, which found the loss while
	// it held the lease's write token.
	name:  "Lost_found_by_a_fenced_write",
	hooks: func(fire func()) runlease.Hooks { return runlease.Hooks{Lost: func(runlease.LossEvent) { fire() }} },
	trigger: func(t *testing.T, s testkit.FaultyMulti, l *runlease.Lease, _ *runlease.Slots) {
		cur := get(t, s, "runlease:r1")
		ok, err := s.MetaCAS(t.Context(), "runlease:r1", &cur, `{"holder":"B","fence":9,"until_ms":1}`)
		require.NoError(t, err)
		require.True(t, ok)
		require.ErrorIs(t, l.Write(t.Context(), runlease.Put("ckpt:r1", "1")), runlease.ErrTakenOver)
	},
}, {
	// On the Renewer's loop, which finds the trust window run out.
	name:  "Lost_when_the_trust_window_runs_out",
	hooks: func(fire func()) runlease.Hooks { return runlease.Hooks{Lost: func(runlease.LossEvent) { fire() }} },
	trigger: func(t *testing.T, s testkit.FaultyMulti, _ *runlease.Lease, _ *runlease.Slots) {
		s.FailWrites(testkit.Prefix(runlease.LeasePrefix))
		time.Sleep(10 * time.Second)
	},
}, {
	// On the Renewer's loop, which reports the slot the keeper's slot
	// renewal found taken.
	name:  "SlotsLost",
	slots: true,
	hooks: func(fire func()) runlease.Hooks {
		return runlease.Hooks{SlotsLost: func(runlease.SlotLossEvent) { fire() }}
	},
	trigger: func(t *testing.T, s testkit.FaultyMulti, _ *runlease.Lease, sl *runlease.Slots) {
		held := sl.Held()
		require.Len(t, held, 1)
		cur := get(t, s, held[0].Key)
		ok, err := s.MetaCAS(t.Context(), held[0].Key, &cur,
			fmt.Sprintf(`{"holder":"other","fence":0,"until_ms":%d}`, time.Now().Add(time.Hour).UnixMilli()))
		require.NoError(t, err)
		require.True(t, ok)
		time.Sleep(5 * time.Second)
	},
}}

// hookActions are what a hook may do to its own keeper and lease. Each
// waits for nothing but the store (the store answers here, or refuses at
// once), so it returns unless it waits for the hook's own goroutine or for
// a write token that goroutine holds.
var hookActions = []struct {
	name string
	do   func(k *runlease.Keeper) error
}{
	{"Stop", func(k *runlease.Keeper) error { k.Stop(); return nil }},
	{"Release", func(k *runlease.Keeper) error { return k.Release(context.Background()) }},
	{"Renew", func(k *runlease.Keeper) error { return k.Lease().Renew(context.Background()) }},
	{"Renew_then_Stop", func(k *runlease.Keeper) error {
		err := k.Lease().Renew(context.Background())
		k.Stop()
		return err
	}},
}

// TestAKeepersHookMayStopReleaseOrRenewIt: a hook of a keeper may call
// Stop, Release or Renew on that keeper and its lease, whichever goroutine
// runs it (the renewal's, the Renewer's loop, a caller's): the call returns,
// the keeper ends (Stop, Release), the lease's write token is given back,
// and every goroutine of the Renewer exits (synctest fails a test whose
// goroutines are left blocked).
func TestAKeepersHookMayStopReleaseOrRenewIt(t *testing.T) {
	t.Parallel()
	for _, hc := range hookCases {
		for _, act := range hookActions {
			for _, shared := range []bool{false, true} {
				renewer := map[bool]string{false: "own_renewer", true: "shared_renewer"}[shared]
				t.Run(hc.name+"/"+act.name+"/"+renewer, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) { hookCalls(t, hc, act.do, shared) })
				})
			}
		}
	}
}

// hookCalls runs one case of TestAKeepersHookMayStopReleaseOrRenewIt.
func hookCalls(t *testing.T, hc hookCase, do func(*runlease.Keeper) error, shared bool) {
	s := faultyBubble(t)
	five := runlease.WithTTL(5 * time.Second)
	l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
	require.NoError(t, err)
	var sl *runlease.Slots
	opts := []runlease.Option{}
	if hc.slots {
		sl, err = runlease.ClaimSlots(t.Context(), s, "r1", []runlease.Scope{runlease.MemScope(1)}, five)
		require.NoError(t, err)
		opts = append(opts, runlease.KeepSlots(sl))
	}

	var (
		mu   sync.Mutex
		k    *runlease.Keeper
		once sync.Once
	)
	done := make(chan error, 1)
	fire := func() {
		once.Do(func() {
			mu.Lock()
			kk := k
			mu.Unlock()
			done <- do(kk)
		})
	}
	opts = append(opts, runlease.WithHooks(hc.hooks(fire)))
	keep := runlease.Keep
	var r runlease.Renewer
	if shared {
		keep = r.Keep
	}
	// The hook runs only once its trigger has run, after Keep returned.
	kk, err := keep(t.Context(), l, opts...)
	require.NoError(t, err)
	mu.Lock()
	k = kk
	mu.Unlock()

	hc.trigger(t, s, l, sl)
	var acted error
	select {
	case acted = <-done:
	default:
		synctest.Wait() // the hook, and what it calls, may still run
		select {
		case acted = <-done:
		default:
			t.Fatal("the hook never ran")
		}
	}
	t.Logf("the hook's call returned %v", acted)
	s.FailWrites(nil)

	// The write token is back: a call on the lease gets the store's
	// answer, not its context's end.
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	err = l.Renew(ctx)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "the lease's write token is still held: %v", err)
	if sl != nil {
		require.False(t, errors.Is(sl.Release(ctx), context.DeadlineExceeded), "the slots' token is still held")
	}

	kk.Stop() // the test's own Stop waits for every renewal of the keeper
	require.Error(t, kk.Err())
	r.Close()
}

// TestAKeeperReleasedFromItsLostHookLeavesNoGoroutine: outside a synctest
// bubble, with real time, a keeper released from its own Lost hook (the
// natural clean-up) leaves no goroutine behind once the hook has returned.
func TestAKeeperReleasedFromItsLostHookLeavesNoGoroutine(t *testing.T) {
	s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	defer s.Close()
	before := goleak.IgnoreCurrent()
	l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(5*time.Second))
	require.NoError(t, err)
	keeper := make(chan *runlease.Keeper, 1)
	released := make(chan error, 1)
	k, err := runlease.Keep(context.Background(), l, runlease.KeepInterval(runlease.MinKeepInterval),
		runlease.WithHooks(runlease.Hooks{Lost: func(runlease.LossEvent) {
			released <- (<-keeper).Release(context.Background())
		}}))
	require.NoError(t, err)
	keeper <- k
	forceRelease(t, s) // the keeper's next renewal finds it
	require.ErrorIs(t, <-released, runlease.ErrReleased)
	<-k.Done()
	goleak.VerifyNone(t, before)
}

// TestASlowHookDoesNotDelayTheEndOfAnotherKeeper: a hook may take long (it
// may call the store): while one keeper's Lost hook runs, the Renewer still
// ends its other keepers when their trust windows run out, cancelling their
// work contexts before any contender can be granted their runs.
func TestASlowHookDoesNotDelayTheEndOfAnotherKeeper(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := faultyBubble(t)
		five := runlease.WithTTL(5 * time.Second)
		var r runlease.Renewer
		defer r.Close()
		a, err := runlease.Acquire(t.Context(), s, "a", "A", five)
		require.NoError(t, err)
		entered, resume := make(chan struct{}), make(chan struct{})
		defer close(resume)
		ka, err := r.Keep(t.Context(), a, runlease.WithHooks(runlease.Hooks{Lost: func(runlease.LossEvent) {
			close(entered)
			<-resume // a hook that waits on something slow
		}}))
		require.NoError(t, err)
		defer ka.Stop()

		time.Sleep(time.Second) // b's trust window ends a second after a's
		b, err := runlease.Acquire(t.Context(), s, "b", "B", five)
		require.NoError(t, err)
		kb, err := r.Keep(t.Context(), b)
		require.NoError(t, err)
		defer kb.Stop()
		work := kb.Context()
		s.FailWrites(testkit.Prefix(runlease.LeasePrefix)) // no renewal lands from now on

		<-entered // a's trust window ran out; its Lost hook runs, and waits
		time.Sleep(kb.TrustedUntil().Sub(time.Now()))
		synctest.Wait()
		require.Error(t, work.Err(), "b's trust window ran out while a's Lost hook ran, yet b's work context is live")
		require.ErrorIs(t, context.Cause(work), runlease.ErrTrustExpired)
	})
}

// TestARenewersCloseMayBeCalledFromAKeepersHook: Close called from a hook of
// one of the Renewer's keepers, on the Renewer's own goroutine, returns, and
// the keepers have ended.
func TestARenewersCloseMayBeCalledFromAKeepersHook(t *testing.T) {
	t.Parallel()
	for _, hc := range hookCases {
		t.Run(hc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := faultyBubble(t)
				five := runlease.WithTTL(5 * time.Second)
				l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
				require.NoError(t, err)
				var sl *runlease.Slots
				opts := []runlease.Option{}
				if hc.slots {
					sl, err = runlease.ClaimSlots(t.Context(), s, "r1", []runlease.Scope{runlease.MemScope(1)}, five)
					require.NoError(t, err)
					opts = append(opts, runlease.KeepSlots(sl))
				}
				var r runlease.Renewer
				var once sync.Once
				closed := make(chan struct{})
				opts = append(opts, runlease.WithHooks(hc.hooks(func() { once.Do(func() { r.Close(); close(closed) }) })))
				k, err := r.Keep(t.Context(), l, opts...)
				require.NoError(t, err)
				hc.trigger(t, s, l, sl)
				synctest.Wait()
				select {
				case <-closed:
				default:
					t.Fatal("the hook's Close has not returned")
				}
				require.Error(t, k.Err())
				s.FailWrites(nil)
				r.Close()
			})
		})
	}
}

// TestKeeperHooksOfOneLease holds the README's promise that a keeper's Lost
// hook may clean up after it for keepers that share a lease: a lease's
// loss is reported to all its keepers on the goroutine of the call that
// found it, which may be the renewal of another of them, and a hook that
// stops that other keeper must return.
func TestKeeperHooksOfOneLease(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name   string
		shared bool
		act    func(k *runlease.Keeper)
	}{
		{"a_Lost_hook_stops_the_other_keeper_on_its_own_Renewer", false, (*runlease.Keeper).Stop},
		{"a_Lost_hook_stops_the_other_keeper_on_a_shared_Renewer", true, (*runlease.Keeper).Stop},
		{"a_Lost_hook_releases_through_the_other_keeper", false, func(k *runlease.Keeper) { _ = k.Release(t.Context()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				raw := bubbleStore(t)
				ctx := t.Context()
				l, err := runlease.Acquire(ctx, raw, "r", "A", runlease.WithTTL(5*time.Second))
				require.NoError(t, err)
				var r runlease.Renewer
				keep := func(opts ...runlease.Option) *runlease.Keeper {
					opts = append(opts, runlease.KeepInterval(time.Second))
					if tc.shared {
						k, err := r.Keep(ctx, l, opts...)
						require.NoError(t, err)
						return k
					}
					k, err := runlease.Keep(ctx, l, opts...)
					require.NoError(t, err)
					return k
				}
				// Each keeper's Lost hook stops the other: whichever
				// renewal finds the loss, the other's hook runs on it.
				var k1, k2 atomic.Pointer[runlease.Keeper]
				var returned atomic.Int32
				hook := func(other *atomic.Pointer[runlease.Keeper]) runlease.Option {
					return runlease.WithHooks(runlease.Hooks{Lost: func(runlease.LossEvent) {
						tc.act(other.Load())
						returned.Add(1)
					}})
				}
				k1.Store(keep(hook(&k2)))
				k2.Store(keep(hook(&k1)))
				defer r.Close()

				info, err := runlease.Peek(ctx, raw, "r")
				require.NoError(t, err)
				require.NoError(t, runlease.ForceRelease(ctx, raw, info))
				time.Sleep(2 * time.Second)
				synctest.Wait()
				require.ErrorIs(t, k1.Load().Err(), runlease.ErrReleased)
				require.ErrorIs(t, k2.Load().Err(), runlease.ErrReleased)
				require.Equal(t, int32(2), returned.Load(), "both Lost hooks returned")
			})
		})
	}
}

// TestARenewersCloseFromAHookOfAnotherRenewersKeeper: keepers of one lease
// on two Renewers, each Lost hook closing the other Renewer. Whichever
// renewal finds the loss runs both hooks on its own Renewer's goroutine, so
// one hook closes the Renewer whose goroutine runs it: that Close must not
// wait for the goroutine it runs on.
func TestARenewersCloseFromAHookOfAnotherRenewersKeeper(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		raw := bubbleStore(t)
		ctx := t.Context()
		l, err := runlease.Acquire(ctx, raw, "r", "A", runlease.WithTTL(5*time.Second))
		require.NoError(t, err)
		var r1, r2 runlease.Renewer
		var returned atomic.Int32
		closing := func(other *runlease.Renewer) runlease.Option {
			return runlease.WithHooks(runlease.Hooks{Lost: func(runlease.LossEvent) {
				other.Close()
				returned.Add(1)
			}})
		}
		k1, err := r1.Keep(ctx, l, runlease.KeepInterval(time.Second), closing(&r2))
		require.NoError(t, err)
		k2, err := r2.Keep(ctx, l, runlease.KeepInterval(time.Second), closing(&r1))
		require.NoError(t, err)

		info, err := runlease.Peek(ctx, raw, "r")
		require.NoError(t, err)
		require.NoError(t, runlease.ForceRelease(ctx, raw, info))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.ErrorIs(t, k1.Err(), runlease.ErrReleased)
		require.ErrorIs(t, k2.Err(), runlease.ErrReleased)
		require.Equal(t, int32(2), returned.Load(), "both Lost hooks returned")
		r1.Close()
		r2.Close()
	})
}
