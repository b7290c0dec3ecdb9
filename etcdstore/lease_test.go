package etcdstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
)

// Leases end to end on the cluster, with each node its own client, as
// separate machines would have.
func TestLeases(t *testing.T) {
	requireCluster(t)

	t.Run("a_lease_is_held_renewed_and_released_against_another_node", func(t *testing.T) {
		t.Parallel()
		a := newStore(t)
		b := reopen(t, a)
		ctx := t.Context()
		la, err := runlease.Acquire(ctx, a, "run", "A")
		require.NoError(t, err)
		_, err = runlease.Acquire(ctx, b, "run", "B")
		require.ErrorIs(t, err, runlease.ErrLeaseLost, "a live lease held elsewhere is refused")
		require.ErrorIs(t, err, runlease.ErrTakenOver)
		require.NoError(t, la.Renew(ctx))
		require.NoError(t, la.Release(ctx))
		lb, err := runlease.Acquire(ctx, b, "run", "B")
		require.NoError(t, err, "a released lease is free for another node")
		assert.Equal(t, la.Fence()+1, lb.Fence(), "the fence continues across a release")
		require.ErrorIs(t, la.Renew(ctx), runlease.ErrLeaseLost, "the old holder cannot renew")
		info, err := runlease.Peek(ctx, a, "run")
		require.NoError(t, err)
		assert.Equal(t, "B", info.Holder)
		assert.True(t, info.Live)
	})

	t.Run("a_waiter_on_another_node_is_woken_by_the_release_not_by_polling", func(t *testing.T) {
		t.Parallel()
		a := newStore(t)
		b := reopen(t, a)
		la, err := runlease.Acquire(t.Context(), a, "run", "A")
		require.NoError(t, err)
		// The poll interval and the TTL are far longer than the deadline:
		// only the watch can wake the waiter in time.
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		got := make(chan *runlease.Lease, 1)
		errc := make(chan error, 1)
		go func() {
			l, err := runlease.AcquireWait(ctx, b, "run", "B", runlease.WithWaitPoll(time.Hour))
			got <- l
			errc <- err
		}()
		// Give the waiter time to subscribe and be refused once; a release
		// before that only makes the test weaker, not wrong.
		time.Sleep(500 * time.Millisecond)
		require.NoError(t, la.Release(t.Context()))
		lb := <-got
		require.NoError(t, <-errc, "the waiter was not woken before its deadline")
		assert.Equal(t, la.Fence()+1, lb.Fence())
	})

	t.Run("a_renewer_keeps_many_leases_renewing_them_in_batches", func(t *testing.T) {
		t.Parallel()
		s := &countingStore{Store: newStore(t)}
		var r runlease.Renewer
		defer r.Close()
		const n = 40
		keepers := make([]*runlease.Keeper, n)
		for i := range keepers {
			l, err := runlease.Acquire(t.Context(), s, "run"+strconv.Itoa(i), "A", runlease.WithTTL(runlease.MinTTL))
			require.NoError(t, err)
			keepers[i], err = r.Keep(t.Context(), l, runlease.KeepInterval(time.Second))
			require.NoError(t, err)
		}
		// The leases were acquired one after another; due times on the
		// renewer's beats bring them together, a few calls per interval.
		require.Eventually(t, func() bool { return s.multiWrites.Load() >= 2*n }, 60*time.Second, 100*time.Millisecond,
			"the leases are renewed through MetaCASMany")
		assert.Greater(t, s.largest.Load(), int64(1), "renewals travel together in one Txn")
		other := reopen(t, s.Store)
		for i, k := range keepers {
			require.NoError(t, k.Err())
			info, err := runlease.Peek(t.Context(), other, "run"+strconv.Itoa(i))
			require.NoError(t, err)
			assert.Equal(t, "A", info.Holder)
			assert.Equal(t, k.Lease().Fence(), info.Fence, "renewals keep the fence")
		}
		for _, k := range keepers {
			require.NoError(t, k.Release(t.Context()))
		}
	})
}

// countingStore counts the MetaCASMany calls a store serves.
type countingStore struct {
	*etcdstore.Store
	multiWrites atomic.Int64
	largest     atomic.Int64 // the most writes one call carried
}

func (c *countingStore) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	c.multiWrites.Add(int64(len(writes)))
	for n := int64(len(writes)); ; {
		old := c.largest.Load()
		if n <= old || c.largest.CompareAndSwap(old, n) {
			break
		}
	}
	return c.Store.MetaCASMany(ctx, writes)
}
