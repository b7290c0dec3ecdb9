package runlease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/systest"
	"github.com/areev/runlease/internal/testkit"
)

// The line: the admission queue of a scope kept in key order, read by its
// head (README, "The head, not the queue").

// TestALongLineAdmitsInRankOrder: 2,000 waiters of one principal queue,
// one after another, on a scope of limit 2 whose slots are held. The line
// holds them in the order they queued (a principal's runs rank in queue
// order), and once the slots free up they are admitted in that order:
// when a run is admitted, at most one run ranked ahead of it (limit less
// its unit) is not admitted yet, and never more than 2 runs hold the
// scope at once. A plain claim behind them is refused with RUN-E022 while
// they wait, whether the slots are held or not.
func TestALongLineAdmitsInRankOrder(t *testing.T) {
	systest.Mark(t) // 2,000 waiters
	t.Parallel()
	// The race detector makes each waiter some ten times dearer.
	n, limit := 2000, 2
	if raceEnabled {
		n = 300
	}
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			s := st.open(t)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			scope := runlease.NamedScope("long", limit)
			scopes := []runlease.Scope{scope}
			held, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{scope.Take(limit)})
			require.NoError(t, err)

			t0 := time.Now()
			var holding, peak, admittedN atomic.Int64
			var bad atomic.Value // the first order violation or error seen
			keys := make([]string, n)
			allQueued := make(chan struct{}) // keys is written
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			errs := make(chan error, n)
			for i := range n {
				run := fmt.Sprintf("w%04d", i)
				wg.Go(func() {
					sl, err := runlease.ClaimSlotsWait(ctx, s, run, scopes, runlease.WithWaitPoll(time.Minute))
					if err != nil {
						errs <- fmt.Errorf("%s: %w", run, err)
						return
					}
					h := holding.Add(1)
					for p := peak.Load(); h > p && !peak.CompareAndSwap(p, h); p = peak.Load() {
					}
					// Every entry still in the line ranks behind this run
					// but at most limit-1 of them: they are the first rows
					// of the line, read by range. (Entries only leave, so
					// what this read finds was true at the admission.)
					<-allQueued
					ahead, err := headAhead(ctx, s, "long", keys[i], limit+1)
					if err != nil {
						bad.CompareAndSwap(nil, err.Error())
					} else if ahead > limit-1 {
						bad.CompareAndSwap(nil, fmt.Sprintf("%s admitted with %d runs ranked ahead of it still waiting", run, ahead))
					}
					admittedN.Add(1)
					holding.Add(-1) // stop counting before the release can let another in
					errs <- sl.Release(context.WithoutCancel(ctx))
				})
				// The next run queues once this one holds its place: the
				// queue order is known.
				require.Eventually(t, func() bool {
					v, found, err := s.MetaGet(ctx, placeKeyOf("long", run))
					if err != nil || !found {
						return false
					}
					keys[i] = lineKeyOfPlace(t, v)
					return true
				}, time.Minute, time.Millisecond, "%s never took its place", run)
			}

			close(allQueued)
			t.Logf("queued in %v", time.Since(t0))
			t0 = time.Now()
			line := lineRows(t, s, "long")
			require.Len(t, line, n)
			for i, r := range line {
				require.Equal(t, keys[i], r.Key, "the line holds the runs in the order they queued (%d)", i)
			}
			for i := 1; i < n; i++ {
				require.Less(t, keys[i-1], keys[i])
			}

			plainBehind := func(why string) {
				t.Helper()
				_, err := runlease.ClaimSlots(ctx, s, "plain", scopes)
				var limitErr *runlease.ConcurrencyLimitError
				require.ErrorAs(t, err, &limitErr, why)
				assert.Equal(t, "RUN-E022", runlease.Code(err))
				assert.GreaterOrEqual(t, limitErr.Ahead, 1, why)
			}
			plainBehind("the slots are held and 2,000 wait")

			require.NoError(t, held.Release(ctx))
			require.Eventually(t, func() bool { return admittedN.Load() >= int64(n/2) }, 4*time.Minute, time.Millisecond)
			plainBehind("the slots free up and go to the line first")
			t.Logf("half admitted in %v", time.Since(t0))
			for range n {
				require.NoError(t, <-errs)
			}
			t.Logf("all admitted in %v", time.Since(t0))
			if v := bad.Load(); v != nil {
				t.Fatal(v)
			}
			assert.LessOrEqual(t, peak.Load(), int64(limit), "more runs held the scope than its limit")
			assert.Empty(t, lineRows(t, s, "long"), "every waiter left the line")
		})
	}
}

// headAhead counts the entries among the first rows of scope's line whose
// keys sort before key (depth rows are read: enough to tell whether more
// than depth-1 rank ahead).
func headAhead(ctx context.Context, s runlease.Store, scope, key string, depth int) (int, error) {
	rr, ok := s.(runlease.RangeReader)
	if !ok {
		return 0, fmt.Errorf("%T reads no ranges", s)
	}
	got, err := rr.MetaRanges(ctx, []runlease.Range{{Prefix: linePrefix(scope), Limit: depth}})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range got[0] {
		if r.Key < key {
			n++
		}
	}
	return n, nil
}

// lineKeyOfPlace is the line key a place row names.
func lineKeyOfPlace(t *testing.T, place string) string {
	var p struct {
		Key string `json:"key"`
	}
	require.NoError(t, json.Unmarshal([]byte(place), &p))
	return p.Key
}

// TestOverlappingEnqueuesOfOnePrincipalNeverShareATag: 8 runs of one
// principal call ClaimSlotsWait at once on a full scope. Each place moves
// the principal's mark by compare-and-swap in the batch that writes it, so
// every run gets a tag of its own, and the principal's runs are ordered
// among themselves and against other principals by fair share, however
// their calls overlap. (Before, each enqueue read the mark and ranked from
// it, and only admissions moved it: runs that queued together tied.)
func TestOverlappingEnqueuesOfOnePrincipalNeverShareATag(t *testing.T) {
	t.Parallel()
	const n = 8
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		scopes := []runlease.Scope{runlease.NamedScope("busy", 1)}
		_, err := runlease.ClaimSlots(ctx, s, "holder", scopes)
		require.NoError(t, err)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				_, err := runlease.ClaimSlotsWait(ctx, s, "a"+strconv.Itoa(i), scopes, runlease.WithFairShare("A", 1))
				assert.ErrorIs(t, err, context.Canceled)
			})
		}
		close(start)
		awaitQueued(t, s, n)

		tags := map[float64]string{}
		for _, r := range lineRows(t, s, "busy") {
			var e map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.Value), &e))
			tag := e["tag"].(float64)
			if other, dup := tags[tag]; dup {
				t.Errorf("%s and %s share tag %v", other, e["run"], tag)
			}
			tags[tag] = e["run"].(string)
		}
		assert.Len(t, tags, n)
		assert.Contains(t, get(t, s, "runfair:4:busy:A"), `{"finish":`+strconv.Itoa(n*1_000_000)+`,`,
			"the mark is where the last of them finishes")
		cancel()
	})
}

// TestEnqueuesOfOnePrincipalThroughTwoStoresNeverShareATag: the runs of
// one principal call ClaimSlotsWait at once on a full scope through two
// Store values of one database: two PostgresStores on one table, each with
// a pool of its own, as two processes would have, and two values that
// reach one SQLiteStore. A process's waiters of one principal take turns
// per Store value, so the two values' waiters race: each place moves the
// principal's mark only if it still holds the mark its waiter read, so a
// place whose mark moved meanwhile is refused and read again, and every
// run gets a tag of its own. (A mark moved without that condition gave two
// runs read from one mark one tag: two runs for one share.)
func TestEnqueuesOfOnePrincipalThroughTwoStoresNeverShareATag(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.DSN(t)
		table := pgtest.NewTable(t, pgtest.Pool(t))
		enqueueThroughTwoStores(t, openPG(t, dsn, table), openPG(t, dsn, table))
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s := newSQLite(t)
		enqueueThroughTwoStores(t, &sqliteValue{s}, &sqliteValue{s})
	})
}

// sqliteValue is a Store value of its own that reaches a SQLiteStore.
type sqliteValue struct{ *runlease.SQLiteStore }

func enqueueThroughTwoStores(t *testing.T, a, b runlease.Store) {
	const perStore = 12
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	scopes := []runlease.Scope{runlease.NamedScope("busy", 1)}
	_, err := runlease.ClaimSlots(ctx, a, "holder", scopes)
	require.NoError(t, err)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	start := make(chan struct{})
	for i, s := range []runlease.Store{a, b} {
		for j := range perStore {
			wg.Go(func() {
				<-start
				_, err := runlease.ClaimSlotsWait(ctx, s, fmt.Sprintf("a%d-%d", i, j), scopes,
					runlease.WithFairShare("A", 1), runlease.WithWaitPoll(time.Hour))
				assert.ErrorIs(t, err, context.Canceled)
			})
		}
	}
	close(start)
	const n = 2 * perStore
	awaitQueued(t, a, n)

	tags := map[float64]string{}
	for _, r := range lineRows(t, a, "busy") {
		var e map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.Value), &e))
		tag := e["tag"].(float64)
		if other, dup := tags[tag]; dup {
			t.Errorf("%s and %s share tag %v", other, e["run"], tag)
		}
		tags[tag] = e["run"].(string)
	}
	assert.Len(t, tags, n)
	assert.Contains(t, get(t, a, "runfair:4:busy:A"), `{"finish":`+strconv.Itoa(n*1_000_000)+`,`,
		"the mark is where the last of them finishes")
}

// TestExpiredEntriesAtTheHeadHoldNobodyBack: entries whose waiters died
// (until_ms in the past), three times the limit of them, lie at the head
// of the line, ahead of every live waiter. They hold no place, and they
// hide none: a claim reads past them to the live waiters behind, so a
// plain claim is still refused for the sake of a waiter behind them, and
// that waiter is admitted as soon as the slots it needs are free (woken by
// the release, with a poll of an hour). No expired entry is written over.
func TestExpiredEntriesAtTheHeadHoldNobodyBack(t *testing.T) {
	t.Parallel()
	const limit = 2
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ctx, s := t.Context(), st.open(t)
			gpu := runlease.NamedScope("gpu", limit)
			held, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{gpu})
			require.NoError(t, err)
			now := time.Now()
			dead := map[string]string{}
			for i := range 3 * limit {
				e := plantedEntry{Run: "dead" + strconv.Itoa(i), Waiter: "w" + strconv.Itoa(i), Seq: 1,
					EnqMS: now.Add(-time.Hour).UnixMilli() + int64(i), UntilMS: now.Add(-time.Minute).UnixMilli(),
					Scopes: []string{"gpu"}}
				dead[e.key("gpu")] = plant(t, s, e)
			}

			// It needs both units; one is held.
			res := waitInBackground(ctx, s, "live", []runlease.Scope{gpu.Take(limit)})
			awaitWaiting(t, s, "live", res)
			for k := range dead {
				require.Less(t, k, lineRowOf(t, s, "gpu", "live").Key, "the expired entries are at the head")
			}
			_, err = runlease.ClaimSlots(ctx, s, "jumper", []runlease.Scope{gpu})
			var limitErr *runlease.ConcurrencyLimitError
			require.ErrorAs(t, err, &limitErr, "the free unit is the live waiter's, behind the expired entries")
			assert.Equal(t, runlease.ConcurrencyLimitError{Scope: "gpu", Limit: limit, Units: 1, Held: 1, Ahead: 1, Reserved: limit}, *limitErr)

			require.NoError(t, held.Release(ctx))
			select {
			case got := <-res:
				require.NoError(t, got.err)
				require.Len(t, got.slots.Held(), limit)
			case <-time.After(20 * time.Second):
				t.Fatal("the waiter behind the expired entries was not admitted when the slots freed")
			}
			for k, v := range dead {
				if cur, found, err := s.MetaGet(ctx, k); assert.NoError(t, err) && found {
					assert.Equal(t, v, cur, "an expired entry is taken out or left, never written over")
				}
			}
		})
	}
}

// rowCounter counts the calls of MetaRanges and the rows they return.
type rowCounter struct {
	runlease.Store
	calls, rows atomic.Int64
}

func (c *rowCounter) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	c.calls.Add(1)
	got, err := c.Store.(runlease.RangeReader).MetaRanges(ctx, ranges)
	for _, r := range got {
		c.rows.Add(int64(len(r)))
	}
	return got, err
}

// TestAClaimReadsTheHeadOfTheLineOnly: behind a line of 1,000 live
// entries, a plain claim is refused after one read that returns the slot
// rows, the first limit+1 entries and the claim's own few rows, not the
// line; and so is a waiter's first look.
func TestAClaimReadsTheHeadOfTheLineOnly(t *testing.T) {
	t.Parallel()
	const n, limit = 1000, 2
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ctx, s := t.Context(), st.open(t)
			now := time.Now()
			var ops []runlease.Op
			for i := range n {
				e := plantedEntry{Run: fmt.Sprintf("q%04d", i), Waiter: "w" + strconv.Itoa(i), Seq: 1,
					Tag: int64(i) * 1_000_000, EnqMS: now.UnixMilli(), UntilMS: now.Add(time.Hour).UnixMilli(),
					Scopes: []string{"gpu"}}
				ops = append(ops, runlease.Put(e.key("gpu"), e.json()))
				if len(ops) == runlease.MaxBatch || i == n-1 {
					ok, err := s.(runlease.Batcher).MetaBatch(ctx, nil, ops)
					require.NoError(t, err)
					require.True(t, ok)
					ops = nil
				}
			}
			// The principal's mark says its last run finishes after them
			// all, as the places of its runs left it: a claim of it ranks
			// behind the whole line.
			put(t, s, runlease.FairPrefix+scopeSeg("gpu")+":", `{"finish":`+strconv.Itoa(n*1_000_000)+`,"until_ms":`+
				strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10)+`}`)
			scopes := []runlease.Scope{runlease.NamedScope("gpu", limit)}
			c := &rowCounter{Store: s}
			_, err := runlease.ClaimSlots(ctx, c, "plain", scopes)
			var limitErr *runlease.ConcurrencyLimitError
			require.ErrorAs(t, err, &limitErr)
			assert.Equal(t, 0, limitErr.Held, "the slots are free: the line holds it back")
			assert.GreaterOrEqual(t, limitErr.Ahead, limit, "the head reserves every unit")
			assert.Equal(t, int64(1), c.calls.Load(), "one read")
			// limit+1 entries of the head, and at most 4 entries at the
			// claim's priority (its fair-share tag) and its mark.
			assert.LessOrEqual(t, c.rows.Load(), int64(limit+1+4+1), "rows read")

			c.calls.Store(0)
			c.rows.Store(0)
			wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err = runlease.ClaimSlotsWait(wctx, c, "waiting", scopes, runlease.WithWaitPoll(time.Hour))
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.LessOrEqual(t, c.rows.Load(), int64(c.calls.Load()*(limit+1+4+4)), "each read takes the head, not the line")
		})
	}
}

// TestAPlainClaimOnAPlainStoreReadsItsRankPastExpiredEntries: on a store
// that reads neither ranges nor many prefixes at once, a plain claim reads
// its own rows (its mark, the first entries at its priority) only when the
// head of the line holds a live entry. When the head read is all expired
// entries and the live waiter lies just behind them, the claim must still
// rank from that waiter's tag: a principal with nothing waiting starts at
// the virtual time, the smallest tag waiting, not at zero. Here a waiter
// of principal p (tag 5,000,000) needs both units of a scope of limit 2,
// one of which is held; a claim of principal q must rank behind it and be
// refused, as it is on a store that reads ranges.
func TestAPlainClaimOnAPlainStoreReadsItsRankPastExpiredEntries(t *testing.T) {
	t.Parallel()
	for _, plain := range []bool{false, true} {
		t.Run("plain="+strconv.FormatBool(plain), func(t *testing.T) {
			t.Parallel()
			ctx, base := t.Context(), newSQLite(t)
			var s runlease.Store = base
			if plain {
				s = testkit.PlainStore{Store: base}
			}
			const limit = 2
			gpu := runlease.NamedScope("gpu", limit)
			_, err := runlease.ClaimSlots(ctx, base, "holder", []runlease.Scope{gpu})
			require.NoError(t, err)
			now := time.Now()
			for i := range 3 * limit {
				plant(t, base, plantedEntry{Run: "dead" + strconv.Itoa(i), Waiter: "d" + strconv.Itoa(i), Seq: 1,
					EnqMS: now.Add(-time.Hour).UnixMilli() + int64(i), UntilMS: now.Add(-time.Minute).UnixMilli(),
					Scopes: []string{"gpu"}})
			}
			plant(t, base, plantedEntry{Run: "waiting", Waiter: "w", Seq: 1, Principal: "p", Units: limit,
				Tag: 5_000_000, EnqMS: now.Add(-time.Second).UnixMilli(), UntilMS: now.Add(time.Hour).UnixMilli(),
				Scopes: []string{"gpu"}})

			_, err = runlease.ClaimSlots(ctx, s, "jumper", []runlease.Scope{gpu}, runlease.WithFairShare("q", 1))
			var limitErr *runlease.ConcurrencyLimitError
			require.ErrorAs(t, err, &limitErr, "the free unit is the waiter's: the claim ranks behind it")
			assert.Equal(t, 1, limitErr.Ahead)
		})
	}
}

// A waiter ranked behind may be admitted first only into units that no
// waiter ahead needs, and then never delays it: p1 queues for {a, b}, p2 of
// the same principal for {a} behind it; a frees while b stays full: p2 takes
// the unit of a that p1 does not need, and p1 is admitted as soon as b frees,
// into the unit of a it reserved.
func TestABackfilledRunNeverDelaysTheWaiterAhead(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		a, b := runlease.NamedScope("a", 2), runlease.NamedScope("b", 1)
		ha, err := runlease.ClaimSlots(ctx, s, "xa", []runlease.Scope{a})
		require.NoError(t, err)
		hb, err := runlease.ClaimSlots(ctx, s, "xb", []runlease.Scope{b})
		require.NoError(t, err)
		opts := []runlease.Option{runlease.WithFairShare("p", 1), runlease.WithWaitPoll(runlease.MinWaitPoll)}
		d1 := startWait(ctx, s, "p1", []runlease.Scope{a, b}, opts...)
		awaitQueued(t, s, 2)
		d2 := startWait(ctx, s, "p2", []runlease.Scope{a}, opts...)
		awaitQueued(t, s, 3)
		require.NoError(t, ha.Release(ctx))
		require.NoError(t, waitErr(t, d2), "p2 fits beside what p1 reserves")
		select {
		case err := <-d1:
			t.Fatalf("p1 returned %v while b is full", err)
		default:
		}
		ex, err := runlease.ExplainSlots(ctx, s, "p1", []runlease.Scope{a, b})
		require.NoError(t, err)
		assert.Equal(t, "", ex.Scopes[0].BlockedBy, "p1's unit of a is still free for it")
		assert.Equal(t, "capacity", ex.Scopes[1].BlockedBy)
		require.NoError(t, hb.Release(ctx))
		require.NoError(t, waitErr(t, d1), "p1 is admitted once b frees")
	})
}

// The README's bound: "a waiter with k waiters ranked ahead of it is
// admitted within ⌈(k+1)/L⌉·T; later claims rank ahead of it only by fair
// share, at most about (its tag − the head's tag)·weight of them per
// principal". A waiter at the head of scope a (its tag is the head's) is
// not overtaken by later claims of a new principal that waits for a and b.
// Were a claim ranked by the smallest tag waiting in any of its scopes, b's
// younger virtual time would drag it to the front of a, and every run of
// that principal (its mark moves one unit a run, b's head stays) would rank
// ahead of the head of a, as many as a's and b's virtual times differ in
// units.
func TestAMultiScopeClaimDoesNotOvertakeTheHeadOfAnotherScope(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		a, b := runlease.NamedScope("a", 1), runlease.NamedScope("b", 1)
		_, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{a, b}, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		// Scope a has admitted 100 units' worth of runs: its clock says so.
		put(t, s, runlease.ClockPrefix+"1:a", `{"finish":100000000,"until_ms":`+
			strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)+`}`)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		poll := runlease.WithWaitPoll(runlease.MinWaitPoll)
		dw := startWait(wctx, s, "w", []runlease.Scope{a}, runlease.WithFairShare("pw", 1), poll)
		require.Eventually(t, func() bool { return len(lineRows(t, s, "a")) == 1 }, 20*time.Second, time.Millisecond)
		dv := startWait(wctx, s, "v", []runlease.Scope{b}, runlease.WithFairShare("pv", 1), poll)
		require.Eventually(t, func() bool { return len(lineRows(t, s, "b")) == 1 }, 20*time.Second, time.Millisecond)
		var dx []<-chan error
		for i := range 3 {
			dx = append(dx, startWait(wctx, s, "x"+strconv.Itoa(i), []runlease.Scope{a, b}, runlease.WithFairShare("px", 1), poll))
			require.Eventually(t, func() bool { return len(lineRows(t, s, "a")) == 2+i }, 20*time.Second, time.Millisecond)
		}
		var order []string
		for _, r := range lineRows(t, s, "a") {
			_, run, _ := parseLine(r.Key)
			order = append(order, run)
		}
		assert.Equal(t, "w", order[0], "the head of a, overtaken by later claims of one principal: %v", order)
		cancel()
		for _, d := range append(dx, dw, dv) {
			waitErr(t, d)
		}
	})
}

// rangeArmed is a store with ranges whose clock steps one millisecond
// the second time it is read after a range read: the moment a claim
// judges its head complete (scopeRows.complete) and the moment it
// decodes it (decodeScopeFor) fall on either side of a millisecond.
type rangeArmed struct {
	*runlease.SQLiteStore
	at    int64        // the clock before the step, in ms
	reads atomic.Int64 // clock readings since the last range read (-1: none yet)
}

func (r *rangeArmed) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	rows, err := r.SQLiteStore.MetaRanges(ctx, ranges)
	r.reads.Store(0)
	return rows, err
}

func (r *rangeArmed) now() time.Time {
	if n := r.reads.Add(1); n >= 2 && n < 1<<40 {
		return time.UnixMilli(r.at + 1)
	}
	return time.UnixMilli(r.at)
}

// A claim reads the head of the line, limit+1 rows, and, finding them
// live, judges the head cut and complete: a claim ranked behind them all
// is held back. It decodes the head by that same clock reading. Read again,
// the clock could see two entries expire between the readings (the waiters
// of one process that died renew on one beat and expire at one
// millisecond), leaving fewer live entries ahead than the limit while the
// live waiter just past the head is not read: the claim would be admitted
// into the unit that waiter needs, overtaking it.
func TestAHeadJudgedCompleteIsDecodedByTheSameClock(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	T := time.Now().Add(time.Minute).UnixMilli()
	s := &rangeArmed{SQLiteStore: base, at: T - 1}
	s.reads.Store(1 << 41)
	for i, until := range []int64{T, T, T + 3_600_000, T + 3_600_000} {
		plant(t, base, plantedEntry{Run: "e" + strconv.Itoa(i), Waiter: "w" + strconv.Itoa(i), Seq: 1,
			Principal: "p" + strconv.Itoa(i), EnqMS: T - 10_000 + int64(i), UntilMS: until, Scopes: []string{"mem"}})
	}
	mem := []runlease.Scope{runlease.MemScope(2)}
	_, err := runlease.ClaimSlots(t.Context(), s, "late", mem, runlease.WithClock(s.now), runlease.WithTTL(time.Hour))
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit,
		"e2 and e3 wait ahead of the claim for both units; it was admitted over e3")
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

// TestAPlainClaimRanksBehindAWaiterItTiesWith proves that a claim that
// does not wait, of another principal, at the waiter's priority and with
// the same fair-share tag, ranks behind the waiter: it ties on priority and
// tag, and a claim made now has not waited at all. It is refused while the
// waiter's reservation leaves it no room, plain or through a lease, though
// its run id sorts first (the last tie-break, which must never be reached).
func TestAPlainClaimRanksBehindAWaiterItTiesWith(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		gpu := runlease.NamedScope("gpu", 2)
		_, err := runlease.ClaimSlots(ctx, s, "one", []runlease.Scope{gpu})
		require.NoError(t, err)
		// A waiter of team-a needs both units: one is free, and it
		// reserves it.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			_, _ = runlease.ClaimSlotsWait(wctx, s, "waiter-z", []runlease.Scope{gpu.Take(2)},
				runlease.WithFairShare("team-a", 1))
		}()
		awaitQueued(t, s, 1)
		queued, err := runlease.Queues(ctx, s)
		require.NoError(t, err)
		require.Len(t, queued, 1)

		// team-b has nothing waiting and no mark: a claim of its ranks at
		// the virtual time now, the waiter's own tag.
		teamB := runlease.WithFairShare("team-b", 1)
		ex, err := runlease.ExplainSlots(ctx, s, "claim-a", []runlease.Scope{gpu}, teamB)
		require.NoError(t, err)
		require.Equal(t, queued[0].Priority, ex.Scopes[0].Priority)
		require.Equal(t, queued[0].Tag, ex.Scopes[0].Tag, "the claim ties with the waiter on priority and tag")

		want := runlease.ConcurrencyLimitError{Scope: "gpu", Limit: 2, Units: 1, Held: 1, Ahead: 1, Reserved: 2}
		slotsBefore := slotRows(t, s)
		_, err = runlease.ClaimSlots(ctx, s, "claim-a", []runlease.Scope{gpu}, teamB)
		var limit *runlease.ConcurrencyLimitError
		require.ErrorAs(t, err, &limit, "a plain claim took the unit the waiter it ties with reserves")
		assert.Equal(t, want, *limit)

		l, err := runlease.Acquire(ctx, s, "claim-a", "driver")
		require.NoError(t, err)
		_, err = l.ClaimSlots(ctx, []runlease.Scope{gpu}, teamB)
		require.ErrorAs(t, err, &limit, "a lease's claim took the unit the waiter it ties with reserves")
		assert.Equal(t, want, *limit)
		require.NoError(t, l.Release(ctx))
		assert.Equal(t, slotsBefore, slotRows(t, s), "the refusals took no slot")
		assert.Len(t, queueRows(t, s), 1, "nor queued")
	})
}

// slotRows returns the slot rows of every scope.
func slotRows(t *testing.T, s runlease.Store) []runlease.Row {
	t.Helper()
	r, err := s.MetaScan(t.Context(), runlease.SlotPrefix)
	require.NoError(t, err)
	return r
}

// TestAWaiterFarBehindTheHeadLooksOnceTheOnesAheadLeave: a waiter behind
// more of its own process's waiters than a release lets in stops polling
// (a process of 100,000 waiters would otherwise wake each of them every
// poll); it looks again once a waiter ahead leaves the first ones. On a
// store that sends no notifications, nothing else wakes it: here every
// waiter of a scope of limit 1 must be admitted in turn, each releasing at
// once, though all but the first two are far behind when they queue.
func TestAWaiterFarBehindTheHeadLooksOnceTheOnesAheadLeave(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		raw := bubbleStore(t)
		// The store without its notifications: waiters learn only by
		// polling, or from the room when one ahead of them leaves.
		s := struct {
			runlease.Store
			runlease.Batcher
			runlease.RangeReader
		}{raw, raw, raw}
		ctx := t.Context()
		scope := runlease.NamedScope("gpu", 1)
		holder, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{scope})
		require.NoError(t, err)

		const n = 6
		var admitted atomic.Int32
		errs := make(chan error, n)
		for i := range n {
			go func() {
				sl, err := runlease.ClaimSlotsWait(ctx, s, fmt.Sprintf("w%d", i), []runlease.Scope{scope},
					runlease.WithWaitPoll(runlease.MinWaitPoll))
				if err == nil {
					admitted.Add(1)
					err = sl.Release(ctx)
				}
				errs <- err
			}()
			synctest.Wait() // queued, in this order
		}
		time.Sleep(time.Second) // every waiter has polled: the far ones poll no more
		synctest.Wait()
		require.Zero(t, admitted.Load())

		require.NoError(t, holder.Release(ctx))
		time.Sleep(10 * time.Second) // far less than a renewal of their entries (the TTL is 10 minutes)
		synctest.Wait()
		require.Equal(t, int32(n), admitted.Load(), "every waiter was admitted in turn")
		for range n {
			require.NoError(t, <-errs)
		}
	})
}
