package runlease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestRenewerBatchHookHangs holds rule 2 of CONCURRENCY.md for the hooks of
// a batched renewal: a keeper's hook may call its own lease (README,
// Observability), and when that call hangs on the store, it delays only
// that lease. The other members of the batch go on renewing and keep their
// trust.
func TestRenewerBatchHookHangs(t *testing.T) {
	t.Parallel()

	t.Run("a_hung_Renew_in_one_members_Renewed_hook_leaves_the_others_renewing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			raw := bubbleStore(t)
			ctx := t.Context()
			// Calls of a's key alone hang, ignoring their context, until
			// deaf is closed; batched renewals go through.
			s := &memberHangStore{Store: raw, key: runlease.LeasePrefix + "a", deaf: make(chan struct{})}
			ttl := runlease.WithTTL(5 * time.Second)
			every := runlease.KeepInterval(time.Second)
			a, err := runlease.Acquire(ctx, s, "a", "A", ttl)
			require.NoError(t, err)
			b, err := runlease.Acquire(ctx, s, "b", "B", ttl)
			require.NoError(t, err)

			var r runlease.Renewer
			var once atomic.Bool
			// a's driver renews once more from its hook, as a driver may;
			// that write of a hangs.
			hooks := runlease.Hooks{Renewed: func(ev runlease.RenewEvent) {
				if ev.Err == nil && once.CompareAndSwap(false, true) {
					s.armed.Store(true)
					_ = a.Renew(context.Background())
				}
			}}
			ka, err := r.Keep(ctx, a, every, runlease.WithHooks(hooks))
			require.NoError(t, err)
			kb, err := r.Keep(ctx, b, every)
			require.NoError(t, err)
			defer r.Close()
			defer ka.Stop()
			defer kb.Stop()
			defer close(s.deaf) // before the keepers stop and the Renewer closes

			trusted := kb.TrustedUntil()
			time.Sleep(10 * time.Second)
			synctest.Wait()
			require.Equal(t, int32(1), s.hung.Load(), "a's Renew from its hook still hangs")
			require.NoError(t, kb.Err(), "b's keeper renews on, whatever a's hook waits for")
			assert.True(t, kb.TrustedUntil().After(trusted.Add(5*time.Second)), "b's trust window moved on")
			info, err := runlease.Peek(ctx, raw, "b")
			require.NoError(t, err)
			assert.True(t, info.Until.After(time.Now().Add(3*time.Second)), "b's row is renewed")
		})
	})
}
