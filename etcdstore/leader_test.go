package etcdstore_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestLeaderKill kills the cluster's leader while a Renewer keeps leases and
// another node tries to take each of them over, then restarts it: never two
// holders; keepers either ride through or stop trusting before expiry. It
// is not parallel: no other test runs while the cluster has lost its
// leader.
func TestLeaderKill(t *testing.T) {
	requireCluster(t)
	if testing.Short() {
		t.Skip("kills and restarts an etcd member")
	}
	// The members' election timeout is 3 s, randomised up to 6 s, so the
	// cluster may have no leader for longer than MinTTL.
	t.Run("keepers_whose_ttl_outlasts_an_election_ride_through_it", func(t *testing.T) {
		rode, _ := leaderKill(t, 20*time.Second, 2*time.Second)
		assert.Equal(t, leaderKillRuns, rode, "every keeper rides through")
	})
	t.Run("keepers_whose_ttl_an_election_outlasts_stop_trusting_before_another_node_takes_over", func(t *testing.T) {
		leaderKill(t, runlease.MinTTL, time.Second) // the contenders check it
	})
}

const leaderKillRuns = 10

// leaderKill runs the leader kill with leases of ttl renewed every interval,
// failing t if a contender ever takes a lease over while its keeper trusts
// it, and returns how many keepers rode through and how many leases were
// taken over.
func leaderKill(t *testing.T, ttl, interval time.Duration) (rode, takeovers int) {
	c := requireCluster(t)
	a := newStore(t)
	b := reopen(t, a)
	var r runlease.Renewer
	defer r.Close()
	keepers := make([]*runlease.Keeper, leaderKillRuns)
	fences := make([]uint64, leaderKillRuns)
	for i := range keepers {
		l, err := runlease.Acquire(t.Context(), a, "run"+strconv.Itoa(i), "A", runlease.WithTTL(ttl))
		require.NoError(t, err)
		fences[i] = l.Fence()
		keepers[i], err = r.Keep(t.Context(), l, runlease.KeepInterval(interval))
		require.NoError(t, err)
	}

	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var taken atomic.Int64
	for i := range keepers {
		wg.Go(func() { contend(ctx, t, b, i, ttl, keepers[i], fences[i], &taken) })
	}
	time.Sleep(2 * time.Second)
	leader, err := c.Leader(t.Context())
	require.NoError(t, err)
	c.Kill(leader)
	t.Logf("killed the leader, member %d", leader)
	time.Sleep(8 * time.Second)
	require.NoError(t, c.Restart(leader))
	time.Sleep(3 * time.Second)
	stop()
	wg.Wait()

	for i, k := range keepers {
		if err := k.Err(); err != nil {
			t.Logf("run%d: the keeper stopped: %v", i, err)
			continue
		}
		rode++
		info, err := runlease.Peek(t.Context(), a, "run"+strconv.Itoa(i))
		require.NoError(t, err)
		assert.Equal(t, "A", info.Holder, "run%d: a keeper that still runs holds its lease", i)
		assert.Equal(t, fences[i], info.Fence, "run%d: renewals keep the fence", i)
	}
	t.Logf("%d of %d keepers rode through; %d leases were taken over", rode, leaderKillRuns, taken.Load())
	return rode, int(taken.Load())
}

// contend tries to take run i over as holder B until it does or ctx ends. A
// takeover while A's keeper still trusts the lease would be two holders at
// once (both nodes read the same clock here).
func contend(ctx context.Context, t *testing.T, b runlease.Store, i int, ttl time.Duration, k *runlease.Keeper, fence uint64, taken *atomic.Int64) {
	for ctx.Err() == nil {
		l, err := runlease.Acquire(ctx, b, "run"+strconv.Itoa(i), "B", runlease.WithTTL(ttl))
		if err == nil {
			now := time.Now()
			assert.False(t, k.Err() == nil && k.TrustedUntil().After(now),
				"run%d: B took the lease over while A's keeper trusted it until %v", i, k.TrustedUntil())
			assert.Greater(t, l.Fence(), fence, "run%d: a takeover moves the fence forward", i)
			taken.Add(1)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
