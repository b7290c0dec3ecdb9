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
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// The promises of the line that hold only at its edges: a place beyond
// the head read, a place row another call took, a delete or a renewal
// that does not land.

// plantAhead writes n live entries of other runs at the front of scope's
// line (tag 0, enqueued an hour ago), each with its place row, so that a
// run that queues now lies behind them.
func plantAhead(t *testing.T, s runlease.Store, scope string, n int) {
	t.Helper()
	now := time.Now()
	for i := range n {
		plant(t, s, plantedEntry{Run: "ahead" + strconv.Itoa(i), Waiter: "a" + strconv.Itoa(i), Seq: 1,
			EnqMS: now.Add(-time.Hour).UnixMilli() + int64(i), UntilMS: now.Add(time.Hour).UnixMilli(),
			Scopes: []string{scope}})
	}
}

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

// deletesOfLineFail fails every delete of a line entry, as a store that
// goes down while a waiter leaves would.
type deletesOfLineFail struct{ *runlease.SQLiteStore }

var errDown = errors.New("the store is down")

func (d *deletesOfLineFail) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if strings.HasPrefix(key, runlease.QueuePrefix) {
		return false, &runlease.StorageError{Op: "MetaDelete", Key: key, Retryable: true, Err: errDown}
	}
	return d.SQLiteStore.MetaDelete(ctx, key, expected)
}

func (d *deletesOfLineFail) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	if strings.HasPrefix(key, runlease.QueuePrefix) {
		return false, &runlease.StorageError{Op: "MetaDelete", Key: key, Retryable: true, Err: errDown}
	}
	return d.SQLiteStore.MetaDeleteNotify(ctx, key, expected, wakeKey)
}

func (d *deletesOfLineFail) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	for _, op := range ops {
		if strings.HasPrefix(op.Key, runlease.QueuePrefix) && op.Delete {
			return false, &runlease.StorageError{Op: "MetaBatch", Key: op.Key, Retryable: true, Err: errDown}
		}
	}
	return d.SQLiteStore.MetaBatch(ctx, conds, ops)
}

// TestALeaveWhoseEntryStaysKeepsTheMark: a waiter of principal A leaves
// (its context ends) while the store refuses to delete its entry. The
// entry still ranks at its tag until it expires, so the share its place
// took of A's mark is not given back: A's next run ranks after it, not at
// the same tag.
func TestALeaveWhoseEntryStaysKeepsTheMark(t *testing.T) {
	t.Parallel()
	ctx, base := t.Context(), newSQLite(t)
	s := &deletesOfLineFail{base}
	scopes := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	_, err := runlease.ClaimSlots(ctx, base, "holder", scopes)
	require.NoError(t, err)
	mark := runlease.FairPrefix + scopeSeg("gpu") + ":A"
	wctx, cancel := context.WithCancel(ctx)
	res := waitInBackground(wctx, s, "r", scopes, runlease.WithFairShare("A", 1))
	awaitWaiting(t, base, "r", res)
	moved := get(t, base, mark)
	require.Contains(t, moved, `"finish":1000000,`)
	cancel()
	require.ErrorIs(t, (<-res).err, context.Canceled)
	left := lineRowOf(t, base, "gpu", "r") // the delete did not land
	assert.Equal(t, moved, get(t, base, mark), "the mark stays where the leftover entry finishes")

	// A's next run ranks behind the leftover, not at its tag.
	wctx, cancel = context.WithCancel(ctx)
	defer cancel()
	res = waitInBackground(wctx, base, "r2", scopes, runlease.WithFairShare("A", 1))
	awaitWaiting(t, base, "r2", res)
	var e1, e2 map[string]any
	require.NoError(t, json.Unmarshal([]byte(left.Value), &e1))
	require.NoError(t, json.Unmarshal([]byte(lineRowOf(t, base, "gpu", "r2").Value), &e2))
	assert.Greater(t, e2["tag"], e1["tag"], "the next run of A takes a tag of its own")
	cancel()
	<-res
}

// renewalsOfLineRefused refuses (swapped false, no error) the first
// batched renewal of a line entry, as if the row had changed under it,
// and sends nothing: the entry stays as it was, live.
type renewalsOfLineRefused struct {
	*runlease.SQLiteStore
	refused atomic.Bool
}

func (r *renewalsOfLineRefused) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	for _, w := range writes {
		if strings.HasPrefix(w.Key, runlease.QueuePrefix) && r.refused.CompareAndSwap(false, true) {
			return make([]bool, len(writes)), nil
		}
	}
	return r.SQLiteStore.MetaCASMany(ctx, writes)
}

// TestANewPlaceIsNotChargedFromBeforeALeftoverBeyondTheHead: a waiter of
// principal A lies beyond the head of the line (three live waiters ahead,
// limit 1); its renewal is refused, so it gives its place up and takes a
// new one, while its old entry stays in the line, beyond the head read,
// at its tag. The mark still says where that entry finishes: the new
// place is charged from it, not from before the lost place, so the run's
// two entries never share a tag.
func TestANewPlaceIsNotChargedFromBeforeALeftoverBeyondTheHead(t *testing.T) {
	t.Parallel()
	ctx, base := t.Context(), newSQLite(t)
	s := &renewalsOfLineRefused{SQLiteStore: base}
	scopes := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	_, err := runlease.ClaimSlots(ctx, base, "holder", scopes)
	require.NoError(t, err)
	plantAhead(t, base, "gpu", 3)
	requeued := make(chan runlease.RequeueEvent, 4)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := waitInBackground(wctx, s, "r", scopes, runlease.WithFairShare("A", 1), runlease.WithTTL(runlease.MinTTL),
		runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }}))
	awaitWaiting(t, base, "r", res)
	first := lineRowOf(t, base, "gpu", "r")
	select {
	case <-requeued:
	case <-time.After(10 * time.Second):
		t.Fatal("the refused renewal did not give the place up")
	}
	var rows []runlease.Row
	require.Eventually(t, func() bool { rows = lineRowsOf(t, base, "gpu", "r"); return len(rows) == 2 },
		10*time.Second, time.Millisecond, "the new place, beside the leftover")
	tags := map[float64]bool{}
	for _, r := range rows {
		var e map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.Value), &e))
		tags[e["tag"].(float64)] = true
	}
	assert.Len(t, tags, 2, "the new place and the leftover %s share a tag", first.Key)
	cancel()
	<-res
}
