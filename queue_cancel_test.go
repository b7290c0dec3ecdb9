package runlease_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/testkit"
)

// A wait that ends without admission (its context cancelled, its deadline
// passed, a store call cut short) leaves nothing behind: no entry, no place,
// no slot.
func TestClaimSlotsWaitReturnsTheContextsErrorAndLeavesNothing(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		scopes := []runlease.Scope{runlease.MemScope(1), runlease.NamedScope("gpu", 4).Take(2)}
		_, err := runlease.ClaimSlots(t.Context(), s, "holder", scopes[:1])
		require.NoError(t, err)
		before := len(libRows(t, s))

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			_, err := runlease.ClaimSlotsWait(ctx, s, "waiter", scopes)
			done <- err
		}()
		awaitQueued(t, s, 2)
		cancel()
		err = <-done
		assert.Same(t, context.Canceled, err, "ctx.Err() itself")
		assert.Empty(t, queueRows(t, s), "its place is taken out of every queue")
		assert.Len(t, libRows(t, s), before)

		dctx, dcancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer dcancel()
		_, err = runlease.ClaimSlotsWait(dctx, s, "waiter", scopes)
		assert.True(t, err == context.DeadlineExceeded, "ctx.Err() itself, not %v", err)
		assert.Empty(t, queueRows(t, s))
	})
}

// A wait given up while the batch of its place still runs on the server
// (its context ended while the batch waited for a row lock, and the cancel
// request pgx sent was lost) leaves no entry once that batch commits: the
// wait reads each entry back on its way out, and on Postgres that read
// waits for the batch's backend, so it finds the entries the batch wrote
// and takes them out.
func TestAWaitGivenUpWhileItsPlaceStillRunsLeavesNoEntry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, drop := pgPoolDroppingCancel(t, 4)
	table := pgtest.NewTable(t, pool)
	s, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	scopes := []runlease.Scope{runlease.MemScope(1), runlease.NamedScope("gpu", 4).Take(2)}
	_, err = runlease.ClaimSlots(ctx, s, "holder", scopes[:1])
	require.NoError(t, err)
	before := len(libRows(t, s))

	// The place's batch takes its keys in order: the line entries, then
	// the place rows, where it waits for the holder.
	release := holdKey(t, table, "runplace:3:gpu:waiter")
	dropped := drop()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runlease.ClaimSlotsWait(wctx, s, "waiter", scopes)
		done <- err
	}()
	require.True(t, awaitBackends(t, pool, "wait_event_type = 'Lock'", 1), "the place's batch waits for the holder")
	cancel()
	select {
	case <-dropped:
	case <-time.After(10 * time.Second):
		t.Fatal("pgx sent no cancel request")
	}
	time.Sleep(300 * time.Millisecond) // the wait leaves meanwhile
	release()                          // and the batch goes on, and commits
	assert.Same(t, context.Canceled, <-done, "ctx.Err() itself")
	require.True(t, awaitBackends(t, pool, "state <> 'idle'", 0), "the batch is done")
	assert.Empty(t, queueRows(t, s), "an entry of the wait is left in the queue")
	assert.Len(t, libRows(t, s), before)
}

// On a store without batches, a waiter writes its entries (and its
// principal's marks) one conditional write at a time. When a later write of
// the set is refused (a racing writer moved the row) and the wait is then
// cancelled, the writes that landed are taken back: no live entry of the
// run stays in the queue to reserve the slot for a TTL.
func TestAPlainStoreWaitCancelledMidEnqueueLeavesNoEntry(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	f := &testkit.Faulty{Store: base}
	s := testkit.PlainStore{Store: f}
	a, b := runlease.NamedScope("a", 1), runlease.NamedScope("b", 1)
	_, err := runlease.ClaimSlots(t.Context(), base, "holder", []runlease.Scope{a, b}, runlease.WithTTL(time.Hour))
	require.NoError(t, err)
	before := libRows(t, base)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The waiter's writes: entry a, then entry b. The second is refused
	// (its condition no longer holds) and the caller gives up meanwhile.
	f.Next(testkit.Fault{Apply: true}, testkit.Fault{Apply: false, Then: cancel})
	_, err = runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{a, b}, runlease.WithWaitPoll(runlease.MinWaitPoll))
	require.Same(t, context.Canceled, err)

	assert.Empty(t, queueRows(t, base), "the cancelled waiter's entry is left in the queue")
	assert.Equal(t, before, libRows(t, base))

	// And it holds others back: a plain claim of a, once a's slot is free,
	// is refused for the sake of a waiter that is gone.
	occ, err := runlease.Occupancy(t.Context(), base)
	require.NoError(t, err)
	for _, o := range occ {
		if o.Scope == "a" {
			_, err := base.MetaDelete(t.Context(), o.Key, get(t, base, o.Key))
			require.NoError(t, err)
		}
	}
	_, err = runlease.ClaimSlots(t.Context(), base, "next", []runlease.Scope{a})
	assert.NoError(t, err, "a free slot refused for a waiter that gave up")
}

// A wait whose admission batch lands, but whose reply is lost as the
// caller's context ends, returns context.Canceled ("ctx.Err() itself") and
// no Slots: then the run must hold no slot, for nobody could release it
// and the scope would be full for a TTL. A cancelled wait changes no row
// but its own entries.
func TestACancelledWaitWhoseAdmissionLandedLeavesNoSlot(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	f := &testkit.Faulty{Store: base}
	scopes := []runlease.Scope{runlease.MemScope(1)}
	held, err := runlease.ClaimSlots(t.Context(), base, "holder", scopes)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	d := startWait(ctx, f, "r", scopes, runlease.WithWaitPoll(runlease.MinWaitPoll))
	awaitQueued(t, base, 1)
	// The next write is the admission: it commits, and the reply is lost
	// as the caller cancels.
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaBatch"), Then: cancel})
	require.NoError(t, held.Release(t.Context()))
	err = waitErr(t, d)
	if err == nil {
		return // admitted and told so: fine
	}
	occ, oerr := runlease.Occupancy(t.Context(), base)
	require.NoError(t, oerr)
	assert.Empty(t, occ, "ClaimSlotsWait returned %v, yet the run holds a slot no one can release", err)
	assert.Empty(t, queueRows(t, base))
}

// A wait whose read fails as its deadline passes, before the context's
// timer has said so, returns the deadline's error itself, as when the timer
// had run first (deadlinePassed), and leaves no entry.
func TestAWaitWhoseDeadlinePassedBeforeItsTimerRanReturnsTheDeadlinesError(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	f := &testkit.Faulty{Store: base}
	a := runlease.NamedScope("a", 1)
	_, err := runlease.ClaimSlots(t.Context(), base, "holder", []runlease.Scope{a}, runlease.WithTTL(time.Hour))
	require.NoError(t, err)
	before := libRows(t, base)

	f.FailReads(1)
	_, err = runlease.ClaimSlotsWait(deadlinePassed{t.Context()}, f, "r", []runlease.Scope{a}, runlease.WithWaitPoll(runlease.MinWaitPoll))
	require.Equal(t, context.DeadlineExceeded, err)
	assert.Empty(t, queueRows(t, base))
	assert.Equal(t, before, libRows(t, base))
}

// A wait that cannot be admitted, whose deadline has passed while the
// context's timer has not said so, returns the deadline's error instead of
// queueing, as AcquireWait does on a run held elsewhere; one that can be
// admitted at once is, as AcquireWait takes a free run.
func TestAWaitWhoseDeadlinePassedEndsBeforeItQueues(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	a := runlease.NamedScope("a", 1)
	first, err := runlease.ClaimSlots(t.Context(), s, "holder", []runlease.Scope{a}, runlease.WithTTL(time.Hour))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runlease.ClaimSlotsWait(deadlinePassed{ctx}, s, "r", []runlease.Scope{a}, runlease.WithWaitPoll(runlease.MinWaitPoll))
		done <- err
	}()
	var werr error
	select {
	case werr = <-done:
	case <-time.After(30 * time.Second): // a guard against a hang, not a timing
		cancel()
		t.Fatalf("a wait whose deadline had passed queued and waited; cancelled, it returned %v", <-done)
	}
	require.Equal(t, context.DeadlineExceeded, werr)
	assert.Empty(t, queueRows(t, s), "it wrote no entry")

	require.NoError(t, first.Release(t.Context()))
	sl, err := runlease.ClaimSlotsWait(deadlinePassed{t.Context()}, s, "r", []runlease.Scope{a})
	require.NoError(t, err, "a free slot is taken, as by AcquireWait")
	require.NoError(t, sl.Release(t.Context()))
}

// cancelOnSlot is a store with no optional capability (no batches, no
// ranges, no notifier) that runs then after the first slot row of run
// lands, as a caller that gives up at that moment does, and that fails
// every call made with a context that has ended, as a real store does.
type cancelOnSlot struct {
	runlease.Store
	run  string
	once sync.Once
	then func()
}

func (c *cancelOnSlot) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, &runlease.StorageError{Op: "MetaCAS", Err: err}
	}
	ok, err := c.Store.MetaCAS(ctx, key, expected, value)
	if ok && err == nil && strings.HasPrefix(key, runlease.SlotPrefix) && strings.Contains(value, `"`+c.run+`"`) {
		c.once.Do(c.then)
	}
	return ok, err
}

func (c *cancelOnSlot) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, &runlease.StorageError{Op: "MetaDelete", Err: err}
	}
	return c.Store.MetaDelete(ctx, key, expected)
}

func (c *cancelOnSlot) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if err := ctx.Err(); err != nil {
		return "", false, &runlease.StorageError{Op: "MetaGet", Err: err}
	}
	return c.Store.MetaGet(ctx, key)
}

func (c *cancelOnSlot) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, &runlease.StorageError{Op: "MetaScan", Err: err}
	}
	return c.Store.MetaScan(ctx, prefix)
}

// On a store without batches a waiter is admitted slot by slot. When its
// context ends after the first slot landed, the wait returns ctx's error,
// and must leave no slot behind: "a wait whose context ends returns
// within 2 s of it, taking its entries out and freeing an admission in
// doubt on a context of their own". A slot left live holds the scope for
// a TTL for a run that was told it holds nothing.
func TestAPlainStoreWaitCancelledMidAdmissionLeavesNoSlot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		scopes []runlease.Scope
	}{
		{"two_scopes", []runlease.Scope{runlease.NamedScope("a", 1), runlease.NamedScope("b", 1)}},
		{"two_units", []runlease.Scope{runlease.NamedScope("a", 2).Take(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := newSQLite(t)
			before := libRows(t, base)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s := &cancelOnSlot{Store: base, run: "r", then: cancel}
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", tc.scopes, runlease.WithTTL(time.Hour),
				runlease.WithWaitPoll(runlease.MinWaitPoll))
			require.ErrorIs(t, err, context.Canceled)
			occ, err := runlease.Occupancy(t.Context(), base)
			require.NoError(t, err)
			assert.Empty(t, occ, "a cancelled wait left a slot held for its TTL")
			var left []runlease.Row
			for _, r := range libRows(t, base) {
				if strings.HasPrefix(r.Key, runlease.SlotPrefix) || strings.HasPrefix(r.Key, runlease.QueuePrefix) ||
					strings.HasPrefix(r.Key, runlease.PlacePrefix) {
					left = append(left, r)
				}
			}
			assert.Empty(t, left, "rows the cancelled wait left (before: %v)", before)
		})
	}
}

// The same on ClaimSlots, on a store without batches: the claim writes
// slot by slot and rolls back with the caller's context, which has ended.
func TestAPlainStoreClaimCancelledMidClaimLeavesNoSlot(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s := &cancelOnSlot{Store: base, run: "r", then: cancel}
	_, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{runlease.NamedScope("a", 1), runlease.NamedScope("b", 1)},
		runlease.WithTTL(time.Hour))
	require.Error(t, err)
	occ, err := runlease.Occupancy(t.Context(), base)
	require.NoError(t, err)
	assert.Empty(t, occ, "a claim that failed left a slot held for its TTL")
}
