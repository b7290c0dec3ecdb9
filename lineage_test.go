package runlease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestLineageEarlierBegunAcquisitionThatWonLaterIsNotSuperseded: two
// acquisitions by one holder run concurrently (re-entry is allowed by
// design). The one that began first (G1) loses the create race to the one
// that began second (G2), re-enters over it and wins fence 2: G1 is now the
// run's only valid Lease. The lineage, though, records "the latest begun
// acquisition (G2) won fence 1", so when G1's renewal lands with its reply
// lost and the read-back finds G1's own row, judgeAmbiguous declares G1
// superseded. A fault is reported as a lost lease, while the stored row is
// G1's own; nobody holds the run any more.
func TestLineageEarlierBegunAcquisitionThatWonLaterIsNotSuperseded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}

	var g2 *runlease.Lease
	// G1's first write (the create) is overtaken by G2, which began after
	// G1 and finishes first; G1's create is then refused.
	f.Next(testkit.Fault{Apply: false, Then: func() {
		var err error
		g2, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
		require.NoError(t, err)
	}})
	g1, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)
	require.NotNil(t, g2)
	require.Equal(t, uint64(1), g2.Fence())
	require.Equal(t, uint64(2), g1.Fence(), "G1 re-entered over G2: it is the run's holder")
	require.ErrorIs(t, g2.Renew(ctx), runlease.ErrTakenOver, "G2 is superseded by G1")

	// G1's renewal lands, its reply lost.
	clk.Advance(time.Millisecond)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
	err = g1.Renew(ctx)
	row := get(t, f, "runlease:r1")
	require.NotErrorIs(t, err, runlease.ErrLeaseLost,
		"a fault was reported as a lost lease; the row stored is G1's own: %s", row)
	require.NoError(t, g1.Err())
}

// TestLineageStaleLeaseNeverAdoptsAnAcquisitionThatBeganBeforeIt:
// the lineage judges "later" by the order acquisitions began, not the
// order they won. G1 begins, its create is overtaken: G2 (same holder)
// acquires fence 1, stalls past its TTL, sends a renewal whose outcome is
// unknown (not applied), and its row is pruned. G1, which began first,
// then creates the row at fence 1 in that same millisecond, stamping what
// G2's renewal in doubt stamped. G1 holds the run. G2 then adopts G1's row
// as "its own write landing" (it is the latest begun acquisition, so the
// lineage says own) and renews over it: two Leases of the run both
// believe they hold it, at one fence.
func TestLineageStaleLeaseNeverAdoptsAnAcquisitionThatBeganBeforeIt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now), runlease.WithTTL(runlease.MinTTL)}

	var g2 *runlease.Lease
	f.Next(testkit.Fault{Apply: false, Then: func() {
		var err error
		g2, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
		require.NoError(t, err)
		// G2 stalls past its TTL; its late renewal's outcome is unknown.
		clk.Advance(runlease.MinTTL + time.Second)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
		require.ErrorIs(t, g2.Renew(ctx), runlease.ErrOutcomeUnknown)
		// Its expired row is pruned.
		pruned, err := runlease.Prune(ctx, f, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.Equal(t, []string{"r1"}, pruned.Leases)
	}})
	g1, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)
	require.NotNil(t, g2)
	require.Equal(t, uint64(1), g1.Fence())
	g1Row := get(t, f, "runlease:r1")

	// G1 won the run after G2's row was gone: G2 must not take G1's row.
	err = g2.Renew(ctx)
	require.Error(t, err, "G2 adopted G1's row %s as its own and renewed over it, while G1 holds the run", g1Row)
	require.Equal(t, g1Row, get(t, f, "runlease:r1"), "G2 wrote nothing")
	clk.Advance(time.Millisecond)
	require.NoError(t, g1.Renew(ctx))
	require.ErrorIs(t, g2.Renew(ctx), runlease.ErrLeaseLost)
}

// TestLineageLeasesThroughAWrapperAndItsStoreAreStampedApart: the
// Leases of one holder and run share a lineage whether they reach the
// store directly or through a decorator that says what it wraps (Unwrap).
// G1 acquires through the store; its create is overtaken by G2, of the same
// holder, through the decorator, which acquires fence 1, stalls past its
// TTL, sends a renewal whose outcome is unknown (not applied), and whose
// row is pruned. G1 then creates the row at fence 1 in that same
// millisecond. Had the decorator been a store of its own to the lineages,
// G1 would stamp the very bytes of G2's renewal in doubt, G2 would take
// G1's row for its own renewal landing late and renew over it, and both
// would believe they hold the run at one fence.
func TestLineageLeasesThroughAWrapperAndItsStoreAreStampedApart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now), runlease.WithTTL(runlease.MinTTL)}

	var g2 *runlease.Lease
	f.Next(testkit.Fault{Apply: false, Then: func() {
		var err error
		g2, err = runlease.Acquire(ctx, wrapped{f}, "r1", "A", opts...)
		require.NoError(t, err)
		clk.Advance(runlease.MinTTL + time.Second)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
		require.ErrorIs(t, g2.Renew(ctx), runlease.ErrOutcomeUnknown)
		pruned, err := runlease.Prune(ctx, f, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.Equal(t, []string{"r1"}, pruned.Leases)
	}})
	g1, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)
	require.NotNil(t, g2)
	require.Equal(t, uint64(1), g1.Fence())
	g1Row := get(t, f, "runlease:r1")

	err = g2.Renew(ctx)
	require.Error(t, err, "G2 took G1's row %s for its own renewal and renewed over it, while G1 holds the run", g1Row)
	require.Equal(t, g1Row, get(t, f, "runlease:r1"), "G2 wrote nothing")
	clk.Advance(time.Millisecond)
	require.NoError(t, g1.Renew(ctx))
	require.ErrorIs(t, g2.Renew(ctx), runlease.ErrLeaseLost)
}

// TestLineageSlotsRefusedRenewalIsNotConfirmedByAnEqualRow: the
// lease core no longer confirms a refused write whose read-back equals it,
// but Slots.renewOne still does. A second Slots of the same run, whose
// clock runs ahead so that the first's row is expired to it, takes the
// run's slot while the first Slots' renewal is on its way, aiming at the
// very until_ms that renewal sends (30 s TTL renewed at 10 s; 10 s TTL
// claimed at 30 s); the renewal is refused, read back, and confirmed. The
// first Slots now believes it wrote the second's row, and its Release
// deletes it: the second Slots still holds its slot, another run claims
// the freed one, and two runs hold a scope of limit 1.
func TestLineageSlotsRefusedRenewalIsNotConfirmedByAnEqualRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	ahead := testkit.NewClock(epoch.Add(30 * time.Second))
	opts := []runlease.Option{runlease.WithClock(clk.Now), runlease.WithTTL(30 * time.Second)}
	aheadOpts := []runlease.Option{runlease.WithClock(ahead.Now), runlease.WithTTL(10 * time.Second)}
	scopes := []runlease.Scope{runlease.MemScope(1)}
	s1, err := runlease.ClaimSlots(ctx, f, "R", scopes, opts...)
	require.NoError(t, err)

	clk.Advance(10 * time.Second)
	var s2 *runlease.Slots
	f.Next(testkit.Fault{Apply: false, Then: func() {
		var err error
		s2, err = runlease.ClaimSlots(ctx, f, "R", scopes, aheadOpts...)
		require.NoError(t, err)
	}})
	_ = s1.Renew(ctx)
	require.NotNil(t, s2)
	require.Len(t, s2.Held(), 1)
	s2Row := get(t, f, "runslot:mem:0")

	require.NoError(t, s1.Release(ctx))
	_, found, err := f.MetaGet(ctx, "runslot:mem:0")
	require.NoError(t, err)
	require.True(t, found, "s1's Release deleted s2's slot row %s", s2Row)

	_, err = runlease.ClaimSlots(ctx, f, "R2", scopes, aheadOpts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit,
		"R2 claimed the slot that R still holds through s2: two runs in a scope of limit 1")
}

// TestLineageAFailedReentryDoesNotWedgeTheLiveLease: a re-entry that
// certainly did not apply settles, so the live Lease's later renewal whose
// reply is lost is still confirmed by its read-back.
func TestLineageAFailedReentryDoesNotWedgeTheLiveLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	l, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)
	f.Next(testkit.Fault{Apply: false, Err: testkit.NotApplied("MetaCAS")})
	_, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.Error(t, err)
	clk.Advance(time.Millisecond)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
	require.NoError(t, l.Renew(ctx), "the renewal landed, and its read-back says so")
	clk.Advance(time.Millisecond)
	require.NoError(t, l.Renew(ctx))
}
