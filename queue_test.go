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

// queueRows returns the rows of every queue.
func queueRows(t *testing.T, s runlease.Store) []runlease.Row {
	t.Helper()
	r, err := s.MetaScan(context.Background(), runlease.QueuePrefix)
	require.NoError(t, err)
	return r
}

// libRows returns the rows of the store but the marks a Postgres store
// keeps of the keys its subscribers wait on (runwait:), which come and go
// with the waiters' subscriptions, not with their claims.
func libRows(t *testing.T, s runlease.Store) []runlease.Row {
	t.Helper()
	var out []runlease.Row
	for _, r := range rows(t, s) {
		if !strings.HasPrefix(r.Key, runlease.WaitPrefix) {
			out = append(out, r)
		}
	}
	return out
}

// awaitQueued waits until the queues hold n rows in all.
func awaitQueued(t *testing.T, s runlease.Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(queueRows(t, s)) == n }, 20*time.Second, time.Millisecond,
		"the queues never held %d rows", n)
}

// admissions records the order in which waiters were admitted.
type admissions struct {
	mu    sync.Mutex
	order []string
}

func (a *admissions) add(run string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.order = append(a.order, run)
}

func (a *admissions) get() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.order...)
}

// waitAndRelease starts a waiter that, once admitted, records its run and
// releases its slots at once, so that the next waiter can be admitted.
func waitAndRelease(t *testing.T, wg *sync.WaitGroup, s runlease.Store, run string, scopes []runlease.Scope, got *admissions, opts ...runlease.Option) {
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sl, err := runlease.ClaimSlotsWait(ctx, s, run, scopes, opts...)
		if !assert.NoError(t, err, run) {
			return
		}
		got.add(run)
		assert.NoError(t, sl.Release(ctx))
	})
}

func TestClaimSlotsWaitIsWokenByARelease(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		scopes := []runlease.Scope{runlease.MemScope(1)}
		held, err := runlease.ClaimSlots(ctx, s, "holder", scopes)
		require.NoError(t, err)

		// A poll of an hour: only the release's wake-up can admit it in
		// the test's lifetime.
		done := make(chan error, 1)
		go func() {
			sl, err := runlease.ClaimSlotsWait(ctx, s, "waiter", scopes, runlease.WithWaitPoll(time.Hour))
			if err == nil {
				assert.Equal(t, "waiter", sl.Held()[0].RunID)
			}
			done <- err
		}()
		awaitQueued(t, s, 1)
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(queueRows(t, s)[0].Value), &entry))
		assert.Equal(t, "waiter", entry["run"])
		// Its entry is in the scope's line, and its place row says so.
		assert.Equal(t, lineRowOf(t, s, "mem", "waiter").Key, queueRows(t, s)[0].Key)
		assert.Contains(t, get(t, s, placeKeyOf("mem", "waiter")), `"key":"`+queueRows(t, s)[0].Key+`"`)

		require.NoError(t, held.Release(ctx))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("the waiter was not woken by the release")
		}
		assert.Empty(t, queueRows(t, s), "an admitted waiter leaves the queue")
		_, found, err := s.MetaGet(ctx, placeKeyOf("mem", "waiter"))
		require.NoError(t, err)
		assert.False(t, found, "and its place row")
		occ, err := runlease.Occupancy(ctx, s)
		require.NoError(t, err)
		require.Len(t, occ, 1)
		assert.Equal(t, "waiter", occ[0].RunID)
	})
}

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

func TestClaimSlotsWaitAdmitsAtOnceWithoutQueueing(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	cb := testkit.NewCountingBatcher(s)
	sl, err := runlease.ClaimSlotsWait(t.Context(), cb, "r", []runlease.Scope{runlease.MemScope(2), runlease.NamedScope("gpu", 8).Take(3)})
	require.NoError(t, err)
	assert.Len(t, sl.Held(), 4, "one mem slot and three gpu slots")
	// The store reads ranges (RangeReader): both scopes' slot rows, the
	// heads of their lines, their clocks and the run's own rows travel in
	// one call.
	assert.Equal(t, int64(1), cb.Scans.Load(), "one read for both scopes")
	assert.Equal(t, int64(1), cb.Batches.Load(), "every slot in one batch")
	assert.Zero(t, cb.CASes.Load(), "no queue entry written for a run admitted at once")
	assert.Empty(t, queueRows(t, s))
	for _, r := range libRows(t, s) {
		assert.False(t, strings.HasPrefix(r.Key, runlease.PlacePrefix), "no place row: %s", r.Key)
	}
}

func TestWaitersAreAdmittedByFairShareThenInQueueOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		weightB int
		want    []string
	}{
		{"equal_weights", 1, []string{"a1", "b1", "a2", "b2", "a3", "b3", "a4", "a5"}},
		{"b_weighs_twice", 2, []string{"a1", "b1", "b2", "a2", "b3", "a3", "a4", "a5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Principal a queues five runs first, then b three: b's first
			// run must not wait behind all of a's.
			var runs []queuedRun
			for i := 1; i <= 5; i++ {
				runs = append(runs, queuedRun{"a" + strconv.Itoa(i), []runlease.Option{runlease.WithFairShare("a", 1)}})
			}
			for i := 1; i <= 3; i++ {
				runs = append(runs, queuedRun{"b" + strconv.Itoa(i), []runlease.Option{runlease.WithFairShare("b", tc.weightB)}})
			}
			assert.Equal(t, tc.want, admissionOrder(t, runs))
		})
	}
}

func TestHigherPriorityIsAdmittedFirst(t *testing.T) {
	t.Parallel()
	var runs []queuedRun
	for i, p := range []int{0, 0, 5, -1, 5} {
		runs = append(runs, queuedRun{"r" + strconv.Itoa(i) + "p" + strconv.Itoa(p), []runlease.Option{runlease.WithPriority(p)}})
	}
	assert.Equal(t, []string{"r2p5", "r4p5", "r0p0", "r1p0", "r3p-1"}, admissionOrder(t, runs))
}

// queuedRun is a run that queues, and the options it claims with.
type queuedRun struct {
	run  string
	opts []runlease.Option
}

// admissionOrder queues runs one after another on the only slot of a
// scope that another run holds, each once the one before is in the queue,
// then releases the slot and returns the order in which they were
// admitted (each releases at once, letting the next in).
func admissionOrder(t *testing.T, runs []queuedRun) []string {
	t.Helper()
	s := newSQLite(t)
	scopes := []runlease.Scope{runlease.MemScope(1)}
	held, err := runlease.ClaimSlots(t.Context(), s, "x", scopes)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var got admissions
	for i, r := range runs {
		waitAndRelease(t, &wg, s, r.run, scopes, &got, r.opts...)
		awaitQueued(t, s, i+1)
	}
	require.NoError(t, held.Release(t.Context()))
	wg.Wait()
	return got.get()
}

func TestAPlainClaimDoesNotJumpTheQueue(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		gpu := runlease.NamedScope("gpu", 2)
		_, err := runlease.ClaimSlots(ctx, s, "one", []runlease.Scope{gpu})
		require.NoError(t, err)
		// A run that needs both units waits: one is free, and it reserves
		// it.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { _, _ = runlease.ClaimSlotsWait(wctx, s, "heavy", []runlease.Scope{gpu.Take(2)}) }()
		awaitQueued(t, s, 1)

		before := libRows(t, s)
		_, err = runlease.ClaimSlots(ctx, s, "jumper", []runlease.Scope{gpu})
		var limit *runlease.ConcurrencyLimitError
		require.ErrorAs(t, err, &limit)
		assert.Equal(t, runlease.ConcurrencyLimitError{Scope: "gpu", Limit: 2, Units: 1, Held: 1, Ahead: 1, Reserved: 2}, *limit)
		assert.Contains(t, err.Error(), "the run would have to queue")
		assert.Equal(t, before, libRows(t, s), "a refusal writes nothing")

		// A higher priority ranks ahead of the waiter and may take it.
		sl, err := runlease.ClaimSlots(ctx, s, "urgent", []runlease.Scope{gpu}, runlease.WithPriority(1))
		require.NoError(t, err)
		assert.Len(t, sl.Held(), 1)
	})
}

func TestAHeavyWaiterIsNotStarvedByLightClaims(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		gpu := runlease.NamedScope("gpu", 3)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		// Light claimants keep one unit each busy and claim again at once,
		// so at no moment are all three units free unless they wait.
		var light atomic.Int64
		var wg sync.WaitGroup
		for w := range 3 {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					sl, err := runlease.ClaimSlotsWait(ctx, s, "light-"+strconv.Itoa(w)+"-"+strconv.Itoa(i), []runlease.Scope{gpu})
					if err != nil {
						return
					}
					light.Add(1)
					time.Sleep(2 * time.Millisecond)
					_ = sl.Release(context.Background())
				}
			})
		}
		require.Eventually(t, func() bool { return light.Load() > 20 }, 20*time.Second, time.Millisecond)
		hctx, hcancel := context.WithTimeout(ctx, 30*time.Second)
		defer hcancel()
		sl, err := runlease.ClaimSlotsWait(hctx, s, "heavy", []runlease.Scope{gpu.Take(3)})
		require.NoError(t, err, "the heavy run must be admitted while light ones keep coming")
		assert.Len(t, sl.Held(), 3)
		require.NoError(t, sl.Release(ctx))
		cancel()
		wg.Wait()
	})
}

func TestWeightedClaimsNeverExceedTheLimit(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		const limit = 5
		scope := runlease.NamedScope("pool", limit)
		var used, peak atomic.Int64
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Go(func() {
				for i := range 12 {
					units := 1 + (w+i)%3
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					sl, err := runlease.ClaimSlotsWait(ctx, s, "w"+strconv.Itoa(w)+"-"+strconv.Itoa(i),
						[]runlease.Scope{scope.Take(units)}, runlease.WithFairShare("p"+strconv.Itoa(w%3), 1+w%2))
					if !assert.NoError(t, err) {
						cancel()
						return
					}
					assert.Len(t, sl.Held(), units)
					n := used.Add(int64(units))
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					used.Add(-int64(units)) // stop counting before the release can let another in
					assert.NoError(t, sl.Release(ctx))
					cancel()
				}
			})
		}
		wg.Wait()
		assert.LessOrEqual(t, peak.Load(), int64(limit), "more units held than the limit")
		assert.Positive(t, peak.Load())
		assert.Empty(t, queueRows(t, s))
		occ, err := runlease.Occupancy(t.Context(), s)
		require.NoError(t, err)
		assert.Empty(t, occ)
	})
}

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

func TestAStalledWaiterQueuesAgainAtTheBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s, clk := bubbleStore(t), testkit.NewClock(epoch)
		requeued := make(chan runlease.RequeueEvent, 4)
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now),
			runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }})}
		scopes := []runlease.Scope{runlease.MemScope(1)}
		_, err := runlease.ClaimSlots(t.Context(), s, "x", scopes, runlease.WithTTL(time.Hour), runlease.WithClock(clk.Now))
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		// The first waiter looks again only when its entry is due for
		// renewal (a third of the TTL), as a paused process would.
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, s, "first", scopes, append(opts, runlease.WithWaitPoll(time.Hour))...)
		}()
		synctest.Wait()
		require.Len(t, queueRows(t, s), 1)
		first := queueRows(t, s)[0].Value

		// Its entry expires on the store's clock as if its process had
		// paused; another run queues meanwhile and is now ahead.
		clk.Advance(6 * time.Second)
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, s, "second", scopes, append(opts, runlease.WithWaitPoll(time.Hour))...)
		}()
		synctest.Wait()
		lineRowOf(t, s, "mem", "second")
		time.Sleep(runlease.MinTTL / 3) // the first waiter's renewal is due
		synctest.Wait()
		require.Len(t, requeued, 1, "the stalled waiter is told it lost its place")
		e := <-requeued
		assert.Equal(t, "first", e.RunID)
		assert.Equal(t, []string{"mem"}, e.Scopes)
		r := queueRows(t, s)
		require.Len(t, r, 2)
		assert.NotEqual(t, first, lineRowOf(t, s, "mem", "first").Value)
		a, b := lineEntry(t, s, "mem", "first"), lineEntry(t, s, "mem", "second")
		assert.Greater(t, a["tag"], b["tag"], "it queued again behind the run that came meanwhile")
		_, firstRun, _ := parseLine(r[0].Key)
		assert.Equal(t, "second", firstRun, "the line's order says so too")
		cancel()
		synctest.Wait()
	})
}

// gatedStore is a SQLite store whose reads and renewals can be held up, as
// a process paused mid-wait is; with writesPass, only its reads are.
type gatedStore struct {
	*runlease.SQLiteStore
	writesPass bool
	mu         sync.Mutex
	gate       chan struct{} // nil: reads pass
	refused    atomic.Int64  // batches whose conditions did not hold
}

func (g *gatedStore) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	ok, err := g.SQLiteStore.MetaBatch(ctx, conds, ops)
	if err == nil && !ok {
		g.refused.Add(1)
	}
	return ok, err
}

func (g *gatedStore) hold() { g.mu.Lock(); g.gate = make(chan struct{}); g.mu.Unlock() }

func (g *gatedStore) open() { g.mu.Lock(); close(g.gate); g.gate = nil; g.mu.Unlock() }

func (g *gatedStore) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return g.SQLiteStore.MetaScanMany(ctx, prefixes)
}

// MetaRanges, how a waiter reads the scopes it waits for, is held up as
// MetaScanMany is.
func (g *gatedStore) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return g.SQLiteStore.MetaRanges(ctx, ranges)
}

// MetaCASMany, the entries' renewal, is held up too, until the gate opens
// or its context ends.
func (g *gatedStore) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil && !g.writesPass {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, &runlease.StorageError{Op: "MetaCASMany", Err: ctx.Err(), Unknown: true}
		}
	}
	return g.SQLiteStore.MetaCASMany(ctx, writes)
}

func TestAWaiterStalledPastItsTTLGivesUpAPlaceTheStoreStillShows(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// The store's clock stands still, so the entry looks live to
		// everyone; the waiter's own clock says it went unrenewed for
		// longer than its TTL less the margin, so others may have judged
		// it expired meanwhile: it must not renew the place as if nothing
		// happened.
		g, clk := &gatedStore{SQLiteStore: bubbleStore(t)}, testkit.NewClock(epoch)
		requeued := make(chan runlease.RequeueEvent, 4)
		scopes := []runlease.Scope{runlease.MemScope(1)}
		_, err := runlease.ClaimSlots(t.Context(), g, "x", scopes, runlease.WithTTL(time.Hour), runlease.WithClock(clk.Now))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, g, "r", scopes, runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now),
				runlease.WithWaitPoll(time.Hour),
				runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }}))
		}()
		synctest.Wait()
		placed := lineRowOf(t, g, "mem", "r").Value

		g.hold()
		time.Sleep(runlease.MinTTL + time.Second) // its renewal hangs meanwhile
		g.open()
		synctest.Wait()
		require.Len(t, requeued, 1)
		e := <-requeued
		assert.Equal(t, "the waiter stalled past its TTL", e.Reason)
		var was, now map[string]any
		require.NoError(t, json.Unmarshal([]byte(placed), &was))
		require.NoError(t, json.Unmarshal([]byte(lineRowOf(t, g, "mem", "r").Value), &now))
		assert.Equal(t, was["waiter"], now["waiter"], "the same waiter")
		assert.Greater(t, now["seq"], was["seq"], "wrote a new place")
		cancel()
		synctest.Wait()
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

func TestQueueBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx := t.Context()
	mem := runlease.MemScope(4)
	for name, call := range map[string]func() error{
		"zero units": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem.Take(0)})
			return err
		},
		"units over": func() error { _, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{mem.Take(5)}); return err },
		"weight 0": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem}, runlease.WithFairShare("p", 0))
			return err
		},
		"weight too big": func() error {
			_, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{mem}, runlease.WithFairShare("p", runlease.MaxWeight+1))
			return err
		},
		"principal NUL": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem}, runlease.WithFairShare("a\x00", 1))
			return err
		},
		"priority": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem}, runlease.WithPriority(runlease.MaxPriority+1))
			return err
		},
		"poll": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem}, runlease.WithWaitPoll(time.Nanosecond))
			return err
		},
		"empty run": func() error { _, err := runlease.ClaimSlotsWait(ctx, s, "", []runlease.Scope{mem}); return err },
		"run too long": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, strings.Repeat("r", 1020), []runlease.Scope{mem})
			return err
		},
		"poll on a claim": func() error {
			_, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{mem}, runlease.WithWaitPoll(time.Second))
			return err
		},
	} {
		err := call()
		assert.ErrorIs(t, err, runlease.ErrInvalidArgument, name)
	}
	assert.Empty(t, libRows(t, s))

	// A place row that does not parse is never written over: its run
	// cannot wait in the scope (its place would be written there), and
	// the wait says which row it is.
	put(t, s, placeKeyOf("mem", "bad"), `{"waiter":`)
	_, err := runlease.ClaimSlotsWait(ctx, s, "bad", []runlease.Scope{mem})
	var corrupt *runlease.CorruptRowError
	require.ErrorAs(t, err, &corrupt)
	assert.Equal(t, placeKeyOf("mem", "bad"), corrupt.Key)
	assert.Equal(t, []runlease.Row{{Key: placeKeyOf("mem", "bad"), Value: `{"waiter":`}}, libRows(t, s))
}

func TestQueueKeysOfColonNamesDoNotCollide(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// "principal:a" with run "b:x" and "principal:a:b" with run "x" would
	// share a key without the length of the scope's name in it.
	sa, sb := runlease.PrincipalScope("a", 1), runlease.PrincipalScope("a:b", 1)
	_, err := runlease.ClaimSlots(ctx, s, "h1", []runlease.Scope{sa})
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(ctx, s, "h2", []runlease.Scope{sb})
	require.NoError(t, err)
	go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "b:x", []runlease.Scope{sa}) }()
	go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "x", []runlease.Scope{sb}) }()
	awaitQueued(t, s, 2)
	var got []string
	for _, r := range queueRows(t, s) {
		scope, run, ok := parseLine(r.Key)
		require.True(t, ok, r.Key)
		got = append(got, scope+" "+run)
	}
	assert.ElementsMatch(t, []string{"principal:a b:x", "principal:a:b x"}, got, "each entry parses back to its own scope and run")
	// The place rows hold no rank between scope and run: without the
	// length of the scope's name both would be runplace:principal:a:b:x.
	assert.Contains(t, get(t, s, "runplace:11:principal:a:b:x"), `"key":"runline:11:principal:a:`)
	assert.Contains(t, get(t, s, "runplace:13:principal:a:b:x"), `"key":"runline:13:principal:a:b:`)
}

func TestLeaseClaimSlotsWaitIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		clk := testkit.NewClock(time.Now().UTC())
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
		scopes := []runlease.Scope{runlease.MemScope(1)}
		held, err := runlease.ClaimSlots(ctx, s, "x", scopes, runlease.WithTTL(time.Hour), runlease.WithClock(clk.Now))
		require.NoError(t, err)
		old, err := runlease.Acquire(ctx, s, "r", "A", opts...)
		require.NoError(t, err)

		done := make(chan error, 1)
		go func() {
			_, err := old.ClaimSlotsWait(ctx, scopes, runlease.WithWaitPoll(runlease.MinWaitPoll))
			done <- err
		}()
		awaitQueued(t, s, 1)
		// The lease expires and another driver takes the run over; the
		// old driver's waiter must be admitted nowhere.
		clk.Advance(runlease.MinTTL + time.Second)
		newer, err := runlease.Acquire(ctx, s, "r", "B", opts...)
		require.NoError(t, err)
		require.NoError(t, held.Release(ctx))
		err = <-done
		require.ErrorIs(t, err, runlease.ErrLeaseLost)
		occ, err := runlease.Occupancy(ctx, s)
		require.NoError(t, err)
		assert.Empty(t, occ, "no slot taken by the superseded driver")
		assert.Empty(t, queueRows(t, s), "and its place is gone")

		sl, err := newer.ClaimSlotsWait(ctx, scopes)
		require.NoError(t, err)
		assert.Len(t, sl.Held(), 1)
	})
}

func TestLeaseClaimSlotsOptions(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	l, err := runlease.Acquire(t.Context(), s, "r", "A")
	require.NoError(t, err)
	_, err = l.ClaimSlots(t.Context(), []runlease.Scope{runlease.MemScope(1)}, runlease.WithTTL(time.Minute))
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, "the TTL is the lease's")
	_, err = l.ClaimSlotsWait(t.Context(), []runlease.Scope{runlease.MemScope(1)}, runlease.WithClock(time.Now))
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, "so is the clock")
	sl, err := l.ClaimSlots(t.Context(), []runlease.Scope{runlease.MemScope(1)}, runlease.WithPriority(3), runlease.WithFairShare("p", 2))
	require.NoError(t, err)
	assert.Len(t, sl.Held(), 1)
	if errors.Is(err, runlease.ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestExplainSlotsSaysWhyARunWaits(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		gpu, mem := runlease.NamedScope("gpu", 4), runlease.MemScope(8)
		holder, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{gpu.Take(3)})
		require.NoError(t, err)
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, s, "heavy", []runlease.Scope{gpu.Take(2)},
				runlease.WithFairShare("team-a", 2), runlease.WithPriority(1))
		}()
		awaitQueued(t, s, 1)
		go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "mine", []runlease.Scope{mem, gpu}) }()
		awaitQueued(t, s, 3) // mine waits in both scopes, as one claim
		before := libRows(t, s)

		ex, err := runlease.ExplainSlots(t.Context(), s, "mine", []runlease.Scope{mem, gpu})
		require.NoError(t, err)
		assert.False(t, ex.Admissible)
		require.Len(t, ex.Scopes, 2)
		m, g := ex.Scopes[0], ex.Scopes[1]
		assert.Equal(t, "mem", m.Scope)
		assert.True(t, m.Queued)
		assert.Equal(t, "", m.BlockedBy, "mem has room: it waits for gpu only")
		assert.Equal(t, 0, m.Position)

		assert.Equal(t, "gpu", g.Scope)
		assert.Equal(t, 4, g.Limit)
		assert.Equal(t, 3, g.Used)
		assert.Equal(t, 2, g.QueueLen)
		assert.True(t, g.Queued)
		assert.Equal(t, 1, g.Position)
		assert.Equal(t, 2, g.Reserved)
		assert.Equal(t, "order", g.BlockedBy, "one unit is free, but the heavy run ahead reserves it")
		require.Len(t, g.Ahead, 1)
		assert.Equal(t, "heavy", g.Ahead[0].RunID)
		assert.Equal(t, "team-a", g.Ahead[0].Principal)
		assert.Equal(t, 1, g.Ahead[0].Priority)
		assert.Equal(t, 2, g.Ahead[0].Units)
		require.Len(t, g.Holders, 3)
		assert.Equal(t, "holder", g.Holders[0].RunID)

		// The heavy run itself is held back by capacity alone.
		ex, err = runlease.ExplainSlots(t.Context(), s, "heavy", []runlease.Scope{gpu.Take(2)})
		require.NoError(t, err)
		assert.Equal(t, "capacity", ex.Scopes[0].BlockedBy)
		assert.Equal(t, 0, ex.Scopes[0].Position)

		// A run that is not queued is told where a claim would rank.
		ex, err = runlease.ExplainSlots(t.Context(), s, "newcomer", []runlease.Scope{gpu})
		require.NoError(t, err)
		assert.False(t, ex.Scopes[0].Queued)
		assert.Equal(t, 2, ex.Scopes[0].Position)
		ex, err = runlease.ExplainSlots(t.Context(), s, "urgent", []runlease.Scope{gpu}, runlease.WithPriority(2))
		require.NoError(t, err)
		assert.True(t, ex.Admissible, "a higher priority ranks ahead of both")

		ws, err := runlease.Queues(t.Context(), s)
		require.NoError(t, err)
		var got []string
		for _, w := range ws {
			got = append(got, w.Scope+"/"+w.RunID+"/"+strconv.Itoa(w.Position))
		}
		assert.Equal(t, []string{"gpu/heavy/0", "gpu/mine/1", "mem/mine/0"}, got)

		assert.Equal(t, before, libRows(t, s), "explaining writes nothing")
		require.NoError(t, holder.Release(t.Context()))
	})
}

func TestAPlainClaimOnAPlainStoreReadsTheMarksOnlyWhenSomeoneWaits(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	c := &testkit.Counting{Store: s} // no MultiScanner: one scan per prefix
	mem := []runlease.Scope{runlease.MemScope(1)}
	sl, err := runlease.ClaimSlots(t.Context(), c, "first", mem)
	require.NoError(t, err)
	assert.Equal(t, int64(2), c.Scans.Load(), "slots and the line's head; nobody waits, so no mark or priority rows")

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "waiter", mem) }()
	awaitQueued(t, s, 1)
	require.NoError(t, sl.Release(t.Context()))
	require.Eventually(t, func() bool { return len(queueRows(t, s)) == 0 }, 20*time.Second, time.Millisecond)

	// The waiter holds the slot now; queue another behind it and claim.
	go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "second", mem) }()
	awaitQueued(t, s, 1)
	c.Reset()
	_, err = runlease.ClaimSlots(t.Context(), c, "plain", mem)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
	// A store with neither ranges nor many scans in one call reads each
	// range with a scan of its own, and ranks a plain claim against the
	// line only when its head holds a live entry: slots and the head, then
	// the principal's mark and the first entries at the claim's priority,
	// which give its fair-share tag.
	assert.Equal(t, int64(4), c.Scans.Load(), "slots, the line's head, and the mark and priority rows that rank it against the waiter")
}
