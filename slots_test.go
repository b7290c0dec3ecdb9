package runlease_test

import (
	"context"
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
	"github.com/areev/runlease/internal/testkit"
)

func TestSlots(t *testing.T) {
	t.Parallel()

	t.Run("a_scope_holds_at_most_its_limit", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		mem := []runlease.Scope{runlease.MemScope(2)}
		_, err := runlease.ClaimSlots(t.Context(), s, "r1", mem, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		_, err = runlease.ClaimSlots(t.Context(), s, "r2", mem, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		before := rows(t, s)
		_, err = runlease.ClaimSlots(t.Context(), s, "r3", mem, runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
		assert.True(t, strings.HasPrefix(err.Error(), "RUN-E022"), err.Error())
		var lim *runlease.ConcurrencyLimitError
		require.ErrorAs(t, err, &lim)
		assert.Equal(t, runlease.ConcurrencyLimitError{Scope: "mem", Limit: 2, Units: 1, Held: 2}, *lim, "names the scope, limit and use")
		assert.Equal(t, before, rows(t, s), "a refusal writes nothing")
	})

	t.Run("a_run_refused_in_one_scope_holds_nothing_in_the_others", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		_, err := runlease.ClaimSlots(t.Context(), s, "r1", []runlease.Scope{runlease.PrincipalScope("alice", 1)},
			runlease.WithClock(clk.Now))
		require.NoError(t, err)
		before := rows(t, s)
		_, err = runlease.ClaimSlots(t.Context(), s, "r2",
			[]runlease.Scope{runlease.MemScope(5), runlease.PrincipalScope("alice", 1)}, runlease.WithClock(clk.Now))
		var lim *runlease.ConcurrencyLimitError
		require.ErrorAs(t, err, &lim)
		assert.Equal(t, "principal:alice", lim.Scope)
		assert.Equal(t, before, rows(t, s), "no slot in mem either, not even briefly")
	})

	// A second claim of a run that holds a slot: slots_claim_test.go.

	t.Run("a_crashed_holders_slot_frees_after_its_ttl", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		scopes := []runlease.Scope{runlease.NamedScope("gpu", 1)}
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
		crashed, err := runlease.ClaimSlots(t.Context(), s, "r1", scopes, opts...)
		require.NoError(t, err)
		clk.Advance(runlease.MinTTL - time.Millisecond)
		_, err = runlease.ClaimSlots(t.Context(), s, "r2", scopes, opts...)
		require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
		clk.Advance(time.Millisecond)
		_, err = runlease.ClaimSlots(t.Context(), s, "r2", scopes, opts...)
		require.NoError(t, err)
		err = crashed.Renew(t.Context())
		require.ErrorIs(t, err, runlease.ErrSlotLost, "the stalled run learns it lost the slot")
		assert.Empty(t, crashed.Held())
	})

	t.Run("releasing_a_slot_taken_since_leaves_it_taken", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		scopes := []runlease.Scope{runlease.MemScope(1)}
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
		stale, err := runlease.ClaimSlots(t.Context(), s, "r1", scopes, opts...)
		require.NoError(t, err)
		clk.Advance(runlease.MinTTL)
		_, err = runlease.ClaimSlots(t.Context(), s, "r2", scopes, opts...)
		require.NoError(t, err)
		before := rows(t, s)
		require.NoError(t, stale.Release(t.Context()))
		assert.Equal(t, before, rows(t, s))
	})

	t.Run("renewing_extends_and_release_frees", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		scopes := []runlease.Scope{runlease.MemScope(1), runlease.PrincipalScope("a:b%_", 1)}
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
		sl, err := runlease.ClaimSlots(t.Context(), s, "r1", scopes, opts...)
		require.NoError(t, err)
		clk.Advance(4 * time.Second)
		require.NoError(t, sl.Renew(t.Context()))
		clk.Advance(4 * time.Second)
		_, err = runlease.ClaimSlots(t.Context(), s, "r2", scopes, opts...)
		require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "renewed past the first deadline")
		require.NoError(t, sl.Release(t.Context()))
		assert.Empty(t, rows(t, s), "released slots are deleted")
		_, err = runlease.ClaimSlots(t.Context(), s, "r2", scopes, opts...)
		require.NoError(t, err)
	})

	t.Run("slot_rows_match_the_reference", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		_, err := runlease.ClaimSlots(t.Context(), s, "r1",
			[]runlease.Scope{runlease.MemScope(4), runlease.PrincipalScope("alice", 2)},
			runlease.WithClock(clk.Now), runlease.WithTTL(time.Minute))
		require.NoError(t, err)
		// The reference's row, with the claim's id as its fence, where
		// the reference writes 0 and reads nothing (slots_claim_test.go).
		got := rows(t, s)
		require.NotEmpty(t, got)
		fence := slotFence(t, got[0].Value)
		row := `{"holder":"r1","fence":` + strconv.FormatUint(fence, 10) + `,"until_ms":` + strconv.FormatInt(epoch.Add(time.Minute).UnixMilli(), 10) + `}`
		assert.Equal(t, []runlease.Row{
			{Key: "runslot:mem:0", Value: row},
			{Key: "runslot:principal:alice:0", Value: row},
		}, got)
	})

	// Corrupt slot rows, queue entries and marks: slots_corrupt_test.go.

	t.Run("a_longer_scope_name_sharing_the_prefix_is_not_counted", func(t *testing.T) {
		t.Parallel()
		s := newSQLite(t)
		_, err := runlease.ClaimSlots(t.Context(), s, "r1", []runlease.Scope{runlease.PrincipalScope("a:x", 1)})
		require.NoError(t, err)
		_, err = runlease.ClaimSlots(t.Context(), s, "r2", []runlease.Scope{runlease.PrincipalScope("a", 1)})
		require.NoError(t, err, `"principal:a:x:0" is not a slot of "principal:a"`)
	})
}

func TestSlotCapHoldsUnderRaces(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	const limit, workers = 3, 16
	claims := 200
	if testing.Short() {
		claims = 60 // the count is for confidence only
	}
	scopes := []runlease.Scope{runlease.MemScope(limit)}
	var holding, peak atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range claims {
				runID := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				sl, err := runlease.ClaimSlots(context.Background(), s, runID, scopes)
				if errors.Is(err, runlease.ErrConcurrencyLimit) {
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				n := holding.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				holding.Add(-1) // stop counting before the release can let another in
				assert.NoError(t, sl.Release(context.Background()))
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, peak.Load(), int64(limit), "more holders than the limit at once")
	assert.Positive(t, peak.Load())
	assert.Empty(t, rows(t, s), "every slot released")
}

func TestClaimCostDoesNotGrowWithTheLimit(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 10, 1000} {
		for _, batched := range []bool{true, false} {
			t.Run(strconv.Itoa(limit)+"/batched="+strconv.FormatBool(batched), func(t *testing.T) {
				t.Parallel()
				s := newSQLite(t)
				scopes := []runlease.Scope{runlease.NamedScope("big", limit)}
				until := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
				for i := range limit - 1 {
					put(t, s, "runslot:big:"+strconv.Itoa(i), `{"holder":"h`+strconv.Itoa(i)+`","fence":0,"until_ms":`+until+`}`)
				}
				cb := testkit.NewCountingBatcher(s)
				var store runlease.Store = &cb.Counting // hides MetaBatch: one CAS per scope
				if batched {
					store = cb
				}
				// The slot rows, the head of the scope's line, and the
				// claim's mark and first rows at its priority are read in
				// one call on a store that reads ranges (CountingBatcher
				// passes MetaRanges through); otherwise the slots and the
				// head in two scans, and the mark and priority rows only
				// when the head holds a live waiter (nobody waits here).
				scans := int64(2)
				if batched {
					scans = 1
				}
				sl, err := runlease.ClaimSlots(t.Context(), store, "last", scopes)
				require.NoError(t, err)
				assert.Equal(t, limit-1, sl.Held()[0].Slot, "the one free slot")
				assert.Equal(t, scans, cb.Scans.Load(), "one read of the scope")
				assert.Equal(t, int64(1), cb.CASes.Load(), "one write")
				assert.Zero(t, cb.Batches.Load(), "one scope is one conditional write, never a batch")
				assert.Equal(t, scans+1, cb.Total()+cb.Batches.Load())

				cb.Reset()
				cb.Batches.Store(0)
				_, err = runlease.ClaimSlots(t.Context(), store, "one-too-many", scopes)
				require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
				assert.Equal(t, scans, cb.Total()+cb.Batches.Load(), "a refusal is one read")
			})
		}
	}
}

func TestALoweredLimitDrainsAndIsReported(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(clk.Now)}
	// Another host, configured with a limit of 5, ends up holding slots 2 and 3.
	for _, run := range []string{"x", "y", "z", "w"} {
		_, err := runlease.ClaimSlots(t.Context(), s, run, []runlease.Scope{runlease.MemScope(5)}, opts...)
		require.NoError(t, err)
	}
	for _, k := range []string{"0", "1"} {
		cur := get(t, s, "runslot:mem:"+k)
		ok, err := s.MetaDelete(t.Context(), "runslot:mem:"+k, cur)
		require.NoError(t, err)
		require.True(t, ok)
	}
	high := rows(t, s) // runslot:mem:2, :3 — and this host's limit is 3

	var events []runlease.LimitMismatchEvent
	hooks := runlease.WithHooks(runlease.Hooks{LimitMismatch: func(e runlease.LimitMismatchEvent) { events = append(events, e) }})
	three := []runlease.Scope{runlease.MemScope(3)}
	_, err := runlease.ClaimSlots(t.Context(), s, "r1", three, append(opts, hooks)...)
	require.NoError(t, err, "2 live < 3")
	require.Equal(t, []runlease.LimitMismatchEvent{{Scope: "mem", Limit: 3, Live: 2, AboveLimit: 1}}, events)
	_, err = runlease.ClaimSlots(t.Context(), s, "r2", three, append(opts, hooks)...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "3 live: the scope drains to the lower limit")
	for _, r := range high {
		assert.Equal(t, r.Value, get(t, s, r.Key), "never evicted")
	}
}

func TestSlotsBadInputIsRefusedAndWritesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		runID  string
		scopes []runlease.Scope
	}{
		{"empty_run_id", "", []runlease.Scope{runlease.MemScope(1)}},
		{"nul_in_run_id", "r\x00", []runlease.Scope{runlease.MemScope(1)}},
		{"invalid_utf8_run_id", "\xff", []runlease.Scope{runlease.MemScope(1)}},
		{"colon_in_scope_name", "r1", []runlease.Scope{runlease.NamedScope("a:b", 1)}},
		{"percent_in_scope_name", "r1", []runlease.Scope{runlease.NamedScope("a%", 1)}},
		{"underscore_in_scope_name", "r1", []runlease.Scope{runlease.NamedScope("a_b", 1)}},
		{"empty_scope_name", "r1", []runlease.Scope{runlease.NamedScope("", 1)}},
		{"zero_scope", "r1", []runlease.Scope{{}}},
		{"limit_zero", "r1", []runlease.Scope{runlease.MemScope(0)}},
		{"limit_negative", "r1", []runlease.Scope{runlease.MemScope(-3)}},
		{"limit_too_large", "r1", []runlease.Scope{runlease.MemScope(runlease.MaxSlotLimit + 1)}},
		{"nul_in_principal", "r1", []runlease.Scope{runlease.PrincipalScope("a\x00", 1)}},
		{"invalid_utf8_principal", "r1", []runlease.Scope{runlease.PrincipalScope("\xc3", 1)}},
		{"empty_principal", "r1", []runlease.Scope{runlease.PrincipalScope("", 1)}},
		{"scope_listed_twice", "r1", []runlease.Scope{runlease.MemScope(1), runlease.MemScope(2)}},
		{"bad_scope_after_a_good_one", "r1", []runlease.Scope{runlease.MemScope(1), runlease.NamedScope("x_y", 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSQLite(t)
			_, err := runlease.ClaimSlots(t.Context(), s, tc.runID, tc.scopes)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			assert.Equal(t, "RUN-E001", runlease.Code(err))
			assert.Empty(t, rows(t, s))
		})
	}
	_, err := runlease.ClaimSlots(t.Context(), newSQLite(t), "r1", []runlease.Scope{runlease.MemScope(1)},
		runlease.WithTTL(time.Second))
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, "a TTL below the minimum")
}

func TestOccupancyListsLiveSlots(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(clk.Now)}
	_, err := runlease.ClaimSlots(t.Context(), s, "r1", []runlease.Scope{runlease.MemScope(2), runlease.PrincipalScope("bob", 1)}, opts...)
	require.NoError(t, err)
	clk.Advance(30 * time.Second)
	_, err = runlease.ClaimSlots(t.Context(), s, "r2", []runlease.Scope{runlease.MemScope(2)}, opts...)
	require.NoError(t, err)

	occ, err := runlease.Occupancy(t.Context(), s, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.Equal(t, []runlease.SlotInfo{
		{Scope: "mem", Slot: 0, RunID: "r1", Until: epoch.Add(time.Minute), Key: "runslot:mem:0"},
		{Scope: "mem", Slot: 1, RunID: "r2", Until: epoch.Add(90 * time.Second), Key: "runslot:mem:1"},
		{Scope: "principal:bob", Slot: 0, RunID: "r1", Until: epoch.Add(time.Minute), Key: "runslot:principal:bob:0"},
	}, occ)

	clk.Advance(30 * time.Second)
	occ, err = runlease.Occupancy(t.Context(), s, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	require.Len(t, occ, 1, "r1's slots expired")
	assert.Equal(t, "r2", occ[0].RunID)
}

// scanHook is a store that runs a function once, after the next scan and
// before its reply: other claimants moving between a claim's scan and its
// write.
type scanHook struct {
	runlease.Store
	then func()
}

func (h *scanHook) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	rows, err := h.Store.MetaScan(ctx, prefix)
	if fn := h.then; fn != nil {
		h.then = nil
		fn()
	}
	return rows, err
}

// TestClaimOfOneScopeScansAgainAfterLosingEveryRace: a claim whose every
// candidate slot was taken between its scan and its writes scans again and
// takes a slot freed meanwhile, rather than report the scope full.
func TestClaimOfOneScopeScansAgainAfterLosingEveryRace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 2)}
	x, err := runlease.ClaimSlots(ctx, s, "x", gpu)
	require.NoError(t, err)
	y, err := runlease.ClaimSlots(ctx, s, "y", gpu)
	require.NoError(t, err)
	require.Equal(t, 1, y.Held()[0].Slot)
	require.NoError(t, x.Release(ctx)) // slot 0 free, slot 1 y's

	h := &scanHook{Store: s}
	h.then = func() {
		r, err := runlease.ClaimSlots(ctx, s, "r", gpu) // takes slot 0, z's one candidate
		require.NoError(t, err)
		require.Equal(t, 0, r.Held()[0].Slot)
		require.NoError(t, y.Release(ctx)) // and slot 1 frees
	}
	z, err := runlease.ClaimSlots(ctx, h, "z", gpu)
	require.NoError(t, err, "a slot was free when the claim wrote")
	assert.Equal(t, 1, z.Held()[0].Slot)
	_, err = runlease.ClaimSlots(ctx, s, "w", gpu)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "r and z hold both slots")
}

// TestLeaseClaimSlotsTakesTheLeasesTerms claims slots through a lease with
// a short TTL and an injected clock: the slots are the run's, stamped by the
// lease's clock with the lease's TTL, so a crashed driver's slots free when
// its lease does, not after the 10-minute default.
func TestLeaseClaimSlotsTakesTheLeasesTerms(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(epoch)
	l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
	require.NoError(t, err)

	slots, err := l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.NoError(t, err)
	assert.Equal(t, "r", slots.RunID())
	assert.Equal(t, runlease.MinTTL, slots.TTL())
	held := slots.Held()
	require.Len(t, held, 1)
	assert.Equal(t, epoch.Add(runlease.MinTTL), held[0].Until, "stamped by the lease's clock, with its TTL")

	// The driver crashes: neither is renewed. Once the lease's TTL has
	// passed, another run gets the slot.
	clk.Advance(runlease.MinTTL)
	other, err := runlease.ClaimSlots(ctx, s, "r2", []runlease.Scope{runlease.MemScope(1)}, runlease.WithClock(clk.Now))
	require.NoError(t, err, "the slot freed with the lease")
	assert.Len(t, other.Held(), 1)
}

// TestLeaseClaimSlotsKeptWithTheLease keeps slots claimed through the lease:
// KeepSlots takes them, and the keeper renews both.
func TestLeaseClaimSlotsKeptWithTheLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(runlease.MinTTL))
	require.NoError(t, err)
	slots, err := l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(2), runlease.PrincipalScope("p", 1)})
	require.NoError(t, err)
	k, err := runlease.Keep(ctx, l, runlease.KeepSlots(slots), runlease.KeepInterval(runlease.MinKeepInterval))
	require.NoError(t, err)
	before := slots.Held()[0].Until
	require.Eventually(t, func() bool { return slots.Held()[0].Until.After(before) }, 10*time.Second, 10*time.Millisecond,
		"the keeper renews the slots")
	require.NoError(t, k.Release(ctx))
	occ, err := runlease.Occupancy(ctx, s)
	require.NoError(t, err)
	assert.Empty(t, occ, "released with the lease")
}

// TestLeaseClaimSlotsRefusedOnceLost claims through a lease that was taken
// over, and one being released: nothing is written.
func TestLeaseClaimSlotsRefusedOnceLost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	a, err := runlease.Acquire(ctx, s, "r", "A", opts...)
	require.NoError(t, err)
	clk.Advance(runlease.MinTTL)
	b, err := runlease.Acquire(ctx, s, "r", "B", opts...)
	require.NoError(t, err)
	require.ErrorIs(t, a.Renew(ctx), runlease.ErrTakenOver)
	before := rows(t, s)

	_, err = a.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	require.NoError(t, b.Release(ctx))
	_, err = b.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.ErrorIs(t, err, runlease.ErrReleased)
	occ, err := runlease.Occupancy(ctx, s, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.Empty(t, occ)
	assert.Len(t, rows(t, s), len(before), "no slot row was written")
}

// TestLeaseClaimSlotsOfASupersededLeaseClaimsNothing: a driver whose lease
// expired unnoticed (its Lease has not renewed since its successor took the
// run over) claims through it, in a scope with a slot free beside the
// successor's. An unfenced claim would take that slot for a run the driver
// no longer drives. The claim is fenced by the lease row and fails as a
// loss, writing nothing.
func TestLeaseClaimSlotsOfASupersededLeaseClaimsNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	mem := []runlease.Scope{runlease.MemScope(2)}
	stale, err := runlease.Acquire(ctx, s, "r", "D2", opts...)
	require.NoError(t, err)
	clk.Advance(runlease.MinTTL)
	successor, err := runlease.Acquire(ctx, s, "r", "D1", opts...)
	require.NoError(t, err)
	held, err := successor.ClaimSlots(ctx, mem)
	require.NoError(t, err)
	before := rows(t, s)

	_, err = stale.ClaimSlots(ctx, mem)
	require.ErrorIs(t, err, runlease.ErrTakenOver, "the stale lease learns it is lost")
	assert.Equal(t, before, rows(t, s), "nothing was written")

	require.NoError(t, held.Renew(ctx), "the successor's slot is still its own")
	_, err = runlease.ClaimSlots(ctx, s, "other", mem, runlease.WithClock(clk.Now))
	require.NoError(t, err, "the free slot is still free")
}

// TestLeaseClaimSlotsRenewsTheLease: the fenced claim writes the lease row
// too, in the same batch, so a claim is also a renewal.
func TestLeaseClaimSlotsRenewsTheLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(epoch)
	l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
	require.NoError(t, err)
	clk.Advance(time.Second)
	_, err = l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.NoError(t, err)
	assert.Equal(t, epoch.Add(time.Second+runlease.MinTTL), l.Expiry())
	require.NoError(t, l.Renew(ctx), "the lease goes on from the row the claim wrote")
}

// TestLeaseClaimSlotsRefusesMoreScopesThanItsBatchTakes: the fenced batch
// also writes the lease row, so a claim through a lease takes one scope
// fewer than MaxBatch; more are refused before anything is read.
func TestLeaseClaimSlotsRefusesMoreScopesThanItsBatchTakes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	l, err := runlease.Acquire(ctx, s, "r", "A")
	require.NoError(t, err)
	scopes := make([]runlease.Scope, runlease.MaxBatch)
	for i := range scopes {
		scopes[i] = runlease.NamedScope("s"+strconv.Itoa(i), 1)
	}
	before := rows(t, s)
	_, err = l.ClaimSlots(ctx, scopes)
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	assert.ErrorContains(t, err, "at most 255")
	assert.Equal(t, before, rows(t, s))
	slots, err := l.ClaimSlots(ctx, scopes[:runlease.MaxBatch-1])
	require.NoError(t, err)
	assert.Len(t, slots.Held(), runlease.MaxBatch-1)
}
