package runlease_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/faultproxy"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/systest"
)

func serverNow(t *testing.T, s *runlease.PostgresStore) time.Time {
	t.Helper()
	now, _ := s.ClockNow()
	return now
}

func TestPostgresClockSkew(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	table := pgtest.NewTable(t, pgtest.Pool(t))
	skewed := func(d time.Duration) runlease.PostgresOption {
		return runlease.WithLocalClock(func() time.Time { return time.Now().Add(d) })
	}
	ahead := openPG(t, dsn, table, skewed(10*time.Minute))
	behind := openPG(t, dsn, table, skewed(-10*time.Minute))
	honest := openPG(t, dsn, table)

	t.Run("every_node_reads_the_servers_time", func(t *testing.T) {
		a, ua := ahead.ClockNow()
		h, uh := honest.ClockNow()
		b, ub := behind.ClockNow()
		slack := ua + uh + ub + 50*time.Millisecond // the reads are not simultaneous
		assert.Less(t, a.Sub(h).Abs(), slack, "ahead vs honest")
		assert.Less(t, b.Sub(h).Abs(), slack, "behind vs honest")
		assert.Less(t, ua, 50*time.Millisecond, "loopback round trips are short")
	})

	t.Run("a_node_ahead_cannot_take_a_live_lease", func(t *testing.T) {
		l, err := runlease.Acquire(t.Context(), behind, "r-behind", "B", runlease.WithTTL(time.Minute))
		require.NoError(t, err)
		_, err = runlease.Acquire(t.Context(), ahead, "r-behind", "A", runlease.WithTTL(time.Minute))
		require.ErrorIs(t, err, runlease.ErrTakenOver, "ten minutes ahead, the lease must still look live")
		assert.LessOrEqual(t, l.Expiry().Sub(serverNow(t, honest)), time.Minute+time.Second,
			"a node behind cannot make its lease look longer than the TTL")

		// What the store clock prevents: judged by the skewed local clock,
		// the node ahead would take the live lease.
		stolen, err := runlease.Acquire(t.Context(), ahead, "r-behind", "A", runlease.WithTTL(time.Minute),
			runlease.WithClock(func() time.Time { return time.Now().Add(10 * time.Minute) }))
		require.NoError(t, err, "the failure the store clock exists to prevent")
		require.NoError(t, stolen.Release(t.Context()))
	})

	t.Run("a_node_behind_cannot_take_a_live_lease", func(t *testing.T) {
		l, err := runlease.Acquire(t.Context(), ahead, "r-ahead", "A", runlease.WithTTL(runlease.MinTTL))
		require.NoError(t, err)
		assert.LessOrEqual(t, l.Expiry().Sub(serverNow(t, honest)), runlease.MinTTL+time.Second,
			"a node ahead cannot make its lease look longer than the TTL")
		_, err = runlease.Acquire(t.Context(), behind, "r-ahead", "B", runlease.WithTTL(runlease.MinTTL))
		require.ErrorIs(t, err, runlease.ErrTakenOver)
	})
}

func TestPostgresKeeperSurvivesASuperstepLongerThanTheTTL(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	dsn := pgtest.DSN(t)
	s := openPG(t, dsn, pgtest.NewTable(t, pgtest.Pool(t)))
	l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(runlease.MinTTL))
	require.NoError(t, err)
	k, err := runlease.Keep(t.Context(), l)
	require.NoError(t, err)
	defer k.Stop()

	select { // a superstep of twice the TTL, in real time
	case <-time.After(2 * runlease.MinTTL):
	case <-k.Done():
		t.Fatalf("lease lost mid-superstep: %v", k.Err())
	}
	_, err = runlease.Acquire(t.Context(), s, "r1", "B", runlease.WithTTL(runlease.MinTTL))
	require.ErrorIs(t, err, runlease.ErrLeaseLost)
	require.NoError(t, k.Release(t.Context()))
}

// TestPostgresPartitionedHolderStopsBeforeAContenderStarts cuts a holder off
// the server with a proxy that blackholes its connections, and proves the
// holder's trusted window closes before a contender, on a healthy
// connection, is granted the lease.
func TestPostgresPartitionedHolderStopsBeforeAContenderStarts(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	dsn := pgtest.DSN(t)
	table := pgtest.NewTable(t, pgtest.Pool(t))
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	proxy, err := faultproxy.Start(net.JoinHostPort(u.Hostname(), portOf(u)))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()

	cutOff := openPG(t, u.String(), table)
	healthy := openPG(t, dsn, table)
	l, err := runlease.Acquire(t.Context(), cutOff, "r1", "A", runlease.WithTTL(runlease.MinTTL))
	require.NoError(t, err)
	k, err := runlease.Keep(context.Background(), l)
	require.NoError(t, err)
	defer k.Stop()

	time.Sleep(runlease.MinTTL / 2) // a few healthy renewals first
	require.NoError(t, k.Err())
	proxy.SetMode(faultproxy.Blackhole)
	defer proxy.SetMode(faultproxy.Pass) // heal before the stores close their connections

	ended := make(chan time.Time, 1)
	go func() { <-k.Done(); ended <- time.Now() }()
	var granted time.Time
	deadline := time.Now().Add(4 * runlease.MinTTL)
	for time.Now().Before(deadline) {
		start := time.Now()
		_, err := runlease.Acquire(t.Context(), healthy, "r1", "B", runlease.WithTTL(runlease.MinTTL))
		if err == nil {
			granted = start
			break
		}
		require.ErrorIs(t, err, runlease.ErrTakenOver)
		time.Sleep(20 * time.Millisecond)
	}
	require.False(t, granted.IsZero(), "the contender never got the lease")
	trustEnded := <-ended
	require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
	assert.True(t, trustEnded.Before(granted),
		"overlap: the holder trusted its lease until %v, the contender's winning attempt started at %v",
		trustEnded, granted)
	t.Logf("holder stopped trusting %v before the contender's winning attempt began", granted.Sub(trustEnded))
}

func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	return "5432"
}

// TestPostgresRestartLeavesOneHolderPerRun crashes and restarts a private
// server while a keeper holds a lease and a contender keeps trying to take
// it: after the restart at most one of them believes it holds the run.
func TestPostgresRestartLeavesOneHolderPerRun(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	cluster := pgtest.StartCluster(t)
	holderStore := openPGDSN(t, cluster.DSN())
	contenderStore := openPGDSN(t, cluster.DSN())
	ttl := runlease.WithTTL(runlease.MinTTL)

	l, err := runlease.Acquire(t.Context(), holderStore, "r1", "A", ttl)
	require.NoError(t, err)
	k, err := runlease.Keep(t.Context(), l)
	require.NoError(t, err)
	defer k.Stop()

	cluster.Restart()
	var b *runlease.Lease
	deadline := time.Now().Add(2 * runlease.MinTTL) // longer than a TTL: a lapse would show
	for b == nil && time.Now().Before(deadline) {
		b, err = runlease.Acquire(t.Context(), contenderStore, "r1", "B", ttl)
		var se *runlease.StorageError
		if err != nil && !errors.Is(err, runlease.ErrTakenOver) && !errors.As(err, &se) {
			t.Fatalf("an unclassified fault: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Either the keeper rode out the restart and the contender was refused
	// throughout, or the keeper gave the lease up and the contender took it
	// over at a higher fence — never both holding it.
	if b != nil {
		require.Error(t, k.Err(), "the contender holds r1 while the keeper still trusts it")
		assert.Greater(t, b.Fence(), l.Fence())
		require.ErrorIs(t, l.Renew(t.Context()), runlease.ErrLeaseLost)
	} else {
		require.NoError(t, k.Err(), "nobody holds r1")
		require.NoError(t, l.Renew(t.Context()))
	}
	t.Logf("after the restart: keeper err=%v, contender acquired=%v", k.Err(), b != nil)
}

func openPGDSN(t *testing.T, dsn string) *runlease.PostgresStore {
	t.Helper()
	s, err := runlease.OpenPostgres(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}
