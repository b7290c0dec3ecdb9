package runlease_test

import (
	"math"
	"testing"
	"testing/synctest"
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

// Schedules in which two Lease values of one holder and run, in one
// process, would have sent the same row bytes but for the lineage's stamp
// (lineage.go): an acquisition whose reply returns after a later one's, a
// stale Lease whose row was pruned and acquired again, a failed
// acquisition whose row equals the winner's renewal. In each, a write that
// did not land must not be reported as landed, and the run's only Lease
// must keep renewing on a healthy store.

// healthyRenew renews l up to five times on a healthy store, the clock
// moving 1 ms before each, and returns the last error (nil once one lands).
func healthyRenew(t *testing.T, l *runlease.Lease, clk *testkit.Clock) error {
	t.Helper()
	var last error
	for i := range 5 {
		clk.Advance(time.Millisecond)
		if last = l.Renew(t.Context()); last == nil {
			return nil
		}
		t.Logf("healthy renewal %d: %v", i, last)
	}
	return last
}

// TestLineageStaleLeaseWhoseReplyCameLateNeverTakesTheNewRow: X acquires
// run r1 for holder A; its create lands (fence 1) and its reply is delayed
// past the TTL. Meanwhile the expired row is pruned and L, another
// goroutine of the same driver, creates the run again at fence 1. X's
// reply then arrives, after L's. X renews in the millisecond of L's row:
// its write is not applied (reply lost) and the read-back finds L's row.
// Had X sent the same bytes, it would have taken L's row for its own:
// Renew would report a write that never landed, and X and L would both
// hold fence 1.
func TestLineageStaleLeaseWhoseReplyCameLateNeverTakesTheNewRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, _, x, l := staleReplyAfterPrune(t)
	require.Equal(t, uint64(1), x.Fence())
	require.Equal(t, uint64(1), l.Fence())
	lRow := get(t, f, "runlease:r1")

	// X's renewal, in the millisecond of L's row, is not applied; its reply is lost.
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	errX := x.Renew(ctx)
	require.Equal(t, lRow, get(t, f, "runlease:r1"), "X's renewal wrote nothing: the row is L's")
	require.Error(t, errX, "X's renewal did not land, yet Renew reported it landed: X took L's row %s for its own", lRow)
}

// staleReplyAfterPrune plays the schedule of the two tests above and below
// up to X's return: X (holder A) creates r1, its reply delayed past the
// TTL; the row is pruned and L (holder A too) creates r1 again, at fence 1,
// before X's reply arrives.
func staleReplyAfterPrune(t *testing.T) (f *testkit.Faulty, clk *testkit.Clock, x, l *runlease.Lease) {
	t.Helper()
	ctx := t.Context()
	f, clk = &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now), runlease.WithTTL(runlease.MinTTL)}
	f.Next(testkit.Fault{Apply: true, Then: func() {
		// X's create landed; its reply is delayed past the TTL.
		clk.Advance(runlease.MinTTL + time.Second)
		pruned, err := runlease.Prune(ctx, f, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.Equal(t, []string{"r1"}, pruned.Leases)
		l, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
		require.NoError(t, err)
	}})
	x, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)
	require.NotNil(t, l)
	return f, clk, x, l
}

// TestLineageStaleLeaseWhoseReplyCameLateNeverWritesOverTheHolder: the
// same schedule, carried on: X's fenced write must not land over the row
// of L, which acquired the run after X's row was pruned.
func TestLineageStaleLeaseWhoseReplyCameLateNeverWritesOverTheHolder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk, x, l := staleReplyAfterPrune(t)
	require.NoError(t, l.Write(ctx, runlease.Put("ckpt:r1", "L")), "L, the new holder, checkpoints")
	// L's Write stamped its row 1 ms past its acquisition's (the stamps of a
	// Lease only grow): X renews 1 ms later, so it sends L's latest row.
	clk.Advance(time.Millisecond)
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	_ = x.Renew(ctx)
	errW := x.Write(ctx, runlease.Put("ckpt:r1", "X"))
	ckpt := get(t, f, "ckpt:r1")
	require.True(t, errW != nil && ckpt == "L",
		"X, whose row was pruned, landed a fenced write over L's lease (Write: %v, checkpoint %q)", errW, ckpt)
}

// TestLineageWinsReturningOutOfLandingOrderDoNotWedgeTheHolder: two
// acquisitions of one run by one holder (re-entry is allowed by design).
// X's create lands at fence 1; before its reply returns, L re-enters over
// X's row and wins fence 2, and returns first. L is the run's only valid
// Lease (X's Renew is refused). One renewal of L lands with its reply
// lost; from then on the store is healthy, and L must confirm its next
// renewal: the order in which acquisitions return says nothing about whose
// row is stored.
func TestLineageWinsReturningOutOfLandingOrderDoNotWedgeTheHolder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}

	var l *runlease.Lease
	f.Next(testkit.Fault{Apply: true, Then: func() {
		// X's create has landed; its reply is on its way. L re-enters.
		var err error
		l, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
		require.NoError(t, err)
	}})
	x, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)
	require.NotNil(t, l)
	require.Equal(t, uint64(1), x.Fence())
	require.Equal(t, uint64(2), l.Fence())
	require.ErrorIs(t, x.Renew(ctx), runlease.ErrTakenOver, "X is superseded by L")

	// L's renewal lands, its reply lost.
	clk.Advance(time.Millisecond)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
	t.Logf("L's renewal whose reply was lost: %v", l.Renew(ctx))

	row := get(t, f, "runlease:r1")
	require.NoError(t, healthyRenew(t, l, clk),
		"L, the run's only Lease, never confirms a renewal on a healthy store; row %s", row)
}

// TestLineageWinsReturningOutOfLandingOrderDoNotEndTheKeeper: the same schedule with
// L kept by a Keeper: one lost reply, then a healthy store, and the keeper
// of the run's only holder ends with ErrTrustExpired.
func TestLineageWinsReturningOutOfLandingOrderDoNotEndTheKeeper(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		f := &testkit.Faulty{Store: bubbleStore(t)}
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL)}
		var l *runlease.Lease
		f.Next(testkit.Fault{Apply: true, Then: func() {
			var err error
			l, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
			require.NoError(t, err)
		}})
		x, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
		require.NoError(t, err)
		require.ErrorIs(t, x.Renew(ctx), runlease.ErrTakenOver)

		k, err := runlease.Keep(ctx, l, runlease.KeepInterval(time.Second))
		require.NoError(t, err)
		defer k.Stop()
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")}) // one lost reply
		time.Sleep(30 * time.Second)
		row := get(t, f, "runlease:r1")
		require.Contains(t, row, `"fence":2`)
		require.NoError(t, k.Err(), "the keeper of the run's only holder gave up on a healthy store; row %s", row)
	})
}

// openRowEqualToARenewal: acquisition X (holder A) reads the row at
// fence 1; before X writes, L (same holder) re-enters and wins fence 2
// over that row, and the clock moves 1 ms. X then sends its fence-2 row
// over the fence-1 row — a CAS that can never land, since L's confirmed
// write replaced that row. Its reply is lost; meanwhile L's renewal, in
// the same millisecond (so that, stamped by the clock alone, it would be
// X's very bytes), lands with its reply lost. X's read-back fails, or its
// re-entry at fence 3 is certainly refused.
func openRowEqualToARenewal(t *testing.T, readFails bool) (*runlease.Lease, *testkit.Faulty, *testkit.Clock, error) {
	t.Helper()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	h := &readHook{Store: f}
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	first, err := runlease.Acquire(ctx, h, "r1", "A", opts...)
	require.NoError(t, err)

	var l *runlease.Lease
	f.Next(testkit.Fault{Apply: true}) // X's create-if-absent: refused, the row exists
	h.on("runlease:r1", func() {       // after X's read of the fence-1 row
		var err error
		l, err = runlease.Acquire(ctx, h, "r1", "A", opts...)
		require.NoError(t, err)
		require.Equal(t, uint64(2), l.Fence())
		clk.Advance(time.Millisecond)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS"), Then: func() {
			// X's fence-2 write is in flight; L renews in the same ms.
			f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
			t.Logf("L's renewal whose reply was lost: %v", l.Renew(ctx))
			if readFails {
				f.FailReads(1) // X's read-back
			} else {
				f.Next(testkit.Fault{Apply: false, Err: testkit.NotApplied("MetaCAS")}) // X's re-entry at fence 3
			}
		}})
	})
	_, errX := runlease.Acquire(ctx, h, "r1", "A", opts...)
	t.Logf("X: %v", errX)
	require.NotNil(t, l)
	require.ErrorIs(t, first.Renew(ctx), runlease.ErrTakenOver)
	return l, f, clk, errX
}

// TestLineageFailedAcquisitionStampedAsARenewalDoesNotWedgeTheHolder: after the schedule above
// the store is healthy and L is the run's only Lease (the row is L's
// renewal: X's write expected a row L had replaced), and L must confirm its
// next renewal.
func TestLineageFailedAcquisitionStampedAsARenewalDoesNotWedgeTheHolder(t *testing.T) {
	t.Parallel()
	for _, readFails := range []bool{false, true} {
		name := "reentry_refused"
		if readFails {
			name = "readback_failed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, f, clk, errX := openRowEqualToARenewal(t, readFails)
			if readFails {
				require.ErrorIs(t, errX, runlease.ErrOutcomeUnknown)
			} else {
				require.Error(t, errX)
				require.False(t, runlease.IsOutcomeUnknown(errX), "X's read-back found a row it never sent: %v", errX)
			}
			row := get(t, f, "runlease:r1")
			require.Contains(t, row, `"fence":2`, "none of X's writes landed")
			require.NoError(t, healthyRenew(t, l, clk),
				"L, the run's only Lease, never confirms a renewal on a healthy store; row %s", row)
		})
	}
}

// uncomparableStore is a Store value that cannot be compared: a struct
// with a slice, passed by value.
type uncomparableStore struct {
	runlease.Store
	tags []string
}

// TestLineageRefusesAStoreValueThatCannotBeCompared: rows are stamped apart
// per Store value, so a value that cannot be compared has no lineage of
// its own. Sharing one among every such value would let a lease on one
// database, with a clock a year ahead or a longer TTL, stretch the rows of
// a lease on another. It is refused, before anything is written.
func TestLineageRefusesAStoreValueThatCannotBeCompared(t *testing.T) {
	ctx := t.Context()
	inner := newSQLite(t)
	s := uncomparableStore{Store: inner, tags: []string{"a"}}
	_, err := runlease.Acquire(ctx, s, "r1", "A")
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	require.ErrorContains(t, err, "pass a pointer")
	_, err = runlease.ClaimSlots(ctx, s, "r1", []runlease.Scope{runlease.NamedScope("gpu", 1)})
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	rows, err := inner.MetaScan(ctx, "")
	require.NoError(t, err)
	require.Empty(t, rows, "a refused call writes nothing")
	l, err := runlease.Acquire(ctx, &s, "r1", "A")
	require.NoError(t, err, "a pointer to it is a Store value like any other")
	require.NoError(t, l.Release(ctx))

	// A value that compares but is not equal to itself cannot key a map
	// either: every lookup of its lineage, or of its batch in a Renewer,
	// would miss. It is refused the same way.
	nan := nanStore{Store: inner, weight: math.NaN()}
	_, err = runlease.Acquire(ctx, nan, "r2", "A")
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	require.ErrorContains(t, err, "pass a pointer")
	_, err = runlease.ClaimSlots(ctx, nan, "r2", []runlease.Scope{runlease.NamedScope("gpu", 1)})
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	_, found, err := inner.MetaGet(ctx, runlease.LeasePrefix+"r2")
	require.NoError(t, err)
	require.False(t, found, "a refused call writes nothing")
	l, err = runlease.Acquire(ctx, &nan, "r2", "A")
	require.NoError(t, err, "a pointer to it is a Store value like any other")
	require.NoError(t, l.Release(ctx))
}

// nanStore is a Store passed by value that holds a NaN float: reflect
// calls it comparable, yet it is not equal to itself.
type nanStore struct {
	runlease.Store
	weight float64
}

// TestLineageNoOpReentryDoesNotWedgeTheWinner: one driver acquires a run
// from two goroutines at once (the "twice" workload). Acquisition A reads
// the row and sends fence 2; before it lands, acquisition B (same holder,
// same millisecond) acquires fence 2 over the same row, stamped a
// millisecond later than A's row (see lineage.go). A's write is not
// applied, its reply lost; its read-back finds B's row, not the one A
// sent, so A re-enters over it at fence 3, and that write certainly does
// not apply either. None of A's writes landed or can land: B's renewals
// must be confirmed when their replies are lost, on a healthy store.
// (TestLineageAFailedReentryDoesNotWedgeTheLiveLease states the property:
// a re-entry that certainly did not apply must not wedge the live Lease.)
func TestLineageNoOpReentryDoesNotWedgeTheWinner(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	first, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)

	var b *runlease.Lease
	f.Next(
		testkit.Fault{Apply: true}, // A's create-if-absent: refused, the row exists
		testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS"), Then: func() {
			// B acquires in the same millisecond, writing the row A sent.
			var err error
			b, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
			require.NoError(t, err)
			// A's re-entry over B's row, at fence 3, is not applied.
			f.Next(testkit.Fault{Apply: false, Err: testkit.NotApplied("MetaCAS")})
		}})
	_, errA := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NotNil(t, b)
	require.Equal(t, uint64(2), b.Fence())
	t.Logf("A: %v", errA)
	rowB := get(t, f, "runlease:r1")
	require.Contains(t, rowB, `"fence":2`, "none of A's writes landed: the row is B's")
	require.ErrorIs(t, first.Renew(ctx), runlease.ErrTakenOver)

	// B is the run's holder. Its renewal lands with the reply lost.
	clk.Advance(time.Millisecond)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
	err1 := b.Renew(ctx)
	t.Logf("B's renewal whose reply was lost: %v", err1)
	// From now on the store is healthy. B must be able to confirm.
	var last error
	for i := range 5 {
		clk.Advance(time.Millisecond)
		if last = b.Renew(ctx); last == nil {
			break
		}
		t.Logf("healthy renewal %d of B: %v", i, last)
	}
	require.NoError(t, last,
		"B, the run's only holder, never confirms a renewal on a healthy store: A's acquisition, none of whose writes landed, stays open in the lineage for ever")
}

// TestLineageReentryOfUnknownOutcomeDoesNotWedgeTheNextLease: a re-entry's
// takeover lands with its reply lost and its read-back fails: Acquire
// reports an unknown outcome, rightly, and the first Lease is superseded.
// The driver acquires again and wins fence 3 over the row; no write of the
// failed acquisition can land any more. The new Lease's renewal whose
// reply is lost must be confirmed, since its row is one the failed
// acquisition never sent.
func TestLineageReentryOfUnknownOutcomeDoesNotWedgeTheNextLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	first, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)

	f.Next(testkit.Fault{Apply: true}, // the create-if-absent, refused
		testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
	_, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
	require.ErrorIs(t, first.Renew(ctx), runlease.ErrTakenOver)

	l2, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)
	require.Equal(t, uint64(3), l2.Fence())

	clk.Advance(time.Millisecond)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
	t.Logf("renewal whose reply was lost: %v", l2.Renew(ctx))
	var last error
	for i := range 5 {
		clk.Advance(time.Millisecond)
		if last = l2.Renew(ctx); last == nil {
			break
		}
		t.Logf("healthy renewal %d: %v", i, last)
	}
	require.NoError(t, last, "the run's only Lease never confirms a renewal on a healthy store")
}

// wedgedReentry sets up the schedule of TestLineageNoOpReentryDoesNotWedgeTheWinner
// with the store's clock the wall clock (under synctest it stands still
// until every goroutine blocks), and returns B, the winner. A's
// acquisition fails for certain: its read-back found a row it never sent.
func wedgedReentry(t *testing.T, f *testkit.Faulty, opts ...runlease.Option) *runlease.Lease {
	t.Helper()
	ctx := t.Context()
	_, err := runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.NoError(t, err)
	var b *runlease.Lease
	f.Next(
		testkit.Fault{Apply: true},
		testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS"), Then: func() {
			var err error
			b, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
			require.NoError(t, err)
			f.Next(testkit.Fault{Apply: false, Err: testkit.NotApplied("MetaCAS")})
		}})
	_, err = runlease.Acquire(ctx, f, "r1", "A", opts...)
	require.Error(t, err)
	require.False(t, runlease.IsOutcomeUnknown(err), "%v", err)
	require.NotNil(t, b)
	require.Equal(t, uint64(2), b.Fence())
	return b
}

// TestLineageNoOpReentryDoesNotEndTheWinnersKeeper: the same schedule,
// with B kept by a Keeper on a store that is healthy but for one lost
// reply: the keeper confirms its next renewals and keeps trusting, its
// row live and B's own the whole time (it must not end in ErrTrustExpired).
func TestLineageNoOpReentryDoesNotEndTheWinnersKeeper(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := &testkit.Faulty{Store: bubbleStore(t)}
		b := wedgedReentry(t, f, runlease.WithTTL(runlease.MinTTL))
		k, err := runlease.Keep(t.Context(), b, runlease.KeepInterval(time.Second))
		require.NoError(t, err)
		defer k.Stop()
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")}) // one lost reply
		time.Sleep(30 * time.Second)
		row := get(t, f, "runlease:r1")
		require.Contains(t, row, `"fence":2`)
		require.NoError(t, k.Err(), "the keeper of the run's only holder gave up on a healthy store; row %s", row)
	})
}
