package runlease_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// The promises of the line that hold only at its edges: a place beyond
// the head read, a place row another call took, a delete or a renewal
// that does not land.

// TestAWaiterBeyondTheHeadKeepsItsPlaceAndIsNotQueuedTwice: behind three
// live waiters on a scope of limit 1, whose head a read takes two of, a
// run's entry lies beyond the head. It keeps its place through many reads
// (the head being cut says the line goes on: its entry may be there), and
// a second call for the run, which finds the first through the run's place
// row, is refused with RUN-E026 though the entry it names is not in the
// head read.
func TestAWaiterBeyondTheHeadKeepsItsPlaceAndIsNotQueuedTwice(t *testing.T) {
	t.Parallel()
	ctx, s := t.Context(), newSQLite(t)
	scope := runlease.NamedScope("gpu", 1)
	scopes := []runlease.Scope{scope}
	_, err := runlease.ClaimSlots(ctx, s, "holder", scopes)
	require.NoError(t, err)
	plantAhead(t, s, "gpu", 3)

	var requeued atomic.Int64
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := waitInBackground(wctx, s, "r", scopes, runlease.WithWaitPoll(runlease.MinWaitPoll),
		runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(runlease.RequeueEvent) { requeued.Add(1) }}))
	awaitWaiting(t, s, "r", res)
	was := lineRowOf(t, s, "gpu", "r")
	require.Greater(t, was.Key, lineRows(t, s, "gpu")[1].Key, "r lies beyond the head of limit+1 entries")

	// Many polls, each a read of the head that does not hold r's entry.
	time.Sleep(300 * time.Millisecond)
	assert.Zero(t, requeued.Load(), "a waiter beyond the head read keeps its place")
	assert.Equal(t, was.Key, lineRowOf(t, s, "gpu", "r").Key, "at the same rank")

	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	_, err = runlease.ClaimSlotsWait(sctx, s, "r", scopes)
	require.ErrorIs(t, err, runlease.ErrAlreadyQueued, "a second call of a run waiting beyond the head")
	assert.Equal(t, was.Key, lineRowOf(t, s, "gpu", "r").Key, "the first call's place is untouched")
	cancel()
	got := <-res
	require.ErrorIs(t, got.err, context.Canceled)
}

// TestAWaiterWhosePlaceRowAnotherCallTookIsNotAdmitted: a run waits on a
// full scope; meanwhile another call of the run takes its place row (as
// one would that judged its entry expired by a clock ahead, and queued
// anew). When the slot frees, the first call's admission is conditional on
// its place row: it is refused, the first call finds the run waiting
// elsewhere and fails with RUN-E026, and the other call's place stays.
func TestAWaiterWhosePlaceRowAnotherCallTookIsNotAdmitted(t *testing.T) {
	t.Parallel()
	ctx, s := t.Context(), newSQLite(t)
	scopes := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	hold, err := runlease.ClaimSlots(ctx, s, "holder", scopes)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res := waitInBackground(wctx, s, "r", scopes)
	awaitWaiting(t, s, "r", res)

	now := time.Now()
	other := plantedEntry{Run: "r", Waiter: "other-call", Seq: 1, EnqMS: now.UnixMilli() + 1,
		Tag: 9_000_000, UntilMS: now.Add(time.Hour).UnixMilli(), Scopes: []string{"gpu"}}
	put(t, s, other.key("gpu"), other.json())
	placeJSON, err := json.Marshal(map[string]any{"waiter": other.Waiter, "fence": 0, "key": other.key("gpu"), "until_ms": other.UntilMS})
	require.NoError(t, err)
	place, was := string(placeJSON), get(t, s, placeKeyOf("gpu", "r"))
	ok, err := s.MetaCAS(ctx, placeKeyOf("gpu", "r"), &was, place)
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, hold.Release(ctx))
	got := <-res
	if got.err == nil {
		t.Fatalf("admitted though another call holds the run's place (holding %v)", held(got.slots))
	}
	require.ErrorIs(t, got.err, runlease.ErrAlreadyQueued)
	assert.Equal(t, place, get(t, s, placeKeyOf("gpu", "r")), "the other call's place row stays")
}

// placeTakenBeforeAdmission is a store on which another call of run takes
// its place (entry and place row) just before the first batch that claims
// a slot: between the read of an admission without waiting and its write.
type placeTakenBeforeAdmission struct {
	*runlease.SQLiteStore
	t    *testing.T
	e    plantedEntry
	once sync.Once
}

func (p *placeTakenBeforeAdmission) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	for _, op := range ops {
		if strings.HasPrefix(op.Key, runlease.SlotPrefix) {
			p.once.Do(func() { plant(p.t, p.SQLiteStore, p.e) })
			break
		}
	}
	return p.SQLiteStore.MetaBatch(ctx, conds, ops)
}

// TestAnAdmissionWithoutWaitingChecksTheRunsPlaceRow: a run's call finds
// a free slot and is admitted at once, but another call of the run took a
// place between its read and its write. The admission is conditional on
// the run's place row as read (absent): it is refused, and the call, on
// reading again, finds the run waiting and fails with RUN-E026 rather than
// being admitted inside the other call's reservation.
func TestAnAdmissionWithoutWaitingChecksTheRunsPlaceRow(t *testing.T) {
	t.Parallel()
	ctx, base := t.Context(), newSQLite(t)
	now := time.Now()
	s := &placeTakenBeforeAdmission{SQLiteStore: base, t: t, e: plantedEntry{Run: "r", Waiter: "other-call", Seq: 1,
		EnqMS: now.UnixMilli(), UntilMS: now.Add(time.Hour).UnixMilli(), Scopes: []string{"gpu"}}}
	scopes := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sl, err := runlease.ClaimSlotsWait(wctx, s, "r", scopes)
	if err == nil {
		t.Fatalf("admitted though another call of the run took a place meanwhile (holding %v)", held(sl))
	}
	require.ErrorIs(t, err, runlease.ErrAlreadyQueued)
	slots, err := base.MetaScan(ctx, runlease.SlotPrefix)
	require.NoError(t, err)
	assert.Empty(t, slots, "no slot was written")
}

var errDown = errors.New("the store is down")

func TestADeadWaitersPlaceExpires(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	scope := runlease.MemScope(1)
	// The entry and place a waiter that died left behind: live for
	// another 5 s.
	dead := plantedEntry{Run: "dead", Waiter: "w1", Seq: 1, EnqMS: epoch.UnixMilli() - 1000,
		UntilMS: epoch.Add(5 * time.Second).UnixMilli(), Scopes: []string{"mem"}}
	entry := plant(t, s, dead)

	_, err := runlease.ClaimSlots(t.Context(), s, "r", []runlease.Scope{scope}, opts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the live entry reserves the only slot")

	done := make(chan error, 1)
	go func() {
		_, err := runlease.ClaimSlotsWait(t.Context(), s, "r", []runlease.Scope{scope}, append(opts, runlease.WithWaitPoll(runlease.MinWaitPoll))...)
		done <- err
	}()
	awaitQueued(t, s, 2)
	clk.Advance(5 * time.Second)
	require.NoError(t, <-done, "admitted once the dead waiter's entry expired")
	// Expired, it may be taken out by a waiter that read past it (only
	// while it holds the row read); it is never written over.
	if v, found, err := s.MetaGet(t.Context(), dead.key("mem")); assert.NoError(t, err) && found {
		assert.Equal(t, entry, v, "another's entry is never written over")
	}
	assert.Contains(t, get(t, s, placeKeyOf("mem", "dead")), `"waiter":"w1"`, "nor its place row (Prune's)")
}

// TestALegacyEntryHoldsNoPlace: an entry at runqueue:, written by a
// version before the line, ranks nowhere and reserves nothing: a claim of
// another run is admitted beside it, live or not, and never writes over
// it. Only its own run reads it (TestALegacyEntryOfTheRunStillWaits).
func TestALegacyEntryHoldsNoPlace(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		now := time.Now()
		old := plantedEntry{Run: "old", Waiter: "w1", Seq: 1, EnqMS: now.UnixMilli() - 1000,
			UntilMS: now.Add(time.Hour).UnixMilli(), Scopes: []string{"mem"}}
		put(t, s, legacyKeyOf("mem", "old"), old.json())
		mem := []runlease.Scope{runlease.MemScope(1)}

		sl, err := runlease.ClaimSlots(ctx, s, "plain", mem)
		require.NoError(t, err, "a live legacy entry of another run holds the only slot for nobody")
		require.NoError(t, sl.Release(ctx))
		sl, err = runlease.ClaimSlotsWait(ctx, s, "waiting", mem)
		require.NoError(t, err, "nor does it hold a waiter back")
		ex, err := runlease.ExplainSlots(ctx, s, "other", mem)
		require.NoError(t, err)
		assert.Zero(t, ex.Scopes[0].QueueLen, "explanations do not count it")
		assert.Empty(t, ex.Scopes[0].Ahead)
		require.NoError(t, sl.Release(ctx))
		assert.Equal(t, old.json(), get(t, s, legacyKeyOf("mem", "old")), "nothing writes over it")
	})
}

// TestALegacyEntryOfTheRunStillWaits: a run never waits twice across
// versions. A live legacy entry of the run, of another waiting call with
// the same or a newer fence, refuses a wait with RUN-E026 as a place row
// would; one of an older fence, or expired, is taken out by the new place.
func TestALegacyEntryOfTheRunStillWaits(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		now := time.Now()
		mem := []runlease.Scope{runlease.MemScope(1)}
		_, err := runlease.ClaimSlots(ctx, s, "holder", mem)
		require.NoError(t, err)
		live := plantedEntry{Run: "r", Waiter: "w1", Seq: 1, EnqMS: now.UnixMilli() - 1000,
			UntilMS: now.Add(time.Hour).UnixMilli(), Scopes: []string{"mem"}}
		put(t, s, legacyKeyOf("mem", "r"), live.json())
		before := libRows(t, s)

		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second) // a wait that queued would hang
		_, err = runlease.ClaimSlotsWait(rctx, s, "r", mem)
		rcancel()
		require.ErrorIs(t, err, runlease.ErrAlreadyQueued)
		assert.Equal(t, "RUN-E026", runlease.Code(err))
		assert.Equal(t, before, libRows(t, s), "the older version's waiter keeps its place")

		// Expired, it is nobody's: the run queues, and its new place
		// takes the legacy entry out.
		expired := live
		expired.UntilMS = now.Add(-time.Second).UnixMilli()
		cur := live.json()
		ok, err := s.MetaCAS(ctx, legacyKeyOf("mem", "r"), &cur, expired.json())
		require.NoError(t, err)
		require.True(t, ok)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		res := waitInBackground(wctx, s, "r", mem)
		awaitWaiting(t, s, "r", res)
		_, found, err := s.MetaGet(ctx, legacyKeyOf("mem", "r"))
		require.NoError(t, err)
		assert.False(t, found, "the new place took the expired legacy entry out")
	})
}

func TestASecondWaiterOfOneRunIsRefused(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	scopes := []runlease.Scope{runlease.MemScope(1)}
	_, err := runlease.ClaimSlots(t.Context(), s, "x", scopes)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "r", scopes) }()
	awaitQueued(t, s, 1)
	before := libRows(t, s)
	_, err = runlease.ClaimSlotsWait(t.Context(), s, "r", scopes)
	require.ErrorIs(t, err, runlease.ErrAlreadyQueued)
	assert.Equal(t, "RUN-E026", runlease.Code(err))
	var aq *runlease.AlreadyQueuedError
	require.ErrorAs(t, err, &aq)
	assert.Equal(t, runlease.AlreadyQueuedError{RunID: "r", Scope: "mem"}, *aq)
	assert.Equal(t, before, libRows(t, s), "the first waiter's place is untouched")
}

// "A second call waiting for the same run while the first still waits
// fails with ErrAlreadyQueued": a run waits once. A second call that asks
// for fewer units than the first is refused too, though the units the
// first waiter reserved would admit it.
func TestASecondCallOfAWaitingRunIsRefusedEvenForFewerUnits(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	gpu := runlease.NamedScope("gpu", 3)
	_, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{gpu})
	require.NoError(t, err)
	d := startWait(ctx, s, "r", []runlease.Scope{gpu.Take(3)})
	awaitQueued(t, s, 1)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
	defer wcancel()
	_, err = runlease.ClaimSlotsWait(wctx, s, "r", []runlease.Scope{gpu})
	assert.ErrorIs(t, err, runlease.ErrAlreadyQueued, "a second call for a run that waits")
	select {
	case err := <-d:
		t.Fatalf("first waiter returned %v", err)
	default:
	}
}

// "A second waiter for the same run gets RUN-E026, unless it waits
// through a lease with a higher fence (the newer driver takes the older
// one's place)." The newer driver's waiter deletes the older one's entry
// in its place's batch and ranks where that entry was, not as a new entry
// of the principal (from the mark the older place moved, at a new enqueue
// time), which would land it behind every waiter that queued after the
// older one. q queues a millisecond after the run, at the same tag (its
// principal starts at the head): its enqueue time ranks it behind the run.
// In the same millisecond the run id would rank it first
// (TestANewerDriverKeepsTheRankOfAnOlderWaiterThatTied), so the test sets
// the enqueue times with a clock rather than count on the machine's speed.
func TestANewerDriverTakesTheOlderWaitersPlace(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		d := takeOverPlace(t, ctx, s, time.Millisecond)
		require.Equal(t, []string{"r", "q"}, d.before, "q, queued a millisecond after the run, ranks behind it")
		assert.Equal(t, d.oldKey, d.newKey, "the newer driver's waiter ranks where the older one was")
		assert.Equal(t, []string{"r", "q"}, d.after, "the newer driver's waiter is not where the older one was")
		// Displaced, not gone before the newer waiter came: had it left
		// first, there would have been no place to take.
		require.ErrorIs(t, waitErr(t, d.dOld), runlease.ErrAlreadyQueued, "the older driver's waiter finds the newer one in its place")
		require.NoError(t, d.held.Release(ctx))
		select {
		case err := <-d.dNew:
			assert.NoError(t, err, "the run, first in line, is admitted first")
		case err := <-d.dq:
			assert.Fail(t, "q, queued after the run, was admitted first", "%v", err)
		case <-ctx.Done():
			t.Fatal("nobody admitted")
		}
	})
}

// relostPlace runs a waiter of principal "a" on a full mem scope, through
// a store whose writes meet faults in turn: its first place lands, its
// first renewal is refused (the place is lost, its entry and its mark
// left as they were), and the write of its next place meets then. It
// returns the store's rows from before the wait, and the wait's error once
// ctx is cancelled after settle (or once it returned by itself).
func relostPlace(t *testing.T, then testkit.Fault, settle time.Duration) (base *runlease.SQLiteStore, before []runlease.Row, err error) {
	t.Helper()
	base = queueBubbleStore(t)
	f := &testkit.Faulty{Store: base}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err = runlease.ClaimSlots(ctx, base, "holder", []runlease.Scope{runlease.MemScope(1)}, runlease.WithTTL(time.Hour))
	require.NoError(t, err)
	before = libRows(t, base)
	f.Next(testkit.Fault{Apply: true}, testkit.Fault{Err: testkit.NotApplied("MetaBatch")}, then)
	done := make(chan error, 1)
	go func() {
		_, err := runlease.ClaimSlotsWait(ctx, f, "r", []runlease.Scope{runlease.MemScope(1)}, runlease.WithTTL(runlease.MinTTL),
			runlease.WithFairShare("a", 1), runlease.WithWaitPoll(time.Minute))
		done <- err
	}()
	time.Sleep(settle)
	synctest.Wait()
	cancel()
	return base, before, <-done
}

// "A wait that is cancelled or dies gives its share back": also the share
// of a place it lost, when the write of its next place is certainly
// refused by a fault it retries. The place that then lands is charged from
// the mark as it was before the lost one (never admitted), and when the
// wait is cancelled the mark goes back to what it was before it queued,
// not to the lost place's.
func TestAPlaceRetriedAfterAFaultGivesBackTheShareOfALostOne(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		retry := &runlease.StorageError{Op: "MetaBatch", Retryable: true, Err: errors.New("connection refused")}
		s, before, err := relostPlace(t, testkit.Fault{Err: retry}, 3*time.Second)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, before, libRows(t, s), "no mark or other row left behind")
	})
}

// A wait whose next place, after it lost one, is written with an outcome
// it never learns ends with that fault, and gives back the share of both:
// the mark holds the next place's (it landed) or still the lost one's (it
// did not), and either way goes back to what it was before the wait.
func TestAPlaceOfUnknownOutcomeGivesBackTheShareOfALostOne(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s, before, err := relostPlace(t, testkit.Fault{Err: testkit.Unknown("MetaBatch")}, 3*time.Second)
		require.True(t, runlease.IsOutcomeUnknown(err), "the wait ends with the fault: %v", err)
		assert.Equal(t, before, libRows(t, s), "no mark or other row left behind")
	})
}

// markMovedFirst is a store without batches on which another run of the
// principal moves the mark at key, once, just before a waiter's write of
// it: that write is refused, after the writes of the same place before it
// (its entries, its place rows, its mark in an earlier scope) landed.
type markMovedFirst struct {
	runlease.Store
	key, moved string
	once       sync.Once
	// wrote is closed once a write of key by the waiter has landed and
	// its reply is on its way back to the waiter (nil: not told).
	wrote     chan struct{}
	wroteOnce sync.Once
}

func (s *markMovedFirst) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if key == s.key {
		s.once.Do(func() {
			cur, found, err := s.Store.MetaGet(ctx, key)
			var was *string
			if err == nil && found {
				was = &cur
			}
			_, _ = s.Store.MetaCAS(ctx, key, was, s.moved)
		})
	}
	ok, err := s.Store.MetaCAS(ctx, key, expected, value)
	if key == s.key && ok && err == nil && s.wrote != nil {
		s.wroteOnce.Do(func() { close(s.wrote) })
	}
	return ok, err
}

// On a store without batches a place is written row by row, and one
// refused after some of its rows landed has moved the principal's mark in
// the scopes written before: the wait still gives that share back. The
// place is refused in mem, whose mark another run of the principal moved;
// when the wait is cancelled, gpu's mark goes back to what it was before
// the wait (mem's stays the other run's).
func TestAPlaceRefusedPartwayOnAStoreWithoutBatchesGivesItsShareBack(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	gpu, mem := runlease.NamedScope("gpu", 1), runlease.MemScope(1)
	_, err := runlease.ClaimSlots(ctx, base, "holder", []runlease.Scope{gpu, mem}, runlease.WithTTL(time.Hour))
	require.NoError(t, err)
	moved := `{"finish":5000000,"until_ms":` + strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + `}`
	s := &markMovedFirst{Store: testkit.PlainStore{Store: base}, key: runlease.FairPrefix + "3:mem:a", moved: moved,
		wrote: make(chan struct{})}
	res := waitInBackground(ctx, s, "r", []runlease.Scope{gpu, mem}, runlease.WithFairShare("a", 1))
	awaitWaiting(t, base, "r", res)
	// The place after the refused one moved mem's mark on, and the waiter
	// is told so. (Cancelled while that write's reply is on its way, the
	// wait would count the mark as not written, and leave the share
	// charged: a write in doubt on a store without batches ranks no run
	// ahead of its turn, so the library does not move it back.)
	select {
	case <-s.wrote:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter never moved mem's mark on")
	}
	cancel()
	require.ErrorIs(t, (<-res).err, context.Canceled)
	_, found, err := base.MetaGet(t.Context(), runlease.FairPrefix+"3:gpu:a")
	require.NoError(t, err)
	assert.False(t, found, "gpu's mark is back to what it was before the wait (absent)")
	assert.Equal(t, moved, get(t, base, runlease.FairPrefix+"3:mem:a"), "mem's is the other run's")
	assert.Empty(t, queueRows(t, base), "no entry left behind")
}

// A mark row names no writer: two runs of a principal that queue at the
// same instant, from the same mark, for the same units, send the same
// mark. When one's place is written with an outcome it never learns, and
// did not land, while the other's landed, the first's wait gives back no
// share on leaving: the mark there is the other run's, which still waits,
// and moving it back would let the principal's next run share its tag.
func TestAPlaceOfUnknownOutcomeGivesBackNoShareItDidNotTake(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		base := queueBubbleStore(t)
		f := &testkit.Faulty{Store: base}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		mem := []runlease.Scope{runlease.MemScope(1)}
		_, err := runlease.ClaimSlots(ctx, base, "holder", mem, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		opts := []runlease.Option{runlease.WithFairShare("a", 1), runlease.WithWaitPoll(time.Minute)}
		mk := runlease.FairPrefix + "3:mem:a"
		yDone := make(chan error, 1)
		// x's place does not land, and before its reply y, of the same
		// principal, queues from the same mark.
		f.Next(testkit.Fault{Err: testkit.Unknown("MetaBatch"), Then: func() {
			go func() { _, err := runlease.ClaimSlotsWait(ctx, base, "y", mem, opts...); yDone <- err }()
			synctest.Wait()
		}})
		_, err = runlease.ClaimSlotsWait(ctx, f, "x", mem, opts...)
		require.True(t, runlease.IsOutcomeUnknown(err), "x ends with the fault: %v", err)
		synctest.Wait()
		require.Len(t, lineRowsOf(t, base, "mem", "y"), 1, "y waits")
		_, found, err := base.MetaGet(ctx, mk)
		require.NoError(t, err)
		assert.True(t, found, "y's mark stays while y waits")
		cancel()
		<-yDone
	})
}
