package runlease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestSlotsTwinRowIsNeverTakenForOwnRenewal: two Slots values of run r1
// hold the same slot: S2, a second claim by the run whose clock runs a TTL
// ahead of S1's, found S1's row expired and took the slot. S1, 30 s TTL,
// renews 10 s after its claim; S2, 10 s TTL, claimed at S1's expiry by its
// own clock, so both aim at the same until_ms. S1's write is not applied
// and its reply is lost, and it reads back S2's row. Were the two stamped
// apart only by their own writes, S1 would send S2's very bytes, confirm a
// write that never landed, and its Release would delete S2's row: run r2
// would then claim the only slot while S2 still holds it.
func TestSlotsTwinRowIsNeverTakenForOwnRenewal(t *testing.T) {
	ctx := t.Context()
	f, clk1, clk2 := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch), testkit.NewClock(epoch.Add(30*time.Second))
	opts := []runlease.Option{runlease.WithClock(clk1.Now), runlease.WithTTL(30 * time.Second)}
	opts2 := []runlease.Option{runlease.WithClock(clk2.Now), runlease.WithTTL(10 * time.Second)}
	scope := []runlease.Scope{runlease.NamedScope("gpu", 1)}

	s1, err := runlease.ClaimSlots(ctx, f, "r1", scope, opts...)
	require.NoError(t, err)
	s2, err := runlease.ClaimSlots(ctx, f, "r1", scope, opts2...) // S1's row is expired by S2's clock
	require.NoError(t, err)
	s2Row := get(t, f, "runslot:gpu:0")

	clk1.Advance(10 * time.Second)
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	_ = s1.Renew(ctx) // its slot is S2's now: dropped, whatever it reports
	require.Equal(t, s2Row, get(t, f, "runslot:gpu:0"), "S1's renewal wrote nothing")
	require.Empty(t, s1.Held(), "S1 took S2's row for a renewal of its own")
	require.NoError(t, s1.Release(ctx))
	require.Equal(t, s2Row, get(t, f, "runslot:gpu:0"), "S1's release left S2's slot alone")
	_, err = runlease.ClaimSlots(ctx, f, "r2", scope, opts2...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "limit 1: the slot is S2's")
	require.Len(t, s2.Held(), 1)
	require.NoError(t, s2.Renew(ctx))
}

// TestSlotsRowOfAnotherClaimOfTheRunIsNotAdopted: S2, a second claim by
// run r1 whose clock runs a TTL ahead, found S1's row expired and took the
// slot, so the row names r1 but is S2's. S1's renewal is refused and reads
// S2's row back: a row of its run that none of its own writes in doubt
// could have stored. S1 gives the slot up rather than adopt it, and its
// Release leaves S2's slot alone.
func TestSlotsRowOfAnotherClaimOfTheRunIsNotAdopted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	scope := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	clk, ahead := testkit.NewClock(epoch), testkit.NewClock(epoch.Add(runlease.MinTTL))
	s1, err := runlease.ClaimSlots(ctx, s, "r1", scope, runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
	require.NoError(t, err)
	s2, err := runlease.ClaimSlots(ctx, s, "r1", scope, runlease.WithTTL(runlease.MinTTL), runlease.WithClock(ahead.Now))
	require.NoError(t, err)
	s2Row := get(t, s, "runslot:gpu:0")

	_ = s1.Renew(ctx) // its slot is S2's now: dropped, whatever it reports
	require.Empty(t, s1.Held(), "S1 adopted S2's row")
	require.Equal(t, s2Row, get(t, s, "runslot:gpu:0"), "S1's renewal wrote nothing")
	require.NoError(t, s1.Release(ctx))
	require.Equal(t, s2Row, get(t, s, "runslot:gpu:0"), "S1's release left S2's slot alone")
	require.Len(t, s2.Held(), 1)
	require.NoError(t, s2.Renew(ctx))
}

// TestSlotsOfOneRunThroughAWrapperAreStampedApart: a run's successor
// driver, whose clock runs ahead, claims the run's slot through a
// decorator of the store its predecessor used, once the predecessor's row
// is expired by its clock, aiming at the until_ms of the predecessor's
// renewal whose outcome is unknown (30 s TTL, renewed at 10 s; 10 s TTL,
// claimed at 30 s). The predecessor's release must not take the
// successor's row for its own renewal and delete it while the successor
// holds it: the successor's row carries a claim id of its own, so it never
// equals a row the predecessor sent, whichever Store value each used. (The
// lineages' looking through Unwrap is what
// TestLineageLeasesThroughAWrapperAndItsStoreAreStampedApart checks.)
func TestSlotsOfOneRunThroughAWrapperAreStampedApart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := &testkit.Faulty{Store: newSQLite(t)}
	clk, ahead := testkit.NewClock(epoch), testkit.NewClock(epoch.Add(30*time.Second))
	opts := []runlease.Option{runlease.WithClock(clk.Now), runlease.WithTTL(30 * time.Second)}
	aheadOpts := []runlease.Option{runlease.WithClock(ahead.Now), runlease.WithTTL(10 * time.Second)}
	mem := []runlease.Scope{runlease.MemScope(1)}
	before, err := runlease.ClaimSlots(ctx, f, "r", mem, opts...)
	require.NoError(t, err)
	clk.Advance(10 * time.Second)
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	require.Error(t, before.Renew(ctx), "the renewal's outcome is unknown")

	after, err := runlease.ClaimSlots(ctx, wrapped{f}, "r", mem, aheadOpts...)
	require.NoError(t, err)
	row := get(t, f, "runslot:mem:0")
	require.NoError(t, before.Release(ctx))
	assert.Equal(t, row, get(t, f, "runslot:mem:0"), "the successor's row is not the predecessor's to delete")
	require.NoError(t, after.Renew(ctx))
	_, err = runlease.ClaimSlots(ctx, f, "other", mem, aheadOpts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the run still holds the slot")
}
