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
