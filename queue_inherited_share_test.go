package runlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestAnInheritedShareGoesBackWhenTheNewerWaiterLeavesUnadmitted: run r's
// older driver queues for principal pr (whose mark was absent), a newer
// driver's waiter takes its place at its rank, and the older one leaves
// with RUN-E026, leaving the share to the newer one. The newer one then
// gives up, never admitted: no run of pr was admitted and none waits, so
// pr's mark must be back where it was before r queued (absent), not left
// at r's finish.
func TestAnInheritedShareGoesBackWhenTheNewerWaiterLeavesUnadmitted(t *testing.T) {
	t.Skip("open: a waiter that took an older one's rank gives back to the older one's mark, not to what the mark held before the older place; the mark must record where it moved from")
	t.Parallel()
	s := newSQLite(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	at := runlease.WithClock(testkit.NewClock(time.Now()).Now) // one millisecond for every stamp
	mem := []runlease.Scope{runlease.MemScope(1)}
	opts := []runlease.Option{runlease.WithFairShare("pr", 1), runlease.WithWaitPoll(runlease.MinWaitPoll)}
	mk := runlease.FairPrefix + "3:mem:pr"
	_, err := runlease.ClaimSlots(ctx, s, "holder", mem, runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	_, found, err := s.MetaGet(ctx, mk)
	require.NoError(t, err)
	require.False(t, found, "pr has no mark before r queues")

	old, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	dOld := leaseWait(ctx, old, mem, opts...)
	require.Eventually(t, func() bool { return len(lineRows(t, s, "mem")) == 1 }, 20*time.Second, time.Millisecond)

	newer, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	nctx, ncancel := context.WithCancel(ctx)
	defer ncancel()
	dNew := leaseWait(nctx, newer, mem, opts...)
	awaitNewerInPlace(t, s, "mem", "r", newer)
	require.ErrorIs(t, waitErr(t, dOld), runlease.ErrAlreadyQueued)

	ncancel()
	require.ErrorIs(t, waitErr(t, dNew), context.Canceled)
	require.Empty(t, lineRows(t, s, "mem"), "both waiters of r are gone")
	v, found, err := s.MetaGet(ctx, mk)
	require.NoError(t, err)
	assert.False(t, found, "r was never admitted, yet pr's mark stays charged with its share: %s", v)
}

// TestAnOlderWaiterKeepsItsHandsOffTheShareOfAnAdmittedNewerOne: run r's
// older driver waits in another process (here, another Store value of the
// same database, whose waiters poll rarely and hear no rings), a newer
// driver's waiter takes its place at its rank, and is admitted. The share
// its place charged stays charged: r was admitted. The older waiter, whose
// wait then ends, must not give that share back: the mark the admitted
// place wrote is byte for byte its own (stamped in the same millisecond).
func TestAnOlderWaiterKeepsItsHandsOffTheShareOfAnAdmittedNewerOne(t *testing.T) {
	t.Skip("open: a mark does not say which waiter wrote it, so one stamped in the same millisecond is the older waiter's to its compare-and-swap")
	t.Parallel()
	s := newSQLite(t)
	other := testkit.NewCountingBatcher(s) // another room: no rings reach it
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	at := runlease.WithClock(testkit.NewClock(time.Now()).Now) // one millisecond for every stamp
	mem := []runlease.Scope{runlease.MemScope(1)}
	mk := runlease.FairPrefix + "3:mem:pr"
	held, err := runlease.ClaimSlots(ctx, s, "holder", mem, runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)

	old, err := runlease.Acquire(ctx, other, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	dOld := leaseWait(octx, old, mem, runlease.WithFairShare("pr", 1), runlease.WithWaitPoll(time.Hour))
	require.Eventually(t, func() bool { return len(lineRows(t, s, "mem")) == 1 }, 20*time.Second, time.Millisecond)

	newer, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	dNew := make(chan error, 1)
	go func() {
		_, err := newer.ClaimSlotsWait(ctx, mem, runlease.WithFairShare("pr", 1), runlease.WithWaitPoll(runlease.MinWaitPoll))
		dNew <- err
	}()
	awaitNewerInPlace(t, s, "mem", "r", newer)
	require.NoError(t, held.Release(ctx))
	require.NoError(t, waitErr(t, dNew), "the newer waiter is admitted")
	mark := get(t, s, mk)

	ocancel()
	require.ErrorIs(t, waitErr(t, dOld), context.Canceled)
	v, found, err := s.MetaGet(ctx, mk)
	require.NoError(t, err)
	assert.True(t, found && v == mark, "r was admitted, yet its older waiter gave pr's share back (mark %q, found %v)", v, found)
}

// TestAnOlderWaiterGivesBackItsShareWhenTheNewerOneRanksAnew: run r's
// older driver queues for principal pa; a newer driver of r waits for
// another principal, pb, so it cannot keep the older waiter's rank and
// ranks as a new waiter, charged to pb. Both start at the scope's virtual
// time, in the same millisecond, so the new place lands at the older
// one's very line key. The older waiter, leaving with RUN-E026, must give
// pa's share back: nobody took it over, and no run of pa waits.
func TestAnOlderWaiterGivesBackItsShareWhenTheNewerOneRanksAnew(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	at := runlease.WithClock(testkit.NewClock(time.Now()).Now) // one millisecond for every stamp
	mem := []runlease.Scope{runlease.MemScope(1)}
	poll := runlease.WithWaitPoll(runlease.MinWaitPoll)
	_, err := runlease.ClaimSlots(ctx, s, "holder", mem, runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	old, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	dOld := leaseWait(ctx, old, mem, runlease.WithFairShare("pa", 1), poll)
	require.Eventually(t, func() bool { return len(lineRows(t, s, "mem")) == 1 }, 20*time.Second, time.Millisecond)
	oldKey := lineRowOf(t, s, "mem", "r").Key
	get(t, s, runlease.FairPrefix+"3:mem:pa") // the older place charged pa

	newer, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour), at)
	require.NoError(t, err)
	dNew := leaseWait(ctx, newer, mem, runlease.WithFairShare("pb", 1), poll)
	awaitNewerInPlace(t, s, "mem", "r", newer)
	require.Equal(t, oldKey, lineRowOf(t, s, "mem", "r").Key, "the new place lands at the older one's key")
	get(t, s, runlease.FairPrefix+"3:mem:pb") // the new place charged pb

	require.ErrorIs(t, waitErr(t, dOld), runlease.ErrAlreadyQueued)
	v, found, err := s.MetaGet(ctx, runlease.FairPrefix+"3:mem:pa")
	require.NoError(t, err)
	assert.False(t, found, "no run of pa waits, yet its mark stays charged: %s", v)
	cancel()
	<-dNew
}
