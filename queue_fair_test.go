package runlease_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// admitBeforePlace is an embedded store that, just before the first batch
// writing a line entry of run, takes entry out of the line: as if the run
// ahead were admitted between the new waiter's read and its place.
type admitBeforePlace struct {
	*runlease.SQLiteStore
	run   string
	entry runlease.Row
	once  sync.Once
}

func (s *admitBeforePlace) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	for _, op := range ops {
		if strings.HasPrefix(op.Key, runlease.QueuePrefix) && strings.HasSuffix(op.Key, ":"+s.run) {
			s.once.Do(func() {
				_, _ = s.SQLiteStore.MetaDelete(ctx, s.entry.Key, s.entry.Value)
			})
		}
	}
	return s.SQLiteStore.MetaBatch(ctx, conds, ops)
}

// TestAPrincipalBackFromIdleStartsAtTheHeadItWouldFind: a principal with
// nothing waiting starts at the head of the queue. When the head moves on
// between its read and its place (the run at the head admitted), the place
// must not land at the old head's tag, ahead of the runs now at the head:
// it reads again and starts at the new head.
func TestAPrincipalBackFromIdleStartsAtTheHeadItWouldFind(t *testing.T) {
	t.Parallel()
	raw, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	scope := runlease.NamedScope("gpu", 1)
	holder, err := runlease.ClaimSlots(ctx, raw, "holder", []runlease.Scope{scope})
	require.NoError(t, err)
	defer holder.Release(context.Background())

	// A has two runs waiting, at tags 0 and 1 (in units of a run's share).
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for i, run := range []string{"a1", "a2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = runlease.ClaimSlotsWait(wctx, raw, run, []runlease.Scope{scope}, runlease.WithFairShare("A", 1))
		}()
		require.Eventually(t, func() bool { return len(lineRows(t, raw, "gpu")) == i+1 }, 10*time.Second, 5*time.Millisecond)
	}
	head := lineRowOf(t, raw, "gpu", "a1")
	next := lineEntry(t, raw, "gpu", "a2")

	s := &admitBeforePlace{SQLiteStore: raw, run: "b1", entry: head}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = runlease.ClaimSlotsWait(wctx, s, "b1", []runlease.Scope{scope}, runlease.WithFairShare("B", 1))
	}()
	require.Eventually(t, func() bool { return len(lineRowsOf(t, raw, "gpu", "b1")) == 1 }, 10*time.Second, 5*time.Millisecond)
	b := lineEntry(t, raw, "gpu", "b1")
	require.GreaterOrEqual(t, b["tag"].(float64), next["tag"].(float64),
		"B, back from idle, placed at the tag of a head that had moved on (%v), ahead of A's run now at the head (%v)", b["tag"], next["tag"])
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
		rounds := 12
		if testing.Short() {
			rounds = 5 // the count is for confidence only
		}
		for w := range 6 {
			wg.Go(func() {
				for i := range rounds {
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

// Two waiters of one principal queue, then give up. Each place moved the
// principal's fair-share mark (so the two got distinct tags); a wait that
// ends without admission moves it back to what it was, unless a later run
// of the principal moved it since. Given up last first, they leave no
// mark behind; given up in the order they queued, the second finds the
// mark as its place left it and moves it back to the first's: the
// principal is charged for the first run, as if it had been admitted,
// never for more.
func TestCancelledWaitersOfOnePrincipalLeaveNoMark(t *testing.T) {
	t.Parallel()
	for _, lastFirst := range []bool{true, false} {
		t.Run("last_first="+strconv.FormatBool(lastFirst), func(t *testing.T) {
			t.Parallel()
			bothStores(t, func(t *testing.T, s runlease.Store) {
				scopes := []runlease.Scope{runlease.MemScope(1)}
				_, err := runlease.ClaimSlots(t.Context(), s, "holder", scopes)
				require.NoError(t, err)
				before := libRows(t, s)

				ctx1, cancel1 := context.WithCancel(t.Context())
				defer cancel1()
				ctx2, cancel2 := context.WithCancel(t.Context())
				defer cancel2()
				d1 := startWait(ctx1, s, "a1", scopes, runlease.WithFairShare("a", 1))
				awaitQueued(t, s, 1)
				d2 := startWait(ctx2, s, "a2", scopes, runlease.WithFairShare("a", 1))
				awaitQueued(t, s, 2)
				require.Contains(t, get(t, s, "runfair:3:mem:a"), `{"finish":2000000,`, "each place moved the mark")

				if lastFirst {
					cancel2()
					require.Same(t, context.Canceled, waitErr(t, d2))
					cancel1()
					require.Same(t, context.Canceled, waitErr(t, d1))
				} else {
					cancel1()
					require.Same(t, context.Canceled, waitErr(t, d1))
					cancel2()
					require.Same(t, context.Canceled, waitErr(t, d2))
				}

				assert.Empty(t, queueRows(t, s))
				if lastFirst {
					assert.Equal(t, before, libRows(t, s), "two cancelled waits left a row behind")
					return
				}
				assert.Contains(t, get(t, s, "runfair:3:mem:a"), `{"finish":1000000,`, "the first run's share, no more")
				var rest []runlease.Row
				for _, r := range libRows(t, s) {
					if r.Key != "runfair:3:mem:a" {
						rest = append(rest, r)
					}
				}
				assert.Equal(t, before, rest, "no other row left behind")
			})
		})
	}
}

// A run's place moves the principal's fair-share mark to where the run
// finishes, and its admission keeps it there, the same way on a store
// with batches and on one without.
func TestAnAdmissionKeepsThePrincipalsMarkWithOrWithoutBatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		plain bool
	}{{"batcher", false}, {"plain", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := newSQLite(t)
			var s runlease.Store = base
			if tc.plain {
				s = testkit.PlainStore{Store: base}
			}
			scopes := []runlease.Scope{runlease.MemScope(1)}
			held, err := runlease.ClaimSlots(t.Context(), base, "holder", scopes)
			require.NoError(t, err)
			d := startWait(t.Context(), s, "a1", scopes, runlease.WithFairShare("a", 1), runlease.WithWaitPoll(runlease.MinWaitPoll))
			awaitQueued(t, base, 1)
			// The place moved the mark, in the same batch as the entry or,
			// without batches, in a write of its own right after it.
			require.Eventually(t, func() bool {
				v, found, err := base.MetaGet(t.Context(), "runfair:3:mem:a")
				return err == nil && found && strings.HasPrefix(v, `{"finish":1000000,`)
			}, 20*time.Second, time.Millisecond, "the waiting run's place moved the mark")
			require.NoError(t, held.Release(t.Context()))
			require.NoError(t, waitErr(t, d))
			assert.Empty(t, queueRows(t, base))
			assert.Contains(t, get(t, base, "runfair:3:mem:a"), `{"finish":1000000,`, "the admitted run's share is spent")
		})
	}
}

// deletesOfLineFail fails every delete of a line entry, as a store that
// goes down while a waiter leaves would.
type deletesOfLineFail struct{ *runlease.SQLiteStore }

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

// Prune removes "marks and clocks that no waiting entry needs", rows
// "ignored by every reader". It judges a mark against the smallest tag
// waiting in the scope at any priority (queueUse.minTag), but a claim's
// virtual time is the smallest tag waiting at its own priority, or the
// scope's clock when nothing waits there: a mark ahead of that still
// ranks the principal's next run, and Prune keeps it where it is.
func TestPruneKeepsAMarkThatStillRanks(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		now := time.Now()
		// A high-priority waiter whose principal's mark put it at 100 units.
		plant(t, s, plantedEntry{Run: "h", Waiter: "wh", Seq: 1, Principal: "ph", Priority: 5, Tag: 100_000_000,
			EnqMS: now.UnixMilli(), UntilMS: now.Add(time.Hour).UnixMilli(), Scopes: []string{"mem"}})
		// Principal p ran 50 units' worth, an hour ago; nothing of it waits.
		put(t, s, runlease.FairPrefix+"3:mem:p", `{"finish":50000000,"until_ms":`+
			strconv.FormatInt(now.Add(-time.Hour).UnixMilli(), 10)+`}`)
		mem := []runlease.Scope{runlease.MemScope(1)}
		rank := func() int64 {
			ex, err := runlease.ExplainSlots(ctx, s, "next", mem, runlease.WithFairShare("p", 1))
			require.NoError(t, err)
			return ex.Scopes[0].Tag
		}
		before := rank()
		require.Equal(t, int64(50_000_000), before, "p's next run at priority 0 starts from its mark")
		pruned, err := runlease.Prune(ctx, s, 0)
		require.NoError(t, err)
		assert.Equal(t, before, rank(), "Prune changed where p's next run ranks (pruned %v)", pruned.Queue)
	})
}

// placeLandsThenCancels is an embedded store whose first batch that writes
// a line entry of run lands, and then, before its reply, the waiter's
// context ends and the reply is lost: the wait never learns whether its
// place and its marks were written.
type placeLandsThenCancels struct {
	*runlease.SQLiteStore
	run    string
	cancel context.CancelFunc
	once   sync.Once
}

func (s *placeLandsThenCancels) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	for _, op := range ops {
		if strings.HasPrefix(op.Key, runlease.QueuePrefix) && strings.HasSuffix(op.Key, ":"+s.run) {
			lost := false
			s.once.Do(func() { lost = true })
			if lost {
				if _, err := s.SQLiteStore.MetaBatch(ctx, conds, ops); err != nil {
					return false, err
				}
				s.cancel()
				return false, testkit.Unknown("MetaBatch")
			}
		}
	}
	return s.SQLiteStore.MetaBatch(ctx, conds, ops)
}

// A place whose write landed while its reply was lost, with the wait's
// context ended before it could read the outcome back, is taken out like
// any other: the wait leaves neither its entries nor the share its place
// charged to the principal's marks (a leftover mark would rank the
// principal's next runs behind a run that never waited).
func TestAPlaceOfUnknownOutcomeGivesItsShareBack(t *testing.T) {
	t.Parallel()
	raw := newSQLite(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s := &placeLandsThenCancels{SQLiteStore: raw, run: "waiter", cancel: cancel}
	scopes := []runlease.Scope{runlease.MemScope(1), runlease.NamedScope("gpu", 4).Take(2)}
	_, err := runlease.ClaimSlots(t.Context(), s, "holder", scopes[:1])
	require.NoError(t, err)
	before := libRows(t, s)

	_, err = runlease.ClaimSlotsWait(ctx, s, "waiter", scopes)
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, queueRows(t, s), "its place is taken out of every queue")
	assert.Equal(t, before, libRows(t, s), "no mark or other row left behind")
}
