package runlease_test

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestRenewerBatchesOneLeaseOfARun: a holder re-enters its run (X at fence
// 1, L at fence 2, both kept on one shared Renewer, as re-entry allows),
// and another holder's lease of r2 is kept there too. All come due at
// once. A batch holds one write per key, so X goes alone: had both gone
// into one MetaCASMany, the store would refuse the whole batch (two writes
// of one key), failing L's and r2's renewals on a healthy store and never
// telling X it is superseded.
func TestRenewerBatchesOneLeaseOfARun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		s := bubbleStore(t)
		var mu sync.Mutex
		var errs []error
		renewed := map[string]int{}
		hooks := runlease.WithHooks(runlease.Hooks{Renewed: func(ev runlease.RenewEvent) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case ev.Err == nil:
				renewed[ev.RunID+"@"+strconv.FormatUint(ev.Fence, 10)]++
			case ev.RunID == "r1" && ev.Fence == 1 && errors.Is(ev.Err, runlease.ErrTakenOver):
				// X, superseded by L: told so
			default:
				t.Logf("renewal of %s fence %d: %v", ev.RunID, ev.Fence, ev.Err)
				errs = append(errs, ev.Err)
			}
		}})
		x, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithTTL(runlease.MinTTL), hooks)
		require.NoError(t, err)
		l, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithTTL(runlease.MinTTL), hooks)
		require.NoError(t, err)
		other, err := runlease.Acquire(ctx, s, "r2", "B", runlease.WithTTL(runlease.MinTTL), hooks)
		require.NoError(t, err)
		var r runlease.Renewer
		defer r.Close()
		kx, err := r.Keep(ctx, x, runlease.KeepInterval(time.Second))
		require.NoError(t, err)
		defer kx.Stop()
		kl, err := r.Keep(ctx, l, runlease.KeepInterval(time.Second))
		require.NoError(t, err)
		defer kl.Stop()
		ko, err := r.Keep(ctx, other, runlease.KeepInterval(time.Second))
		require.NoError(t, err)
		defer ko.Stop()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, errs, "renewals on a healthy store failed")
		require.ErrorIs(t, kx.Err(), runlease.ErrTakenOver, "X is told it is superseded")
		require.NoError(t, kl.Err())
		require.NoError(t, ko.Err())
		require.Positive(t, renewed["r1@2"], "L renewed")
		require.Positive(t, renewed["r2@1"], "r2 renewed")
	})
}
