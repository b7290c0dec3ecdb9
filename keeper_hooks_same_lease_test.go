package runlease_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

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
