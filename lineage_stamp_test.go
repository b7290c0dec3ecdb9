package runlease_test

// Schedules in which two Lease values of one holder and run, in one
// process, would have sent the same row bytes but for the lineage's stamp
// (lineage.go): an acquisition whose reply returns after a later one's, a
// stale Lease whose row was pruned and acquired again, a failed
// acquisition whose row equals the winner's renewal. In each, a write that
// did not land must not be reported as landed, and the run's only Lease
// must keep renewing on a healthy store.

import (
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

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
	h := &readHook{Store: f} // see review_adversary_test.go
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
