package runlease

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readlessStore is a SQLite store whose MetaDeleteNotifyRanges never
// returns its reads: rows is nil, as the DeleteReadNotifier contract
// allows "when they were not made or failed" (the reads are a hint). A
// decorator that traces or injects faults, or a built-in store whose
// reads fail after the delete (its context ending between the two), does
// the same.
type readlessStore struct {
	*SQLiteStore
}

func (s *readlessStore) MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []Range) (bool, [][]Row, error) {
	deleted, _, err := s.SQLiteStore.MetaDeleteNotifyRanges(ctx, key, expected, wakeKey, tag, ranges)
	return deleted, nil, err
}

// TestAReleaseThatDeletedNothingAndReadNothingRecordsNoRead: a release
// whose delete found its row changed (deleted false) and whose reads were
// not returned (rows nil, which the contract allows) must not leave the
// room a "latest scan" that holds no rows at all: a waiter woken without
// a ring (here, by a member whose scope asks a deeper head, joinRoom)
// would decide on it, find its own entry missing from a line read to its
// end, and give its place up.
func TestAReleaseThatDeletedNothingAndReadNothingRecordsNoRead(t *testing.T) {
	s := &readlessStore{SQLiteStore: roomSQLite(t)}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	sc := []Scope{NamedScope("gpu", 1)}
	held, err := ClaimSlots(ctx, s, "holder", sc, WithTTL(time.Minute))
	require.NoError(t, err)
	var requeued atomic.Int64
	hooks := WithHooks(Hooks{SlotsRequeued: func(ev RequeueEvent) {
		requeued.Add(1)
		t.Logf("requeued %s: %s", ev.RunID, ev.Reason)
	}})
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer wcancel()
	for i, run := range []string{"x", "w"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = ClaimSlotsWait(wctx, s, run, sc, WithTTL(time.Minute), WithWaitPoll(time.Minute), hooks)
		}()
		asleepInRoom(t, s, "gpu", i+1)
	}
	r := roomOf(s, "gpu")
	require.NotNil(t, r)

	// A release of the process whose row was taken over meanwhile: the
	// delete finds another row there.
	key := held.held[0].key
	deleted, err := r.handOver(ctx, s, key, "a row this slot no longer holds")
	require.NoError(t, err)
	require.False(t, deleted)
	r.mu.Lock()
	if r.last != nil {
		assert.NotEmpty(t, r.last.raw.slots, "the room's latest scan shows the held slot")
	}
	r.mu.Unlock()

	// A waiter of a deeper scope joins: the room wakes its first members,
	// without a ring.
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = ClaimSlotsWait(wctx, s, "z", []Scope{NamedScope("gpu", 3)}, WithTTL(time.Minute), WithWaitPoll(time.Minute))
	}()
	time.Sleep(500 * time.Millisecond)
	assert.Zero(t, requeued.Load(), "no waiter lost its place: nothing changed in the queue")
	require.NoError(t, held.Release(ctx))
}

// TestHandOversNeverAdmitOverTheLimitNorLoseAWakeUp: runs of one process
// take turns on a scope through hand-overs, with a poll far longer than
// the test: every admission is bounded by the limit, and every release
// lets the next run in without a poll.
func TestHandOversNeverAdmitOverTheLimitNorLoseAWakeUp(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			s := &handCounter{SQLiteStore: roomSQLite(t)}
			handOverStress(t, []Store{s}, limit, 8, 3)
			assert.Positive(t, s.hands.Load(), "releases handed their reads over")
		})
	}
}

// TestHandOversAcrossTwoStoreValuesOfOneDatabase: two Store values of one
// SQLite store make two rooms in one process; a release through one hands
// its read to its own room only, and its tagged wake-up is a ring in the
// other. Runs of both take turns without a poll and within the limit.
func TestHandOversAcrossTwoStoreValuesOfOneDatabase(t *testing.T) {
	t.Parallel()
	inner := roomSQLite(t)
	a, b := &handCounter{SQLiteStore: inner}, &handCounter{SQLiteStore: inner}
	handOverStress(t, []Store{a, b}, 2, 8, 3)
	assert.Positive(t, a.hands.Load()+b.hands.Load(), "releases handed their reads over")
}

// handOverStress runs runs waiters of one process on scope "gpu" of
// limit, spread over stores (all of one database), each admitted rounds
// times, holding a moment, and checks the limit and that the whole takes
// far less than a poll.
func handOverStress(t *testing.T, stores []Store, limit, runs, rounds int) {
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	sc := []Scope{NamedScope("gpu", limit)}
	// Every run first queues behind a holder of the whole scope: a release
	// hands over only to a room where a member holds a place, and runs
	// that never found the scope full would never have one.
	holder, err := ClaimSlots(ctx, stores[0], "holder", []Scope{sc[0].Take(limit)}, WithTTL(time.Minute))
	require.NoError(t, err)
	var in, peak atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	start := time.Now()
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range rounds {
				s := stores[(i+j)%len(stores)]
				held, err := ClaimSlotsWait(ctx, s, fmt.Sprintf("run-%d-%d", i, j), sc,
					WithTTL(time.Minute), WithWaitPoll(time.Minute))
				if err != nil {
					errs <- err
					return
				}
				n := in.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				time.Sleep(time.Millisecond)
				in.Add(-1)
				if err := held.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	require.Eventually(t, func() bool {
		placed := 0
		for _, s := range stores {
			if r := roomOf(s, "gpu"); r != nil {
				r.mu.Lock()
				placed += len(r.placed)
				r.mu.Unlock()
			}
		}
		return placed == runs
	}, 30*time.Second, time.Millisecond, "every run queues behind the holder")
	require.NoError(t, holder.Release(ctx))
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, peak.Load(), int64(limit))
	assert.Less(t, time.Since(start), 30*time.Second, "no admission waited for a poll")
}

// TestHandOversAdmitInQueueOrder: waiters of one principal, queued one
// after another behind a holder, are admitted in the order they queued
// while each admitted run's release hands its read to the rest.
func TestHandOversAdmitInQueueOrder(t *testing.T) {
	t.Parallel()
	s := &handCounter{SQLiteStore: roomSQLite(t)}
	handOverOrder(t, []Store{s}, 6)
	assert.Positive(t, s.hands.Load())
}

// TestHandOversAdmitInQueueOrderAcrossStoreValues: as above, the waiters
// spread over two Store values of one database (two rooms), the holder's
// release through the room of the second waiter.
func TestHandOversAdmitInQueueOrderAcrossStoreValues(t *testing.T) {
	t.Parallel()
	inner := roomSQLite(t)
	a, b := &handCounter{SQLiteStore: inner}, &handCounter{SQLiteStore: inner}
	handOverOrder(t, []Store{b, a}, 6)
	assert.Positive(t, a.hands.Load()+b.hands.Load())
}

// handOverOrder queues n waiters, the i-th through stores[i%len], behind
// a holder of stores[len-1], and checks they are admitted in order.
func handOverOrder(t *testing.T, stores []Store, n int) {
	s := stores[len(stores)-1]
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	sc := []Scope{NamedScope("gpu", 1)}
	held, err := ClaimSlots(ctx, s, "holder", sc, WithTTL(time.Minute))
	require.NoError(t, err)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := ClaimSlotsWait(ctx, stores[i%len(stores)], fmt.Sprintf("run-%d", i), sc, WithTTL(time.Minute), WithWaitPoll(time.Minute))
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			errs <- h.Release(ctx)
		}()
		asleepInRoom(t, stores[i%len(stores)], "gpu", i/len(stores)+1)
	}
	require.NoError(t, held.Release(ctx))
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	assert.Equal(t, want, order, "admitted in the order they queued")
}

// faultyHands is a SQLite store whose hand-overs meet what the
// DeleteReadNotifier contract allows: reads that come back as nil after
// the delete, and a delete that applied but whose outcome is reported
// unknown (its wake-up sent).
type faultyHands struct {
	*SQLiteStore
	n atomic.Int64
}

func (s *faultyHands) MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []Range) (bool, [][]Row, error) {
	deleted, rows, err := s.SQLiteStore.MetaDeleteNotifyRanges(ctx, key, expected, wakeKey, tag, ranges)
	switch s.n.Add(1) % 5 {
	case 1:
		return deleted, nil, err
	case 3:
		if err == nil && deleted {
			return false, nil, &StorageError{Op: "MetaDeleteNotifyRanges", Key: key, Unknown: true, Err: context.DeadlineExceeded}
		}
	}
	return deleted, rows, err
}

// TestHandOversThatFailTheirReadsOrLoseTheirOutcomeStillWake: releases
// whose reads fail, or whose outcome is unknown, ring; no waiter waits for
// a poll and the limit holds.
func TestHandOversThatFailTheirReadsOrLoseTheirOutcomeStillWake(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			s := &faultyHands{SQLiteStore: roomSQLite(t)}
			handOverStress(t, []Store{s}, limit, 8, 3)
			assert.Positive(t, s.n.Load())
		})
	}
}
