package runlease_test

import (
	"context"
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
func TestLineAdversaryPlainStoreCancelMidAdmissionLeavesNoSlot(t *testing.T) {
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

// ExplainSlots says "Admissible: a claim made now would be admitted in
// every scope", explaining the claim "as for ClaimSlots". It ranks the run
// at the enqueue time now, where ClaimSlots ranks it behind every waiter
// it ties with (claimRank: enq_ms MaxInt64): a waiter whose tag the claim
// ties (a new principal's claim starts at the head's tag) and whose
// enqueue time is now, or later by another host's clock, is ahead of the
// claim for ClaimSlots and behind it for the explanation.
func TestLineAdversaryExplainSlotsAgreesWithClaimSlots(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		now := time.Now().Truncate(time.Millisecond)
		clock := runlease.WithClock(func() time.Time { return now })
		plant(t, s, plantedEntry{Run: "z", Waiter: "wz", Seq: 1, Principal: "pz", EnqMS: now.UnixMilli(),
			UntilMS: now.Add(time.Hour).UnixMilli(), Scopes: []string{"mem"}})
		mem := []runlease.Scope{runlease.MemScope(1)}

		ex, err := runlease.ExplainSlots(ctx, s, "a", mem, clock)
		require.NoError(t, err)
		_, claimErr := runlease.ClaimSlots(ctx, s, "a", mem, clock)
		assert.Equal(t, ex.Admissible, claimErr == nil,
			"ExplainSlots says admissible=%v (position %d, blocked by %q); ClaimSlots made at the same instant: %v",
			ex.Admissible, ex.Scopes[0].Position, ex.Scopes[0].BlockedBy, claimErr)
	})
}

// The README's bound: "a waiter with k waiters ranked ahead of it is
// admitted within ⌈(k+1)/L⌉·T; later claims rank ahead of it only by fair
// share, at most about (its tag − the head's tag)·weight of them per
// principal". A waiter at the head of scope a (its tag is the head's) is
// overtaken by a later claim of a new principal that waits for a and b:
// rankIn takes the smallest tag waiting in any of the claim's scopes, so
// b's younger virtual time drags the claim to the front of a. Every run
// of that principal (its mark moves one unit a run, b's head stays) ranks
// ahead of the head of a, as many as a's and b's virtual times differ in
// units.
func TestLineAdversaryAMultiScopeClaimDoesNotOvertakeTheHeadOfAnotherScope(t *testing.T) {
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

// Prune removes "marks and clocks that no waiting entry needs", rows
// "ignored by every reader". It judges a mark against the smallest tag
// waiting in the scope at any priority (queueUse.minTag), but a claim's
// virtual time is the smallest tag waiting at its own priority, or the
// scope's clock when nothing waits there: a mark ahead of that still
// ranks the principal's next run, and Prune moves it to the front.
func TestLineAdversaryPruneKeepsAMarkThatStillRanks(t *testing.T) {
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
// is held back. It then decodes the head by a clock read again: two
// entries that expire between the two readings (the waiters of one
// process that died renew on one beat and expire at one millisecond)
// leave fewer live entries ahead than the limit, while the live waiter
// just past the head is not read: the claim is admitted into the unit
// that waiter needs, overtaking it.
func TestLineAdversaryAHeadJudgedCompleteIsDecodedByTheSameClock(t *testing.T) {
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

// "A second waiter for the same run gets RUN-E026, unless it waits
// through a lease with a higher fence (the newer driver takes the older
// one's place)." The newer driver's waiter deletes the older one's entry
// in its place's batch, but ranks itself as a new entry of the principal:
// from the mark the older place moved (its finish) and at a new enqueue
// time, so it lands behind every waiter that queued after the older one,
// instead of in its place.
func TestLineAdversaryANewerDriverTakesTheOlderWaitersPlace(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		mem := []runlease.Scope{runlease.MemScope(1)}
		held, err := runlease.ClaimSlots(ctx, s, "holder", mem, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		poll := runlease.WithWaitPoll(runlease.MinWaitPoll)
		old, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		dOld := make(chan error, 1)
		go func() { _, err := old.ClaimSlotsWait(ctx, mem, runlease.WithFairShare("pr", 1), poll); dOld <- err }()
		require.Eventually(t, func() bool { return len(lineRows(t, s, "mem")) == 1 }, 20*time.Second, time.Millisecond)
		dq := startWait(ctx, s, "q", mem, runlease.WithFairShare("pq", 1), poll)
		require.Eventually(t, func() bool { return len(lineRows(t, s, "mem")) == 2 }, 20*time.Second, time.Millisecond)

		newer, err := runlease.Acquire(ctx, s, "r", "D1", runlease.WithTTL(time.Hour)) // re-entry: a higher fence
		require.NoError(t, err)
		require.Greater(t, newer.Fence(), old.Fence())
		dNew := make(chan error, 1)
		go func() { _, err := newer.ClaimSlotsWait(ctx, mem, runlease.WithFairShare("pr", 1), poll); dNew <- err }()
		require.Eventually(t, func() bool {
			rs := lineRowsOf(t, s, "mem", "r")
			return len(rs) == 1 && strings.Contains(rs[0].Value, `"fence":`+strconv.FormatUint(newer.Fence(), 10)+`,`)
		}, 20*time.Second, time.Millisecond, "the newer driver's waiter took the run's place")
		var order []string
		for _, r := range lineRows(t, s, "mem") {
			_, run, _ := parseLine(r.Key)
			order = append(order, run)
		}
		assert.Equal(t, []string{"r", "q"}, order, "the newer driver's waiter is not where the older one was")
		require.NoError(t, held.Release(ctx))
		select {
		case err := <-dNew:
			assert.NoError(t, err, "the run, first in line, is admitted first")
		case err := <-dq:
			assert.Fail(t, "q, queued after the run, was admitted first", "%v", err)
		case <-ctx.Done():
			t.Fatal("nobody admitted")
		}
		cancel()
		<-dOld
	})
}

// The same on ClaimSlots, on a store without batches: the claim writes
// slot by slot and rolls back with the caller's context, which has ended.
func TestLineAdversaryPlainStoreCancelMidClaimLeavesNoSlot(t *testing.T) {
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
