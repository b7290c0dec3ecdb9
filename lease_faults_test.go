package runlease_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestLeaseFaultsAreNeverLossesNorLossesSuccesses holds the regression
// cases of the lease's unknown-outcome rules (CONCURRENCY.md, rules 5 and
// 6): a fault is never reported as a loss, a loss never as success, and a
// write that did not land is never reported as landed.
func TestLeaseFaultsAreNeverLossesNorLossesSuccesses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// Every subtest runs on a clock that does not move, so the rows of
	// two writes would have the same until_ms if nothing kept them apart.
	setupClock := func(t *testing.T) (*testkit.Faulty, *runlease.Lease, *testkit.Clock) {
		t.Helper()
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		l, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		return f, l, clk
	}
	setup := func(t *testing.T) (*testkit.Faulty, *runlease.Lease) {
		f, l, _ := setupClock(t)
		return f, l
	}

	t.Run("every_row_a_lease_writes_differs_from_the_ones_before", func(t *testing.T) {
		t.Parallel()
		f, l := setup(t)
		seen := map[string]bool{get(t, f, "runlease:r1"): true}
		for i := range 20 {
			require.NoError(t, l.Renew(ctx))
			row := get(t, f, "runlease:r1")
			require.False(t, seen[row], "renewal %d wrote a row it had written before: %s", i, row)
			seen[row] = true
		}
	})

	t.Run("a_fenced_write_that_did_not_land_in_the_same_millisecond_is_not_success", func(t *testing.T) {
		t.Parallel()
		f, l := setup(t)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaBatch")})
		err := l.Write(ctx, runlease.Put("ckpt:r1", "1"))
		require.ErrorIs(t, err, runlease.ErrOutcomeUnknown, "the batch did not land: never reported as landed")
		require.NotErrorIs(t, err, runlease.ErrLeaseLost)
		_, found, err := f.MetaGet(ctx, "ckpt:r1")
		require.NoError(t, err)
		require.False(t, found)
	})

	t.Run("a_fenced_write_after_a_lost_renewal_reply_is_not_a_loss", func(t *testing.T) {
		t.Parallel()
		f, l := setup(t)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, l.Renew(ctx), runlease.ErrOutcomeUnknown, "landed, but neither reply nor read-back came")
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaBatch")})
		require.NoError(t, l.Write(ctx, runlease.Put("ckpt:r1", "1")),
			"the row read back is this lease's own: the batch did not land, so it is sent again")
		assert.Equal(t, "1", get(t, f, "ckpt:r1"))
		require.NoError(t, l.Renew(ctx))
	})

	t.Run("a_renewal_whose_read_back_fails_is_a_fault_not_a_loss", func(t *testing.T) {
		t.Parallel()
		f, l := setup(t)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, l.Renew(ctx), runlease.ErrOutcomeUnknown)
		f.FailReads(1) // the next renewal finds the row changed, and cannot read it
		err := l.Renew(ctx)
		require.ErrorIs(t, err, runlease.ErrStorage)
		require.NotErrorIs(t, err, runlease.ErrLeaseLost)
		require.NoError(t, l.Renew(ctx), "and the lease is still held")
	})

	t.Run("any_number_of_unconfirmed_renewals_is_recognised", func(t *testing.T) {
		t.Parallel()
		f, l, clk := setupClock(t)
		// Twelve renewals whose outcome stays unknown, each read-back
		// failing too: the first eleven did not apply, the last did.
		for i := range 12 {
			clk.Advance(time.Second) // every row differs, as time goes on
			f.Next(testkit.Fault{Apply: i == 11, Err: testkit.Unknown("MetaCAS")})
			f.FailReads(1)
			require.ErrorIs(t, l.Renew(ctx), runlease.ErrOutcomeUnknown)
		}
		clk.Advance(time.Second)
		require.NoError(t, l.Renew(ctx), "the row that landed, the 12th, is this lease's own")
		require.NoError(t, l.Release(ctx))
	})

	t.Run("a_reentry_whose_reply_was_lost_never_shares_a_fence", func(t *testing.T) {
		t.Parallel()
		// The holder's earlier Lease wrote its row in this millisecond;
		// a re-entry of the same holder then sends the same bytes over
		// the same (absent) row, its write does not apply, and its reply
		// is lost. Reading back the earlier row must not make it a
		// second Lease at fence 1.
		f, first, clk := setupClock(t)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
		second, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Equal(t, uint64(2), second.Fence(), "a re-entry is above the Lease it supersedes")
		require.ErrorIs(t, first.Renew(ctx), runlease.ErrTakenOver, "the earlier Lease is superseded")
		require.NoError(t, second.Renew(ctx))
	})

	t.Run("a_reentry_over_a_released_row_whose_reply_was_lost_never_shares_a_fence", func(t *testing.T) {
		t.Parallel()
		// As above, over a released row: the re-entry writes over the
		// row this process released, the earlier Lease takes it over at
		// fence 2, and the re-entry's takeover at fence 2 (the same
		// bytes) does not apply and loses its reply.
		f, l, clk := setupClock(t)
		require.NoError(t, l.Release(ctx))
		var first *runlease.Lease
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS"), Then: func() {
			var err error
			first, err = runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
			require.NoError(t, err)
			require.Equal(t, uint64(2), first.Fence())
		}})
		second, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.NotNil(t, first)
		assert.Equal(t, uint64(3), second.Fence())
		require.ErrorIs(t, first.Renew(ctx), runlease.ErrTakenOver)
		require.NoError(t, second.Renew(ctx))
	})

	t.Run("an_acquisition_whose_reply_is_lost_holds_the_row_it_reads_back", func(t *testing.T) {
		t.Parallel()
		// The create of a new run's acquisition lands and loses its
		// reply: the row read back is the one it sent, which no other
		// Lease sends, so the acquisition holds the run.
		f, _, clk := setupClock(t)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		l, err := runlease.Acquire(ctx, f, "r2", "B", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Equal(t, uint64(1), l.Fence())
		require.NoError(t, l.Renew(ctx))
	})

	t.Run("a_reentry_whose_reply_was_lost_holds_the_row_it_reads_back", func(t *testing.T) {
		t.Parallel()
		// The re-entry's takeover at fence 2, in the millisecond of the
		// first Lease's row, lands and loses its reply; its read-back finds
		// the row it sent. The first Lease never sends those bytes (every
		// row of the holder's Leases of a run is stamped apart), so the
		// row is the re-entry's, and the first Lease is superseded.
		f, first, clk := setupClock(t)
		f.Next(testkit.Fault{Apply: true}, // the create-if-absent, refused: the row exists
			testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		second, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Equal(t, uint64(2), second.Fence())
		require.ErrorIs(t, first.Renew(ctx), runlease.ErrTakenOver, "the first Lease is superseded")
		require.NoError(t, second.Renew(ctx))
	})

	t.Run("a_takeover_at_the_last_fence_whose_reply_was_lost_holds_it", func(t *testing.T) {
		t.Parallel()
		// The takeover lands on the largest fence and loses its reply: the
		// row read back is the one it sent, so it holds the run there.
		f, _, clk := setupClock(t)
		put(t, f.Store, "runlease:r2", `{"holder":"","fence":`+strconv.FormatUint(math.MaxUint64-1, 10)+`,"until_ms":0}`)
		f.Next(testkit.Fault{Apply: true}, // the create-if-absent, refused
			testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		l, err := runlease.Acquire(ctx, f, "r2", "B", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Equal(t, uint64(math.MaxUint64), l.Fence())
		require.NoError(t, l.Renew(ctx))
	})

	// A store that is not a pointer has no identity this process can know:
	// its Leases tell their rows apart by the rows alone.
	stores := map[string]func(f *testkit.Faulty) runlease.Store{
		"pointer": func(f *testkit.Faulty) runlease.Store { return f },
		"value":   func(f *testkit.Faulty) runlease.Store { return byValue{f} },
	}
	for name, as := range stores {
		t.Run("a_stale_lease_never_adopts_a_new_acquisition_after_a_prune/"+name, func(t *testing.T) {
			t.Parallel()
			// The row expires and is pruned, and the same holder acquires
			// the run again: fences start over, so the new row has the
			// holder and fence of the stale Lease. It is not a row the
			// stale Lease wrote.
			f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
			s := as(f)
			stale, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
			require.NoError(t, err)
			clk.Advance(runlease.DefaultTTL + time.Minute)
			pruned, err := runlease.Prune(ctx, s, 0, runlease.WithClock(clk.Now))
			require.NoError(t, err)
			require.Equal(t, []string{"r1"}, pruned.Leases)
			fresh, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
			require.NoError(t, err)
			require.Equal(t, stale.Fence(), fresh.Fence(), "the premise: the new lineage starts at the same fence")
			clk.Advance(time.Second)
			require.ErrorIs(t, stale.Renew(ctx), runlease.ErrTakenOver)
			require.ErrorIs(t, stale.Write(ctx, runlease.Put("ckpt:r1", "stale")), runlease.ErrLeaseLost)
			require.NoError(t, fresh.Renew(ctx))
			require.NoError(t, fresh.Write(ctx, runlease.Put("ckpt:r1", "fresh")))
			assert.Equal(t, "fresh", get(t, f, "ckpt:r1"))
		})

		t.Run("a_refused_write_is_not_confirmed_by_an_equal_row_of_a_new_acquisition/"+name, func(t *testing.T) {
			t.Parallel()
			// A Lease replaced by the same holder's re-entry, which then
			// released the run; the row is pruned and the holder acquires
			// the run again, at fence 1. The old Lease's fenced write, in
			// that millisecond, sends the new row's very bytes: the store
			// refuses it, and the row read back must not make it landed.
			f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
			s := as(f)
			stale, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
			require.NoError(t, err)
			reentry, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
			require.NoError(t, err)
			require.NoError(t, reentry.Release(ctx))
			clk.Advance(time.Millisecond)
			_, err = runlease.Prune(ctx, s, 0, runlease.WithClock(clk.Now))
			require.NoError(t, err)
			fresh, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
			require.NoError(t, err)
			require.Equal(t, stale.Fence(), fresh.Fence())
			require.ErrorIs(t, stale.Write(ctx, runlease.Put("ckpt:r1", "stale")), runlease.ErrTakenOver)
			_, found, err := f.MetaGet(ctx, "ckpt:r1")
			require.NoError(t, err)
			require.False(t, found, "the write never landed")
			require.NoError(t, fresh.Renew(ctx))
		})
	}

	t.Run("a_stale_lease_whose_renewals_are_in_doubt_never_adopts_a_new_acquisition", func(t *testing.T) {
		t.Parallel()
		// As above, with the stale Lease's renewals sent meanwhile and
		// their outcome unknown: none could land (its row is gone), and
		// the new row is none of them, though its until_ms is below theirs.
		f, stale, clk := setupClock(t)
		clk.Advance(runlease.DefaultTTL + time.Minute)
		_, err := runlease.Prune(ctx, f, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		fresh, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now), runlease.WithTTL(runlease.MinTTL))
		require.NoError(t, err)
		for range 3 {
			clk.Advance(time.Millisecond)
			f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
			f.FailReads(1)
			require.ErrorIs(t, stale.Renew(ctx), runlease.ErrOutcomeUnknown)
		}
		require.ErrorIs(t, stale.Renew(ctx), runlease.ErrTakenOver)
		require.NoError(t, fresh.Renew(ctx))
	})

	t.Run("a_write_in_doubt_stamped_as_a_reentry_is_not_adopted_at_another_fence", func(t *testing.T) {
		t.Parallel()
		// On a store whose identity the process cannot know, the row
		// alone decides: a re-entry at fence 2 that stamped what the
		// earlier Lease's renewal in doubt stamped is not that renewal.
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		s := byValue{f}
		first, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, first.Renew(ctx), runlease.ErrOutcomeUnknown)
		clk.Advance(time.Millisecond)
		second, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.Equal(t, uint64(2), second.Fence())
		require.ErrorIs(t, first.Renew(ctx), runlease.ErrTakenOver)
		require.NoError(t, second.Renew(ctx))
	})

	t.Run("a_stale_lease_whose_write_in_doubt_is_never_equal_to_a_new_acquisition", func(t *testing.T) {
		t.Parallel()
		// After the prune, the stale Lease's renewal loses its reply and
		// its read-back; the holder's new acquisition, in that millisecond,
		// would write the very row that renewal sent, but is stamped a
		// millisecond later: the stale Lease sees a row that is not its
		// own, and knows it is taken over.
		f, stale, clk := setupClock(t)
		clk.Advance(runlease.DefaultTTL + time.Minute)
		_, err := runlease.Prune(ctx, f, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, stale.Renew(ctx), runlease.ErrOutcomeUnknown)
		fresh, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.Equal(t, stale.Fence(), fresh.Fence())
		assert.Equal(t, clk.Now().Add(runlease.DefaultTTL+time.Millisecond).UnixMilli(), fresh.Expiry().UnixMilli(),
			"stamped a millisecond past the stale Lease's renewal in doubt")
		require.ErrorIs(t, stale.Renew(ctx), runlease.ErrTakenOver)
		require.ErrorIs(t, stale.Write(ctx, runlease.Put("ckpt:r1", "stale")), runlease.ErrLeaseLost)
		require.NoError(t, fresh.Renew(ctx))
		require.NoError(t, fresh.Write(ctx, runlease.Put("ckpt:r1", "fresh")))
		assert.Equal(t, "fresh", get(t, f, "ckpt:r1"))
	})

	t.Run("a_write_in_doubt_is_told_from_a_later_acquisition_of_unknown_outcome", func(t *testing.T) {
		t.Parallel()
		// As above, but the holder's later acquisition lands and fails
		// with an unknown outcome of its own: its row is still not one the
		// stale Lease sent, so the stale Lease knows it is taken over.
		f, stale, clk := setupClock(t)
		clk.Advance(runlease.DefaultTTL + time.Minute)
		_, err := runlease.Prune(ctx, f, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, stale.Renew(ctx), runlease.ErrOutcomeUnknown)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		_, err = runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
		require.ErrorIs(t, stale.Renew(ctx), runlease.ErrTakenOver)
		require.ErrorIs(t, stale.Err(), runlease.ErrTakenOver)
	})

	t.Run("a_fenced_read_of_a_stale_lease_never_adopts_a_new_acquisition", func(t *testing.T) {
		t.Parallel()
		f, stale, clk := setupClock(t)
		clk.Advance(runlease.DefaultTTL + time.Minute)
		_, err := runlease.Prune(ctx, f, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		_, err = runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		_, _, err = stale.Read(ctx, "ckpt:r1")
		require.ErrorIs(t, err, runlease.ErrTakenOver)
	})

	t.Run("a_release_whose_reply_was_lost_is_not_undone_by_a_renewal", func(t *testing.T) {
		t.Parallel()
		f, l := setup(t)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, l.Release(ctx), runlease.ErrOutcomeUnknown)
		require.ErrorIs(t, l.Renew(ctx), runlease.ErrReleased, "the tombstone is not a row to renew over")
		require.NoError(t, l.Release(ctx), "releasing a released lease succeeds")
		info, err := runlease.Peek(ctx, f, "r1")
		require.NoError(t, err)
		assert.True(t, info.Released)
	})

	t.Run("a_release_retried_after_a_lost_reply_succeeds", func(t *testing.T) {
		t.Parallel()
		f, l := setup(t)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, l.Release(ctx), runlease.ErrOutcomeUnknown)
		require.NoError(t, l.Release(ctx))
	})
}

func TestRowsNeverExpireBeforeTheirAttemptIsTTLOld(t *testing.T) {
	t.Parallel()
	// A clock reading with a fraction of a millisecond: rounding down would
	// make the row expire up to a millisecond early, eating the margin.
	clk := testkit.NewClock(epoch.Add(400 * time.Microsecond))
	s := newSQLite(t)
	l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
	require.NoError(t, err)
	for i := range 3 {
		row := get(t, s, "runlease:r1")
		info, err := runlease.Peek(t.Context(), s, "r1")
		require.NoError(t, err)
		require.False(t, info.Until.Before(clk.Now().Add(runlease.MinTTL)), "write %d: %s", i, row)
		clk.Advance(time.Second + 300*time.Microsecond)
		require.NoError(t, l.Renew(t.Context()))
	}
}

func TestAcquireRetriesRacesLostOnAFreeRow(t *testing.T) {
	t.Parallel()
	inner := newSQLite(t)
	f := &testkit.Faulty{Store: inner}
	put(t, inner, "runlease:r1", `{"holder":"","fence":3,"until_ms":1}`)
	// Ten times in a row another driver releases and re-releases the row
	// between the read and the write: each race is lost, the row stays free.
	for i := range 10 {
		f.Next(testkit.Fault{Apply: false, Then: func() {
			cur := get(t, inner, "runlease:r1")
			next := `{"holder":"","fence":` + strconv.Itoa(4+i) + `,"until_ms":1}`
			ok, err := inner.MetaCAS(t.Context(), "runlease:r1", &cur, next)
			require.NoError(t, err)
			require.True(t, ok)
		}})
	}
	l, err := runlease.Acquire(t.Context(), f, "r1", "A")
	require.NoError(t, err, "a free row is retried, never reported as released")
	assert.Equal(t, uint64(14), l.Fence())
}

func TestAcquireRefusalSaysTheRunIsHeldNotLost(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	_, err := runlease.Acquire(t.Context(), s, "r1", "worker-1")
	require.NoError(t, err)
	for _, holder := range []string{"worker-10", "worker-", "worker", "worker-1 "} {
		_, err = runlease.Acquire(t.Context(), s, "r1", holder)
		require.ErrorIs(t, err, runlease.ErrTakenOver, "holder %q shares a prefix with the live holder", holder)
		assert.Contains(t, err.Error(), `run "r1" is held by another holder`)
	}
}

// byValue is a store that is not a pointer.
type byValue struct{ *testkit.Faulty }

func TestUnknownOutcomesAreResolvedByReading(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	newFaulty := func(t *testing.T) (*testkit.Faulty, *testkit.Clock) {
		return &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	}

	t.Run("an_applied_acquire_whose_reply_was_lost_is_held", func(t *testing.T) {
		t.Parallel()
		s, clk := newFaulty(t)
		s.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		l, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.NoError(t, l.Renew(ctx))
	})

	t.Run("an_acquire_that_did_not_apply_is_a_fault_not_a_loss", func(t *testing.T) {
		t.Parallel()
		s, clk := newFaulty(t)
		s.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
		_, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrStorage)
		assert.NotErrorIs(t, err, runlease.ErrLeaseLost)
		assert.Empty(t, rows(t, s))
	})

	t.Run("a_renewal_that_did_not_apply_can_be_retried", func(t *testing.T) {
		t.Parallel()
		s, clk := newFaulty(t)
		l, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(time.Second)
		s.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
		err = l.Renew(ctx)
		require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
		assert.NotErrorIs(t, err, runlease.ErrLeaseLost, "never a false loss")
		require.NoError(t, l.Renew(ctx))
		requireExpiryAtLeast(t, clk.Now().Add(runlease.DefaultTTL), l.Expiry())
	})

	t.Run("an_applied_renewal_whose_reply_was_lost_counts", func(t *testing.T) {
		t.Parallel()
		s, clk := newFaulty(t)
		l, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(time.Second)
		s.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		require.NoError(t, l.Renew(ctx))
		clk.Advance(time.Second)
		require.NoError(t, l.Renew(ctx), "the next renewal presents the row that landed")
	})

	t.Run("a_renewal_whose_outcome_stayed_unknown_is_not_a_later_loss", func(t *testing.T) {
		t.Parallel()
		s, clk := newFaulty(t)
		l, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		for range 3 { // applied each time, but neither the reply nor a read-back got through
			clk.Advance(time.Second)
			s.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
			s.FailReads(1)
			require.ErrorIs(t, l.Renew(ctx), runlease.ErrOutcomeUnknown)
		}
		clk.Advance(time.Second)
		require.NoError(t, l.Renew(ctx), "the row that landed is recognised as this lease's own")
		requireExpiryAtLeast(t, clk.Now().Add(runlease.DefaultTTL), l.Expiry())
		require.NoError(t, l.Release(ctx))
	})

	t.Run("a_renewal_refused_before_sending_is_not_resolved", func(t *testing.T) {
		t.Parallel()
		s, clk := newFaulty(t)
		l, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		s.Next(testkit.Fault{Apply: false, Err: testkit.NotApplied("MetaCAS")})
		err = l.Renew(ctx)
		require.ErrorIs(t, err, runlease.ErrStorage)
		assert.False(t, runlease.IsOutcomeUnknown(err))
		require.NoError(t, l.Renew(ctx))
	})
}

// TestAcquireCutShortByItsContextReleasesWhatItWrote: Acquire's write
// lands with its reply lost, and the read-back fails because the context
// ended. Acquire releases the row it wrote and returns a fault that changed
// nothing; when that release fails too, the fault stays one of unknown
// outcome, as documented, and the row is the holder's until it expires.
// Either way the Acquired hook hears of a failure, at fence 0.
func TestAcquireCutShortByItsContextReleasesWhatItWrote(t *testing.T) {
	t.Parallel()
	for _, releaseFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("release_fails=%v", releaseFails), func(t *testing.T) {
			t.Parallel()
			f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() {
				f.FailReads(1)
				if releaseFails {
					f.FailWrites(testkit.Prefix(runlease.LeasePrefix))
				}
				cancel()
			}})
			var events []runlease.AcquireEvent
			hooks := runlease.Hooks{Acquired: func(e runlease.AcquireEvent) { events = append(events, e) }}
			l, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now), runlease.WithHooks(hooks))
			require.Nil(t, l)
			require.ErrorIs(t, err, runlease.ErrStorage)
			require.Len(t, events, 1)
			require.Equal(t, runlease.AcquireEvent{RunID: "r1", Holder: "A", Latency: events[0].Latency, Err: err}, events[0],
				"the hook hears of a failure, at fence 0")
			require.Equal(t, releaseFails, runlease.IsOutcomeUnknown(err), "%v", err)
			row := get(t, f, "runlease:r1")
			if releaseFails {
				require.Contains(t, row, `"holder":"A"`, "the row written stays until it expires")
				return
			}
			require.ErrorIs(t, err, context.Canceled, "a fault that changed nothing, for the context's end")
			require.Contains(t, row, `"holder":""`, "the row written is released")
			require.Contains(t, row, `"fence":1`)
		})
	}
}
