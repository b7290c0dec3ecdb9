package runlease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestSlotRowsBelongToOneClaim: a slot row is the row of the one claim
// that wrote it, as a lease's row is its Lease's. A second claim of the
// same run (a driver that abandoned its claim, or a later driver while an
// earlier one's keeper still runs) takes rows of its own, or is refused
// when the scope has no room beside the first claim's: it never re-uses
// the first's row, so its Release can never free a slot the first still
// trusts and let another run past the limit.
func TestSlotRowsBelongToOneClaim(t *testing.T) {
	t.Parallel()
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()

			t.Run("a_second_claim_takes_a_row_of_its_own", func(t *testing.T) {
				t.Parallel()
				ctx, s := t.Context(), st.open(t)
				mem := []runlease.Scope{runlease.MemScope(3)}
				_, err := runlease.ClaimSlots(ctx, s, "other", mem)
				require.NoError(t, err)
				first, err := runlease.ClaimSlots(ctx, s, "r1", mem)
				require.NoError(t, err)
				firstRow := get(t, s, first.Held()[0].Key)
				second, err := runlease.ClaimSlots(ctx, s, "r1", mem)
				require.NoError(t, err)
				require.Len(t, second.Held(), 1)
				assert.NotEqual(t, first.Held()[0].Key, second.Held()[0].Key, "the second claim took the first's row")
				assert.Equal(t, firstRow, get(t, s, first.Held()[0].Key), "the second claim wrote over the first's row")

				require.NoError(t, second.Release(ctx))
				assert.Equal(t, firstRow, get(t, s, first.Held()[0].Key), "the second's release freed the first's slot")
				require.NoError(t, first.Renew(ctx))
				require.Len(t, first.Held(), 1)
				_, err = runlease.ClaimSlots(ctx, s, "r2", mem)
				require.NoError(t, err, "the second claim's slot is free again")
				_, err = runlease.ClaimSlots(ctx, s, "r3", mem)
				require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "other, r1's first claim and r2 fill the scope")
			})

			t.Run("a_second_claim_in_a_full_scope_is_refused", func(t *testing.T) {
				t.Parallel()
				ctx, s := t.Context(), st.open(t)
				gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
				first, err := runlease.ClaimSlots(ctx, s, "r1", gpu)
				require.NoError(t, err)
				before := rows(t, s)
				second, err := runlease.ClaimSlots(ctx, s, "r1", gpu)
				if err == nil {
					// Shared with the first: its release frees the row the
					// first still trusts, and r2 takes the slot.
					require.NoError(t, second.Release(ctx))
					_, err2 := runlease.ClaimSlots(ctx, s, "r2", gpu)
					t.Fatalf("the second claim shared the first's row (r2's claim after its release: %v)", err2)
				}
				var limit *runlease.ConcurrencyLimitError
				require.ErrorAs(t, err, &limit)
				assert.Equal(t, 1, limit.Held, "the first claim's row is in use")
				assert.Equal(t, before, rows(t, s), "a refusal writes nothing")

				require.NoError(t, first.Release(ctx))
				_, err = runlease.ClaimSlots(ctx, s, "r1", gpu)
				require.NoError(t, err, "released, the slot is free for the run again")
			})

			t.Run("an_explanation_counts_the_runs_own_rows_as_used", func(t *testing.T) {
				t.Parallel()
				ctx, s := t.Context(), st.open(t)
				gpu := []runlease.Scope{runlease.NamedScope("gpu", 2)}
				_, err := runlease.ClaimSlots(ctx, s, "r1", gpu)
				require.NoError(t, err)
				_, err = runlease.ClaimSlots(ctx, s, "other", gpu)
				require.NoError(t, err)
				ex, err := runlease.ExplainSlots(ctx, s, "r1", gpu)
				require.NoError(t, err)
				g := ex.Scopes[0]
				assert.Equal(t, 2, g.Used)
				assert.Equal(t, 1, g.Own)
				assert.Equal(t, "capacity", g.BlockedBy, "a new claim of r1 needs a slot of its own")
				assert.False(t, ex.Admissible)
			})
		})
	}
}

// TestSlotRowsOfAnEarlierDriverStayItsOwn: the driver of run r claims the
// only slot of a scope and keeps it with KeepSlotsStrict. The same holder
// re-enters the run (a restarted driver, while the first still runs) and
// claims through its new lease: the slot is the first claim's, so the
// claim is refused rather than written over it. Had it re-used the row,
// its release would free the slot the first keeper still trusts, and a
// second run would hold a scope of limit 1 beside it.
func TestSlotRowsOfAnEarlierDriverStayItsOwn(t *testing.T) {
	t.Parallel()
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ctx, s := t.Context(), st.open(t)
			mem := []runlease.Scope{runlease.MemScope(1)}
			first, err := runlease.Acquire(ctx, s, "r", "D1")
			require.NoError(t, err)
			slots, err := first.ClaimSlots(ctx, mem)
			require.NoError(t, err)
			k, err := runlease.Keep(ctx, first, runlease.KeepSlotsStrict(slots))
			require.NoError(t, err)
			t.Cleanup(k.Stop)
			row := get(t, s, slots.Held()[0].Key)

			again, err := runlease.Acquire(ctx, s, "r", "D1") // re-entry: a higher fence
			require.NoError(t, err)
			second, err := again.ClaimSlots(ctx, mem)
			if err == nil {
				require.NoError(t, second.Release(ctx))
				_, err2 := runlease.ClaimSlots(ctx, s, "other", mem)
				t.Fatalf("the later driver's claim shared the kept slot (another run's claim after its release: %v)", err2)
			}
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
			assert.Equal(t, row, get(t, s, slots.Held()[0].Key), "the kept slot's row is untouched")
			_, err = runlease.ClaimSlots(ctx, s, "other", mem)
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the kept claim still fills the scope")
		})
	}
}

// TestSlotRowsOfAnAbandonedClaimFreeAtTheirExpiry: a claim that is dropped
// without a release (its driver died) leaves its row live: the run's next
// claim is refused while the scope has no room beside it, for at most the
// row's TTL, and then takes the slot as any free one.
func TestSlotRowsOfAnAbandonedClaimFreeAtTheirExpiry(t *testing.T) {
	t.Parallel()
	ctx, s, clk := t.Context(), newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	_, err := runlease.ClaimSlots(ctx, s, "r", gpu, opts...)
	require.NoError(t, err)
	clk.Advance(runlease.MinTTL - time.Millisecond)
	_, err = runlease.ClaimSlots(ctx, s, "r", gpu, opts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the abandoned claim's row may still be trusted")
	clk.Advance(time.Millisecond)
	again, err := runlease.ClaimSlots(ctx, s, "r", gpu, opts...)
	require.NoError(t, err, "expired, the row is a free slot")
	require.Len(t, again.Held(), 1)
}

// TestSlotRowsOfAnEarlierClaimMakeAWaitOfTheRunWait: ClaimSlotsWait of a run
// whose earlier claim holds the only slot queues, rather than taking that
// claim's row, and is admitted once the earlier claim releases it.
func TestSlotRowsOfAnEarlierClaimMakeAWaitOfTheRunWait(t *testing.T) {
	t.Parallel()
	ctx, s := t.Context(), newSQLite(t)
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	first, err := runlease.ClaimSlots(ctx, s, "r", gpu)
	require.NoError(t, err)
	res := waitInBackground(ctx, s, "r", gpu)
	awaitWaiting(t, s, "r", res)
	require.Len(t, first.Held(), 1, "the earlier claim still holds its slot")

	require.NoError(t, first.Release(ctx))
	got := <-res
	require.NoError(t, got.err)
	require.Len(t, got.slots.Held(), 1)
	require.NoError(t, got.slots.Release(ctx))
	left, err := s.MetaScan(ctx, runlease.SlotPrefix)
	require.NoError(t, err)
	assert.Empty(t, left, "released, the wait's slot is freed")
}

// TestSlotRowsLeftByAFailedClaimAreTheRunsAgain: a claim whose write
// landed but whose reply was lost, and whose read-back failed, returns a
// fault and no Slots: its row is the run's, trusted by nobody. The process
// knows it sent those bytes, so the run's next claim takes that row as a
// free slot rather than being kept out of a full scope by its own leftover
// for a TTL, and a Release of any claim of the run deletes such leftovers
// in other scopes, so that a run that gives its slots back leaves none.
func TestSlotRowsLeftByAFailedClaimAreTheRunsAgain(t *testing.T) {
	t.Parallel()
	lost := func(t *testing.T, f *testkit.Faulty, scope runlease.Scope) {
		t.Helper()
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
		_, err := runlease.ClaimSlots(t.Context(), f, "r", []runlease.Scope{scope})
		require.ErrorIs(t, err, runlease.ErrStorage)
		left, err := f.MetaScan(t.Context(), runlease.SlotPrefix)
		require.NoError(t, err)
		require.Len(t, left, 1, "the failed claim's row landed")
	}

	t.Run("the_next_claim_takes_it", func(t *testing.T) {
		t.Parallel()
		ctx, f := t.Context(), &testkit.Faulty{Store: newSQLite(t)}
		gpu := runlease.NamedScope("gpu", 1)
		lost(t, f, gpu)
		sl, err := runlease.ClaimSlots(ctx, f, "r", []runlease.Scope{gpu})
		require.NoError(t, err, "the run's own leftover is a free slot for it")
		_, err = runlease.ClaimSlots(ctx, f, "other", []runlease.Scope{gpu})
		require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
		require.NoError(t, sl.Release(ctx))
		assert.Empty(t, rows(t, f))
	})

	t.Run("a_release_of_the_run_deletes_it", func(t *testing.T) {
		t.Parallel()
		ctx, f := t.Context(), &testkit.Faulty{Store: newSQLite(t)}
		lost(t, f, runlease.NamedScope("gpu", 1))
		sl, err := runlease.ClaimSlots(ctx, f, "r", []runlease.Scope{runlease.NamedScope("cpu", 1)})
		require.NoError(t, err)
		require.NoError(t, sl.Release(ctx))
		assert.Empty(t, rows(t, f), "the failed claim's row in gpu went with the release")
		_, err = runlease.ClaimSlots(ctx, f, "other", []runlease.Scope{runlease.NamedScope("gpu", 1)})
		require.NoError(t, err)
	})
}
