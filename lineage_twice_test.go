package runlease_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestTwiceNoOpReentryDoesNotWedgeTheWinner: one driver acquires a run
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
func TestTwiceNoOpReentryDoesNotWedgeTheWinner(t *testing.T) {
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

// TestTwiceReentryOfUnknownOutcomeDoesNotWedgeTheNextLease: a re-entry's
// takeover lands with its reply lost and its read-back fails: Acquire
// reports an unknown outcome, rightly, and the first Lease is superseded.
// The driver acquires again and wins fence 3 over the row; no write of the
// failed acquisition can land any more. The new Lease's renewal whose
// reply is lost must be confirmed, since its row is one the failed
// acquisition never sent.
func TestTwiceReentryOfUnknownOutcomeDoesNotWedgeTheNextLease(t *testing.T) {
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

// wedgedTwice sets up the schedule of TestTwiceNoOpReentryDoesNotWedgeTheWinner
// with the store's clock the wall clock (under synctest it stands still
// until every goroutine blocks), and returns B, the winner. A's
// acquisition fails for certain: its read-back found a row it never sent.
func wedgedTwice(t *testing.T, f *testkit.Faulty, opts ...runlease.Option) *runlease.Lease {
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

// TestTwiceNoOpReentryDoesNotEndTheWinnersKeeper: the same schedule,
// with B kept by a Keeper on a store that is healthy but for one lost
// reply: the keeper confirms its next renewals and keeps trusting, its
// row live and B's own the whole time (it must not end in ErrTrustExpired).
func TestTwiceNoOpReentryDoesNotEndTheWinnersKeeper(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := &testkit.Faulty{Store: bubbleStore(t)}
		b := wedgedTwice(t, f, runlease.WithTTL(runlease.MinTTL))
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
