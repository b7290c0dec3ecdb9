package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
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

// sentinels lists the package's sentinels err matches.
func sentinels(err error) []string {
	var out []string
	for name, s := range map[string]error{
		"ErrInvalidArgument": runlease.ErrInvalidArgument, "ErrCorruptRow": runlease.ErrCorruptRow,
		"ErrFenceExhausted": runlease.ErrFenceExhausted, "ErrStoreLocked": runlease.ErrStoreLocked,
		"ErrStorage": runlease.ErrStorage, "ErrSchemaMismatch": runlease.ErrSchemaMismatch,
		"ErrStoreClosed": runlease.ErrStoreClosed, "ErrLeaseLost": runlease.ErrLeaseLost,
		"ErrConcurrencyLimit": runlease.ErrConcurrencyLimit, "ErrSlotLost": runlease.ErrSlotLost,
		"ErrConditionFailed": runlease.ErrConditionFailed, "ErrKeeperStopped": runlease.ErrKeeperStopped,
	} {
		if errors.Is(err, s) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// TestTwiceUnknownAcquisitionMatchesOneSentinel: errors.go promises
// "Every error returned by this package matches exactly one of them with
// errors.Is". An acquisition whose write may have landed on the last fence
// and whose read-back fails is an unknown outcome, matching ErrStorage
// alone, never ErrFenceExhausted ("refused: nothing was written"). A
// corrupt row read back is a refusal: whatever landed was overwritten.
func TestTwiceUnknownAcquisitionMatchesOneSentinel(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	t.Run("fence_exhausted", func(t *testing.T) {
		t.Parallel()
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		put(t, f.Store, "runlease:r2", `{"holder":"","fence":`+strconv.FormatUint(math.MaxUint64-1, 10)+`,"until_ms":0}`)
		f.Next(testkit.Fault{Apply: true},
			testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
		_, err := runlease.Acquire(ctx, f, "r2", "B", runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
		require.Equal(t, []string{"ErrStorage"}, sentinels(err), "%v", err)
	})
	t.Run("corrupt_row", func(t *testing.T) {
		t.Parallel()
		// The re-entry's takeover lands, reply lost, and before it reads
		// the row back an operator's tool overwrites it with one that does
		// not parse.
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		_, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		f.Next(testkit.Fault{Apply: true},
			testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() {
				raw := get(t, f.Store, "runlease:r1")
				ok, err := f.Store.MetaCAS(ctx, "runlease:r1", &raw, "garbage")
				require.NoError(t, err)
				require.True(t, ok)
			}})
		_, err = runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		// The row read is not a lease's: whatever landed was overwritten,
		// so the refusal stands, and matches that sentinel alone.
		require.ErrorIs(t, err, runlease.ErrCorruptRow)
		require.NotErrorIs(t, err, runlease.ErrOutcomeUnknown)
		require.Equal(t, []string{"ErrCorruptRow"}, sentinels(err), "%v", err)
	})
}

// TestTwiceAcquireWaitContextEndReleasesALandedWrite: AcquireWait returns
// ctx.Err() itself when its context ends, even when its acquisition's
// write landed with its reply lost and the read-back failed as the context
// ended. The caller never receives that lease, so the write is released
// before AcquireWait returns: the run is not blocked for a TTL in the
// holder's name. The row keeps the fence the write took, so fences never
// go backwards, and the driver's first Lease no longer renews.
func TestTwiceAcquireWaitContextEndReleasesALandedWrite(t *testing.T) {
	t.Parallel()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	first, err := runlease.Acquire(t.Context(), f, "r1", "A", opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f.Next(testkit.Fault{Apply: true}, // the create-if-absent, refused
		// Fence 2 lands, its reply lost; the read-back fails as ctx ends.
		testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1); cancel() }})
	_, err = runlease.AcquireWait(ctx, f, "r1", "A", opts...)
	require.Equal(t, context.Canceled, err)
	require.JSONEq(t, `{"holder":"","fence":2,"until_ms":`+strconv.FormatInt(epoch.UnixMilli(), 10)+`}`,
		get(t, f, "runlease:r1"), "the row AcquireWait's acquisition wrote is released at its fence")
	require.ErrorIs(t, first.Renew(t.Context()), runlease.ErrLeaseLost)
	l, err := runlease.Acquire(t.Context(), f, "r1", "B", opts...)
	require.NoError(t, err, "another holder takes the run at once")
	require.Equal(t, uint64(3), l.Fence())
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

// TestAcquireWaitWhoseDeadlinePassedBeforeItsTimerRan: a store call
// returns at the caller's deadline, before the context's timer has said
// so. The acquisition's write landed with its reply lost and the read-back
// failed, so its outcome is unknown; the caller's deadline has passed all
// the same. AcquireWait must treat the call as cut short by it: release
// the row it may have written, and return the deadline's error, exactly as
// when the timer had run first (TestTwiceAcquireWaitContextEndReleasesALandedWrite).
// The simulation found this as a deadline and a store reply due at one
// instant (seed 3046).
func TestAcquireWaitWhoseDeadlinePassedBeforeItsTimerRan(t *testing.T) {
	t.Parallel()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
	ctx := deadlinePassed{t.Context()}
	l, err := runlease.AcquireWait(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
	require.Nil(t, l)
	require.Equal(t, context.DeadlineExceeded, err)
	require.Contains(t, get(t, f, "runlease:r1"), `"holder":""`, "the row written is released")

	// Acquire says the same, as a fault that changed nothing.
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
	l, err = runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
	require.Nil(t, l)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, runlease.IsOutcomeUnknown(err), "%v", err)
	require.Contains(t, get(t, f, "runlease:r1"), `"holder":""`, "the row written is released")
}
