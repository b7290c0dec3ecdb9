package runlease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// lateReadStore makes every read of one key, once armed, wait until its
// context ends and then answer with the row as stored: a read that
// completed just as its caller gave up on it.
type lateReadStore struct {
	runlease.Store
	key     string
	armed   atomic.Bool
	waiting atomic.Int32
}

func (s *lateReadStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if key == s.key && s.armed.Load() {
		s.waiting.Add(1)
		<-ctx.Done()
		s.waiting.Add(-1)
		return s.Store.MetaGet(context.WithoutCancel(ctx), key)
	}
	return s.Store.MetaGet(ctx, key)
}

// TestKeeperReleaseReportsLoss holds Keeper.Release's promise that a lease
// released by someone else before is reported as a *LeaseLostError, when
// the keeper's own renewal in flight is what finds the release.
func TestKeeperReleaseReportsLoss(t *testing.T) {
	t.Parallel()

	t.Run("a_release_found_by_the_renewal_Stop_waits_for_is_reported", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			raw := bubbleStore(t)
			ctx := t.Context()
			s := &lateReadStore{Store: raw, key: runlease.LeasePrefix + "b"}
			l, err := runlease.Acquire(ctx, s, "b", "B", runlease.WithTTL(5*time.Second))
			require.NoError(t, err)
			k, err := runlease.Keep(ctx, l, runlease.KeepInterval(time.Second))
			require.NoError(t, err)
			info, err := runlease.Peek(ctx, raw, "b")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(ctx, raw, info))
			s.armed.Store(true)
			// The renewal's write is refused, and its read-back waits.
			for s.waiting.Load() == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			synctest.Wait()
			require.NoError(t, k.Err(), "the loss is not known yet")

			err = k.Release(ctx)
			require.ErrorIs(t, err, runlease.ErrLeaseLost, "an operator released the lease before")
			require.ErrorIs(t, err, runlease.ErrReleased)
		})
	})
}
