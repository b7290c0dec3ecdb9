package runlease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/systest"
)

// TestPostgresFailover runs the store on a private primary with a streaming
// standby, reached through one multi-host DSN (target_session_attrs =
// read-write), kills the primary and promotes the standby. With synchronous
// replication nothing acknowledged is lost and the lease promises hold
// across the failover; with asynchronous replication a lagging standby
// loses acknowledged writes and hands a fence out twice, which is what the
// README tells users of asynchronous replication to expect.
func TestPostgresFailover(t *testing.T) {
	systest.Mark(t) // a private primary and standby
	t.Parallel()
	t.Run("synchronous_replication_keeps_every_promise", testFailoverSynchronous)
	t.Run("asynchronous_replication_loses_acknowledged_writes", testFailoverAsynchronous)
}

// failoverMonitor is what the drivers of the synchronous run tell the
// checks. Its mutex is held only to read and write its fields.
type failoverMonitor struct {
	mu         sync.Mutex
	trusting   map[string]map[string]*runlease.Keeper // run → holder → its keeper, while it works
	granted    map[string]map[uint64]string           // run → fence → holder granted it
	acked      map[string]time.Time                   // fenced-write key → when the write was acknowledged
	violations []string
}

func (m *failoverMonitor) violate(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.violations = append(m.violations, fmt.Sprintf(format, args...))
}

// grant records an acquisition, and checks that no fence of a run goes to
// two holders.
func (m *failoverMonitor) grant(run, holder string, fence uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.granted[run] == nil {
		m.granted[run] = map[uint64]string{}
	}
	if prev, ok := m.granted[run][fence]; ok {
		m.violations = append(m.violations, fmt.Sprintf("run %s fence %d granted to %s and then to %s", run, fence, prev, holder))
	}
	m.granted[run][fence] = holder
}

// work checks, before a step of holder's work on run, that no other
// holder's keeper trusts the run at this instant, and records k as
// trusting it.
func (m *failoverMonitor) work(run, holder string, k *runlease.Keeper) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.trusting[run] == nil {
		m.trusting[run] = map[string]*runlease.Keeper{}
	}
	now := time.Now()
	for h, other := range m.trusting[run] {
		if h != holder && other.Err() == nil && now.Before(other.TrustedUntil()) {
			m.violations = append(m.violations, fmt.Sprintf("%s works on run %s (fence %d) while %s's keeper trusts it (fence %d) until %v",
				holder, run, k.Lease().Fence(), h, other.Lease().Fence(), other.TrustedUntil().Sub(now)))
		}
	}
	m.trusting[run][holder] = k
}

func (m *failoverMonitor) done(run, holder string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.trusting[run], holder)
}

func (m *failoverMonitor) ack(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.acked[key] = time.Now()
}

// keepers returns the keepers that trust a run now.
func (m *failoverMonitor) keepers() []*runlease.Keeper {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*runlease.Keeper
	for _, hs := range m.trusting {
		for _, k := range hs {
			if k.Err() == nil {
				out = append(out, k)
			}
		}
	}
	return out
}

// failoverDriver acquires one of runs, keeps it, and makes fenced writes
// of keys of its own through the keeper's context until the run ends or
// it gives the run up, over and over until ctx ends.
func failoverDriver(ctx context.Context, s runlease.Store, m *failoverMonitor, holder string, runs []string, seed uint64, ended *atomic.Int64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	pause := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	for ctx.Err() == nil {
		run := runs[rng.IntN(len(runs))]
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		l, err := runlease.Acquire(actx, s, run, holder, runlease.WithTTL(6*time.Second))
		cancel()
		if err != nil {
			pause(100 * time.Millisecond)
			continue
		}
		m.grant(run, holder, l.Fence())
		k, err := runlease.Keep(ctx, l)
		if err != nil {
			continue
		}
		work := k.Context()
		// A write that fails is made again: the driver gives the run up
		// after n checkpoints, or when the keeper ends.
		for i, n := 0, 20+rng.IntN(40); i < n; {
			if work.Err() != nil || ctx.Err() != nil {
				break
			}
			m.work(run, holder, k)
			key := fmt.Sprintf("ckpt:%s:%d:%s:%d", run, l.Fence(), holder, i)
			wctx, cancel := context.WithTimeout(work, 2*time.Second)
			if l.Write(wctx, runlease.Put(key, holder)) == nil {
				m.ack(key)
				i++
			}
			cancel()
			select {
			case <-work.Done():
			case <-ctx.Done():
			case <-time.After(40 * time.Millisecond):
			}
		}
		if work.Err() != nil && ctx.Err() == nil {
			// The keeper ended by itself: it must have stopped trusting
			// before the row it last confirmed expired.
			ended.Add(1)
			if now := time.Now(); now.After(l.Expiry()) {
				m.violate("%s's keeper of %s (fence %d) ended %v after its row expired (%v)",
					holder, run, l.Fence(), now.Sub(l.Expiry()), k.Err())
			}
		}
		m.done(run, holder)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
		_ = k.Release(rctx) // may fail while no server accepts writes: the row then expires
		cancel()
	}
}

func testFailoverSynchronous(t *testing.T) {
	t.Parallel()
	pair := pgtest.StartReplicated(t, true)
	ctx := t.Context()
	s, err := runlease.OpenPostgres(ctx, pair.DSN(), runlease.WithTable("failover"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })

	m := &failoverMonitor{trusting: map[string]map[string]*runlease.Keeper{},
		granted: map[string]map[uint64]string{}, acked: map[string]time.Time{}}
	runs := []string{"a", "b"}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var ended atomic.Int64
	for i := range 4 {
		wg.Go(func() { failoverDriver(wctx, s, m, fmt.Sprintf("driver-%d", i), runs, uint64(i), &ended) })
	}
	time.Sleep(3 * time.Second)

	atKill := m.keepers()
	require.NotEmpty(t, atKill, "keepers run before the failover")
	pair.KillPrimary()
	killed := time.Now()
	time.Sleep(500 * time.Millisecond)
	pair.Promote()
	promoted := time.Now()
	t.Logf("primary killed; the standby accepted writes %v later", promoted.Sub(killed))

	// Every renewal acknowledged before the failover survived it: the row
	// of a lease still held runs at least to the expiry its Lease had
	// confirmed (read first, so a renewal landing meanwhile only helps).
	for _, k := range atKill {
		l := k.Lease()
		expiry := l.Expiry()
		info, err := runlease.Peek(ctx, s, l.RunID())
		require.NoError(t, err, "the pool reaches the new primary by itself")
		switch {
		case info.Fence < l.Fence():
			m.violate("run %s went back from fence %d to %d", l.RunID(), l.Fence(), info.Fence)
		case info.Fence == l.Fence() && info.Holder == l.Holder() && info.Until.Before(expiry):
			m.violate("run %s: the row of %s runs to %v, short of the expiry %v its Lease confirmed", l.RunID(), l.Holder(), info.Until, expiry)
		}
	}

	time.Sleep(5 * time.Second)
	stop()
	wg.Wait()

	// Every fenced write acknowledged, before or after the failover, is
	// on the new primary.
	rows, err := s.MetaScan(ctx, "ckpt:")
	require.NoError(t, err)
	stored := map[string]bool{}
	for _, r := range rows {
		stored[r.Key] = true
	}
	after := 0
	for key, at := range m.acked {
		if !stored[key] {
			m.violate("the acknowledged write %s is not on the new primary", key)
		}
		if at.After(promoted) {
			after++
		}
	}
	// The same store value, without a reopen, works on the new primary.
	assert.Positive(t, after, "fenced writes landed after the failover")
	// A keeper rode through when its lease landed writes on the new
	// primary, the driver having seen no loss and no end of trust.
	rode := 0
	for _, k := range atKill {
		l := k.Lease()
		prefix := fmt.Sprintf("ckpt:%s:%d:%s:", l.RunID(), l.Fence(), l.Holder())
		for key, at := range m.acked {
			if strings.HasPrefix(key, prefix) && at.After(promoted) {
				rode++
				break
			}
		}
	}
	t.Logf("%d fenced writes acknowledged (%d after the failover); of %d keepers running at the kill, %d rode through; %d keepers ended by themselves",
		len(m.acked), after, len(atKill), rode, ended.Load())
	assert.Positive(t, rode, "a keeper with several seconds of trust left rides through a failover of under two seconds")
	for run := range m.granted {
		info, err := runlease.Peek(ctx, s, run)
		require.NoError(t, err)
		for fence := range m.granted[run] {
			assert.GreaterOrEqual(t, info.Fence, fence, "run %s's fence went back", run)
		}
	}
	assert.Empty(t, m.violations)
}

func testFailoverAsynchronous(t *testing.T) {
	t.Parallel()
	pair := pgtest.StartReplicated(t, false)
	ctx := t.Context()
	s, err := runlease.OpenPostgres(ctx, pair.DSN(), runlease.WithTable("failover"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	ttl := runlease.WithTTL(runlease.MinTTL)

	a, err := runlease.Acquire(ctx, s, "r", "A", ttl)
	require.NoError(t, err)
	require.NoError(t, a.Write(ctx, runlease.Put("ckpt:r", "1")))
	pair.WaitCaughtUp()

	// The standby is cut off; everything from here on is acknowledged by
	// the primary alone.
	pair.DisconnectStandby()
	require.NoError(t, a.Write(ctx, runlease.Put("ckpt:r", "2")))
	require.NoError(t, a.Release(ctx))
	b, err := runlease.Acquire(ctx, s, "r", "B", ttl)
	require.NoError(t, err)
	require.Equal(t, uint64(2), b.Fence())
	require.NoError(t, b.Write(ctx, runlease.Put("ckpt:r", "3")))

	pair.KillPrimary()
	pair.ReconnectStandby()
	pair.Promote()

	// The new primary never saw A's second write, A's release, B's
	// acquisition or B's write, all acknowledged.
	v, _, err := s.MetaGet(ctx, "ckpt:r")
	require.NoError(t, err)
	assert.Equal(t, "1", v, "the acknowledged checkpoints 2 and 3 are lost")
	info, err := runlease.Peek(ctx, s, "r")
	require.NoError(t, err)
	assert.Equal(t, "A", info.Holder, "A's acknowledged release is lost: the run is A's again")
	assert.Equal(t, uint64(1), info.Fence)
	require.ErrorIs(t, b.Renew(ctx), runlease.ErrTakenOver, "B learns at its next call that the run is not its own")

	// Once A's resurrected row expires, the next holder is granted fence 2
	// again: B already wrote under it. Fencing downstream of the store
	// cannot tell C's writes from B's.
	wctx, cancel := context.WithTimeout(ctx, 3*runlease.MinTTL)
	defer cancel()
	c, err := runlease.AcquireWait(wctx, s, "r", "C", ttl)
	require.NoError(t, err)
	assert.Equal(t, b.Fence(), c.Fence(), "fence 2 is handed out twice")
}

// TestPostgresReadAfterAServerRestartIsServed: after a restart every idle
// connection of the pool is dead; a read finds so on its first try and is
// sent again on a new connection instead of failing. (A write that may
// have been sent on a dead connection is not: its outcome is unknown.)
func TestPostgresReadAfterAServerRestartIsServed(t *testing.T) {
	systest.Mark(t) // a private server, restarted
	t.Parallel()
	cluster := pgtest.StartCluster(t)
	ctx := t.Context()
	s, err := runlease.OpenPostgres(ctx, cluster.DSN(), runlease.WithTable("restart_read"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.True(t, mustCAS(t, s, "k", nil, "v"))
	cluster.Restart()
	v, found, err := s.MetaGet(ctx, "k")
	require.NoError(t, err, "the pool's dead connection is not the caller's fault")
	assert.True(t, found)
	assert.Equal(t, "v", v)
}

// TestPostgresSynchronousFailoverKeepsReleasesAndSlots: with a synchronous
// standby, every release and slot claim the primary acknowledged is on the
// standby once it is promoted, however soon after the acknowledgement the
// primary dies: each released run is a tombstone at its fence, each slot
// claimed and not released has its row, each slot released has none, and
// no scope holds more slots than its limit. While the standby is down,
// nothing is acknowledged. The role's default is
// synchronous_commit = local, which would acknowledge a commit before the
// standby has it: the store pins its own commits to on.
func TestPostgresSynchronousFailoverKeepsReleasesAndSlots(t *testing.T) {
	systest.Mark(t) // a private primary and standby
	t.Parallel()
	pair := pgtest.StartReplicated(t, true)
	pair.Exec(pair.Primary, `ALTER ROLE runlease SET synchronous_commit = local`)
	ctx := t.Context()
	s, err := runlease.OpenPostgres(ctx, pair.DSN(), runlease.WithTable("failover_slots"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	ttl := runlease.WithTTL(time.Minute) // nothing expires while the test runs

	// Leases: each run acquired and released; the last release is
	// acknowledged just before the primary dies.
	released := map[string]uint64{}
	for i := range 8 {
		run := fmt.Sprintf("lease-%d", i)
		l, err := runlease.Acquire(ctx, s, run, "A", ttl)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		released[run] = l.Fence()
	}
	// Slots: a scope of 3, claimed by run after run, each claim once the
	// oldest holder released its slot; two scopes per claim, one of which
	// is the run's own.
	const limit = 3
	pool := runlease.NamedScope("pool", limit)
	var held []*runlease.Slots
	var freed []string
	for i := range 9 {
		if len(held) == limit {
			require.NoError(t, held[0].Release(ctx))
			freed = append(freed, held[0].RunID())
			held = held[1:]
		}
		run := fmt.Sprintf("slots-%d", i)
		sl, err := runlease.ClaimSlots(ctx, s, run, []runlease.Scope{pool, runlease.NamedScope("own-"+run, 1)}, ttl)
		require.NoError(t, err)
		held = append(held, sl)
	}
	l, err := runlease.Acquire(ctx, s, "lease-last", "A", ttl)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	released["lease-last"] = l.Fence()
	require.NoError(t, held[0].Release(ctx))
	freed = append(freed, held[0].RunID())
	held = held[1:]

	doubt, err := runlease.Acquire(ctx, s, "lease-doubt", "A", ttl)
	require.NoError(t, err)

	// The standby goes down: a commit now waits for it, and a call whose
	// context ends first is not acknowledged. Were a commit acknowledged
	// without the standby, it would be lost in the failover below.
	pair.DisconnectStandby()
	acked := 0
	within := func(call func(ctx context.Context) error) bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := call(cctx); err != nil {
			return false
		}
		acked++
		return true
	}
	if within(doubt.Release) {
		released["lease-doubt"] = doubt.Fence()
	}
	if within(held[0].Release) {
		freed = append(freed, held[0].RunID())
		held = held[1:]
	}
	within(func(ctx context.Context) error {
		sl, err := runlease.ClaimSlots(ctx, s, "slots-doubt", []runlease.Scope{pool, runlease.NamedScope("own-slots-doubt", 1)}, ttl)
		if err == nil {
			held = append(held, sl)
		}
		return err
	})
	assert.Zero(t, acked, "no commit is acknowledged while the synchronous standby is down")

	pair.KillPrimary()
	pair.ReconnectStandby()
	pair.Promote()
	promoted, err := runlease.OpenPostgres(ctx, pair.Standby.DSN(), runlease.WithTable("failover_slots"))
	require.NoError(t, err)
	t.Cleanup(func() { promoted.Close() })

	for run, fence := range released {
		info, err := runlease.Peek(ctx, promoted, run)
		require.NoError(t, err)
		assert.True(t, info.Released, "%s: the acknowledged release is a tombstone on the new primary", run)
		assert.Equal(t, fence, info.Fence, "%s", run)
	}
	// Every row there, live or not: a clock at the epoch sees them all.
	rows, err := runlease.Occupancy(ctx, promoted, runlease.WithClock(func() time.Time { return time.UnixMilli(0) }))
	require.NoError(t, err)
	byScope := map[string][]string{}
	for _, r := range rows {
		require.False(t, r.Corrupt, "%s", r.Key)
		byScope[r.Scope] = append(byScope[r.Scope], r.RunID)
	}
	var want []string
	for _, sl := range held {
		want = append(want, sl.RunID())
		assert.Equal(t, []string{sl.RunID()}, byScope["own-"+sl.RunID()], "the acknowledged claim's own slot is there")
	}
	assert.ElementsMatch(t, want, byScope["pool"], "every acknowledged claim, and no acknowledged release, holds a slot of the pool")
	assert.LessOrEqual(t, len(byScope["pool"]), limit)
	for _, run := range freed {
		assert.Empty(t, byScope["own-"+run], "%s's acknowledged release freed its own slot", run)
	}
}
