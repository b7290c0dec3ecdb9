package runlease_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestSlotRowsOfAFailedClaimAreNeverSentAgain: a claim whose write's
// outcome is unknown leaves a row that the process remembers as trusted by
// no Slots, by its exact text. No later claim of the run may then send
// those same bytes, however long after the failed claim's Slots is gone:
// if one did, a third claim of the run would take that live claim's row as
// a leftover and write over it (and any Release of the run would delete
// it), so two Slots would trust one row and another run would be admitted
// past the limit. The clock stands still, as a coarse clock or two claims
// in one millisecond do, and a collection runs between the claims, as in
// any process.
func TestSlotRowsOfAFailedClaimAreNeverSentAgain(t *testing.T) {
	t.Parallel()
	ctx, f, clk := t.Context(), &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}

	// Sent, perhaps landed later: the row is nobody's.
	f.Next(testkit.Fault{Err: testkit.Unknown("MetaCAS")})
	_, err := runlease.ClaimSlots(ctx, f, "r", gpu, opts...)
	require.True(t, runlease.IsOutcomeUnknown(err), "the claim's outcome is unknown: %v", err)
	runtime.GC()
	runtime.GC()

	first, err := runlease.ClaimSlots(ctx, f, "r", gpu, opts...)
	require.NoError(t, err)
	require.Len(t, first.Held(), 1)
	row := get(t, f, first.Held()[0].Key)

	second, err := runlease.ClaimSlots(ctx, f, "r", gpu, opts...)
	if err == nil {
		require.NoError(t, second.Release(ctx))
		_, err2 := runlease.ClaimSlots(ctx, f, "other", gpu, opts...)
		t.Fatalf("a second claim took the live first claim's row as a leftover (another run's claim after its release: %v)", err2)
	}
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the first claim's row is in use")
	assert.Equal(t, row, get(t, f, first.Held()[0].Key), "the first claim's row is untouched")

	// A Release of another claim of the run leaves it too.
	cpu, err := runlease.ClaimSlots(ctx, f, "r", []runlease.Scope{runlease.NamedScope("cpu", 1)}, opts...)
	require.NoError(t, err)
	require.NoError(t, cpu.Release(ctx))
	assert.Equal(t, row, get(t, f, first.Held()[0].Key), "another claim's release deleted the first claim's row")
	_, err = runlease.ClaimSlots(ctx, f, "other", gpu, opts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the first claim still fills the scope")
}

// TestSlotRowsOfAFailedReleaseGoWithTheRunsNextRelease: a slot whose last
// renewal landed with its reply lost (and its read-back failed) holds the
// renewal's row, not the row its Slots last confirmed. A Release whose
// delete then fails gives the slot up: whichever of those rows the slot
// holds is trusted by no Slots, so the run's next claim may take it and a
// Release of the run deletes it, as the Release's godoc says, rather than
// the run being kept out of its own full scope until the row expires.
func TestSlotRowsOfAFailedReleaseGoWithTheRunsNextRelease(t *testing.T) {
	t.Parallel()
	ctx, f, clk := t.Context(), &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	sl, err := runlease.ClaimSlots(ctx, f, "r", gpu, opts...)
	require.NoError(t, err)
	key := sl.Held()[0].Key
	claimed := get(t, f, key)

	clk.Advance(time.Second)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
	require.True(t, runlease.IsOutcomeUnknown(sl.Renew(ctx)), "the renewal's outcome is unknown")
	require.NotEqual(t, claimed, get(t, f, key), "the renewal landed")

	f.Next(testkit.Fault{Err: testkit.NotApplied("MetaDelete")})
	require.ErrorIs(t, sl.Release(ctx), runlease.ErrStorage)

	again, err := runlease.ClaimSlots(ctx, f, "r", gpu, opts...)
	require.NoError(t, err, "the failed release's row is trusted by no Slots: the run's next claim may take it")
	require.NoError(t, again.Release(ctx))
	assert.Empty(t, rows(t, f), "a release of the run leaves none of its rows behind")
}

// TestSlotRowsLeftByAFailedClaimStayTheRunsAfterARollback: on a store
// without batches, a claim of two scopes takes the run's leftover in the
// first (a row trusted by no Slots) and then loses the second to another
// run: it puts the first back as it was. The row put back is the same
// leftover, still trusted by nobody, so the run's next claim takes it
// rather than being refused by its own row until it expires.
func TestSlotRowsLeftByAFailedClaimStayTheRunsAfterARollback(t *testing.T) {
	t.Parallel()
	ctx, f, clk := t.Context(), &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	p := &testkit.PlainStore{Store: f}
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	gpu, cpu := runlease.NamedScope("gpu", 1), runlease.NamedScope("cpu", 1)

	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
	_, err := runlease.ClaimSlots(ctx, p, "r", []runlease.Scope{gpu}, opts...)
	require.True(t, runlease.IsOutcomeUnknown(err), "the claim's outcome is unknown: %v", err)
	leftover := rows(t, f)
	require.Len(t, leftover, 1, "the failed claim's row landed")

	f.Next(
		testkit.Fault{Apply: true}, // gpu: over the leftover
		testkit.Fault{Then: func() { // cpu: another run takes it first
			_, err := runlease.ClaimSlots(ctx, p, "other", []runlease.Scope{cpu}, opts...)
			require.NoError(t, err)
		}},
	)
	_, err = runlease.ClaimSlots(ctx, p, "r", []runlease.Scope{gpu, cpu}, opts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
	assert.Equal(t, leftover[0].Value, get(t, f, leftover[0].Key), "the rollback put the leftover back")

	sl, err := runlease.ClaimSlots(ctx, p, "r", []runlease.Scope{gpu}, opts...)
	require.NoError(t, err, "the leftover put back is still trusted by no Slots: the run's next claim takes it")
	require.NoError(t, sl.Release(ctx))
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

// TestSlotLeftoverIsNeverAnotherProcesssRow: a claim of run r here sends
// its row and the outcome is unknown; it did not land. The process
// remembers the row as its leftover, trusted by no Slots. Then run r is
// claimed from another process (a second driver, or the reference) in the
// same millisecond with the same TTL: the very row this process sent,
// but for the claim id. The other process's row is in use: the run's next
// claim here does not take it as a free slot, and a Release of the run
// here does not delete it, so a third run is not admitted past the limit.
func TestSlotLeftoverIsNeverAnotherProcesssRow(t *testing.T) {
	t.Parallel()
	const key = "runslot:gpu:0"
	ttl := runlease.DefaultTTL
	steps := []struct {
		name string
		do   func(t *testing.T, here runlease.Store, opts []runlease.Option)
	}{
		{"a_claim_here_does_not_take_it", func(t *testing.T, here runlease.Store, opts []runlease.Option) {
			_, err := runlease.ClaimSlots(t.Context(), here, "r", []runlease.Scope{runlease.NamedScope("gpu", 1)}, opts...)
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "a claim here took the other process's row for its leftover")
		}},
		{"a_release_here_does_not_delete_it", func(t *testing.T, here runlease.Store, opts []runlease.Option) {
			cpu, err := runlease.ClaimSlots(t.Context(), here, "r", []runlease.Scope{runlease.NamedScope("cpu", 1)}, opts...)
			require.NoError(t, err)
			require.NoError(t, cpu.Release(t.Context()))
		}},
	}
	for _, w := range slotWriters {
		for _, step := range steps {
			t.Run(w.name+"/"+step.name, func(t *testing.T) {
				t.Parallel()
				ctx, f := t.Context(), &testkit.Faulty{Store: newSQLite(t)}
				here := process{f, 1}
				opts := []runlease.Option{runlease.WithClock(func() time.Time { return epoch }), runlease.WithTTL(ttl)}
				gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}

				f.Next(testkit.Fault{Err: testkit.Unknown("MetaCAS")}) // sent; it never lands
				_, err := runlease.ClaimSlots(ctx, here, "r", gpu, opts...)
				require.True(t, runlease.IsOutcomeUnknown(err), "the claim's outcome is unknown: %v", err)
				require.Empty(t, rows(t, f), "the claim's write did not land")

				w.write(t, f, key, epoch, ttl)
				theirs := get(t, f, key)

				step.do(t, here, opts)
				assert.Equal(t, theirs, get(t, f, key), "the other process's row was written over or deleted")
				_, err = runlease.ClaimSlots(ctx, f, "other", gpu, opts...)
				require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "limit 1: the slot is the other process's")
			})
		}
	}
}

// TestSlotRowOfAnotherProcessPutBackIsNoLeftover: on a store without
// batches, a claim here of scopes gpu and cpu writes over run r's expired
// row in gpu, a row another process wrote, and then loses cpu to another
// run: it puts gpu's row back as it was. That row is not one this process
// sent, so it is nobody's leftover here: a Release of the run here leaves
// it (its writer's clock may not have let it expire yet).
func TestSlotRowOfAnotherProcessPutBackIsNoLeftover(t *testing.T) {
	t.Parallel()
	const key = "runslot:gpu:0"
	for _, w := range slotWriters {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			ctx, f := t.Context(), &testkit.Faulty{Store: newSQLite(t)}
			here := &testkit.PlainStore{Store: process{f, 1}}
			opts := []runlease.Option{runlease.WithClock(func() time.Time { return epoch })}
			gpu, cpu := runlease.NamedScope("gpu", 1), runlease.NamedScope("cpu", 1)
			w.write(t, f, key, epoch.Add(-time.Minute), 30*time.Second) // expired by the clock here
			theirs := get(t, f, key)

			f.Next(
				testkit.Fault{Apply: true}, // gpu: over the expired row
				testkit.Fault{Then: func() { // cpu: another run takes it first
					_, err := runlease.ClaimSlots(ctx, f, "other", []runlease.Scope{cpu}, opts...)
					require.NoError(t, err)
				}},
			)
			_, err := runlease.ClaimSlots(ctx, here, "r", []runlease.Scope{gpu, cpu}, opts...)
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
			require.Equal(t, theirs, get(t, f, key), "the rollback put the row back")

			mem, err := runlease.ClaimSlots(ctx, here, "r", []runlease.Scope{runlease.MemScope(1)}, opts...)
			require.NoError(t, err)
			require.NoError(t, mem.Release(ctx))
			assert.Equal(t, theirs, get(t, f, key), "a release here deleted the other process's row put back")
		})
	}
}
