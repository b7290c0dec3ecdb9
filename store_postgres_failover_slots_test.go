package runlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

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
	skipSystemTest(t)
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
