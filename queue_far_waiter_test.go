package runlease_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestAWaiterFarBehindTheHeadLooksOnceTheOnesAheadLeave: a waiter behind
// more of its own process's waiters than a release lets in stops polling
// (a process of 100,000 waiters would otherwise wake each of them every
// poll); it looks again once a waiter ahead leaves the first ones. On a
// store that sends no notifications, nothing else wakes it: here every
// waiter of a scope of limit 1 must be admitted in turn, each releasing at
// once, though all but the first two are far behind when they queue.
func TestAWaiterFarBehindTheHeadLooksOnceTheOnesAheadLeave(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		raw := bubbleStore(t)
		// The store without its notifications: waiters learn only by
		// polling, or from the room when one ahead of them leaves.
		s := struct {
			runlease.Store
			runlease.Batcher
			runlease.RangeReader
		}{raw, raw, raw}
		ctx := t.Context()
		scope := runlease.NamedScope("gpu", 1)
		holder, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{scope})
		require.NoError(t, err)

		const n = 6
		var admitted atomic.Int32
		errs := make(chan error, n)
		for i := range n {
			go func() {
				sl, err := runlease.ClaimSlotsWait(ctx, s, fmt.Sprintf("w%d", i), []runlease.Scope{scope},
					runlease.WithWaitPoll(runlease.MinWaitPoll))
				if err == nil {
					admitted.Add(1)
					err = sl.Release(ctx)
				}
				errs <- err
			}()
			synctest.Wait() // queued, in this order
		}
		time.Sleep(time.Second) // every waiter has polled: the far ones poll no more
		synctest.Wait()
		require.Zero(t, admitted.Load())

		require.NoError(t, holder.Release(ctx))
		time.Sleep(10 * time.Second) // far less than a renewal of their entries (the TTL is 10 minutes)
		synctest.Wait()
		require.Equal(t, int32(n), admitted.Load(), "every waiter was admitted in turn")
		for range n {
			require.NoError(t, <-errs)
		}
	})
}
