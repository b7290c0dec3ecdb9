package runlease_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// driverTakeover is what takeOverPlace leaves behind: on a mem scope whose
// only unit a holder keeps, run r waiting through the lease of an older
// driver, run q of another principal queued after it, and the waiter of a
// newer lease of r (a re-entry of D1: a higher fence) in the older
// waiter's place.
type driverTakeover struct {
	held           *runlease.Slots // the holder's unit of mem
	dOld, dq, dNew <-chan error    // the outcomes of the three waits
	oldKey, newKey string          // the line keys of the older and the newer waiter of r
	before, after  []string        // the runs of the line, in rank order, before and after the newer waiter came
}

// takeOverPlace sets a driverTakeover up on s. Every call judges time by
// one manual clock, which moves on by step between r's enqueue and q's.
// The two rank by their enqueue times alone: q's principal, with nothing
// waiting, starts at the head, which is r's tag. So their order is what
// step makes it, not what the speed of the machine does: on the wall
// clock, q's read can end in the millisecond r's did, and then the run id
// ranks q first.
func takeOverPlace(t *testing.T, ctx context.Context, s runlease.Store, step time.Duration) driverTakeover {
	t.Helper()
	clk := testkit.NewClock(time.Now())
	at := runlease.WithClock(clk.Now)
	mem := []runlease.Scope{runlease.MemScope(1)}
	poll := runlease.WithWaitPoll(runlease.MinWaitPoll)
	var d driverTakeover
	var err error
	d.held, err = runlease.ClaimSlots(ctx, s, "holder", mem, runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	old, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	d.dOld = leaseWait(ctx, old, mem, runlease.WithFairShare("pr", 1), poll)
	require.Eventually(t, func() bool { return len(lineRows(t, s, "mem")) == 1 }, 20*time.Second, time.Millisecond)
	d.oldKey = lineRowOf(t, s, "mem", "r").Key

	clk.Advance(step)
	d.dq = startWait(ctx, s, "q", mem, runlease.WithFairShare("pq", 1), poll, at)
	require.Eventually(t, func() bool { return len(lineRows(t, s, "mem")) == 2 }, 20*time.Second, time.Millisecond)
	d.before, _ = lineRuns(t, s, "mem", "r")

	newer, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at) // re-entry: a higher fence
	require.NoError(t, err)
	require.Greater(t, newer.Fence(), old.Fence())
	d.dNew = leaseWait(ctx, newer, mem, runlease.WithFairShare("pr", 1), poll)
	awaitNewerInPlace(t, s, "mem", "r", newer)
	// Nothing moves the line now until the holder releases: the older
	// waiter, finding its place taken, leaves without touching the newer's.
	d.after, d.newKey = lineRuns(t, s, "mem", "r")
	return d
}

// awaitNewerInPlace waits until run's one entry in scope is the one the
// waiter of newer, a lease of a higher fence, wrote in the older waiter's
// place.
func awaitNewerInPlace(t *testing.T, s runlease.Store, scope, run string, newer *runlease.Lease) {
	t.Helper()
	fence := `"fence":` + strconv.FormatUint(newer.Fence(), 10) + `,`
	require.Eventually(t, func() bool {
		rs := lineRowsOf(t, s, scope, run)
		return len(rs) == 1 && strings.Contains(rs[0].Value, fence)
	}, 20*time.Second, time.Millisecond, "the newer driver's waiter took the run's place")
}

// leaseWait runs l.ClaimSlotsWait in the background and returns its
// outcome's channel.
func leaseWait(ctx context.Context, l *runlease.Lease, scopes []runlease.Scope, opts ...runlease.Option) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := l.ClaimSlotsWait(ctx, scopes, opts...)
		done <- err
	}()
	return done
}

// lineRuns returns the runs of scope's line in rank order, from one read,
// and the line key of run's entry in it ("": none).
func lineRuns(t *testing.T, s runlease.Store, scope, run string) (runs []string, key string) {
	t.Helper()
	for _, r := range lineRows(t, s, scope) {
		_, rn, ok := parseLine(r.Key)
		require.True(t, ok, "a line key: %s", r.Key)
		runs = append(runs, rn)
		if rn == run {
			key = r.Key
		}
	}
	return runs, key
}

// TestANewerDriverKeepsTheRankOfAnOlderWaiterThatTied: r's older driver and
// q queue in the same millisecond at the same tag (q's principal starts at
// the head, r's entry). Tied, they rank by run id: q first (docs/admission.md,
// "Order"). The newer driver's waiter takes the older one's rank, at its
// very key, and the line keeps its order: q, ahead of the run from the
// start, is admitted first. (TestANewerDriverTakesTheOlderWaitersPlace
// once expected the run ahead whatever the enqueue times, and so failed
// when the machine was fast enough for q to tie.)
func TestANewerDriverKeepsTheRankOfAnOlderWaiterThatTied(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		d := takeOverPlace(t, ctx, s, 0)
		require.Equal(t, []string{"q", "r"}, d.before, "tied in tag and enqueue time, q ranks first by its run id")
		assert.Equal(t, d.oldKey, d.newKey, "the newer driver's waiter ranks where the older one was")
		assert.Equal(t, []string{"q", "r"}, d.after, "the line keeps its order")
		require.NoError(t, d.held.Release(ctx))
		select {
		case err := <-d.dq:
			assert.NoError(t, err, "q, first in line, is admitted first")
		case err := <-d.dNew:
			assert.Fail(t, "the run, behind q, was admitted first", "%v", err)
		case <-ctx.Done():
			t.Fatal("nobody admitted")
		}
		cancel()
		<-d.dOld
	})
}

// TestAnOlderWaiterLeavesTheNewerDriverItsShare: a newer driver's waiter
// that keeps the older one's rank keeps its share too: its place writes
// the principal's mark at the finish the older place wrote. When both
// places are stamped in one millisecond of the clock that judges expiry,
// that mark is byte for byte the older one's, and the older waiter,
// leaving with RUN-E026, must not give it back: the newer one still waits
// at that finish, and the principal's next run would share its tag.
func TestAnOlderWaiterLeavesTheNewerDriverItsShare(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	at := runlease.WithClock(testkit.NewClock(time.Now()).Now) // one millisecond for every stamp
	mem := []runlease.Scope{runlease.MemScope(1)}
	opts := []runlease.Option{runlease.WithFairShare("pr", 1), runlease.WithWaitPoll(runlease.MinWaitPoll)}
	_, err := runlease.ClaimSlots(ctx, s, "holder", mem, runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	old, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	dOld := leaseWait(ctx, old, mem, opts...)
	require.Eventually(t, func() bool { return len(lineRows(t, s, "mem")) == 1 }, 20*time.Second, time.Millisecond)
	newer, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	dNew := leaseWait(ctx, newer, mem, opts...)
	awaitNewerInPlace(t, s, "mem", "r", newer)
	mark := get(t, s, runlease.FairPrefix+"3:mem:pr")

	require.ErrorIs(t, waitErr(t, dOld), runlease.ErrAlreadyQueued, "the older driver's waiter finds the newer one in its place")
	v, found, err := s.MetaGet(ctx, runlease.FairPrefix+"3:mem:pr")
	require.NoError(t, err)
	assert.True(t, found && v == mark, "the principal's mark stays as the newer waiter wrote it, while it waits at its finish")
	cancel()
	<-dNew
}
