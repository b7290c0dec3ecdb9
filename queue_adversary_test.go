package runlease_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// startWait starts ClaimSlotsWait in a goroutine and returns the channel
// of its error.
func startWait(ctx context.Context, s runlease.Store, run string, scopes []runlease.Scope, opts ...runlease.Option) <-chan error {
	done := make(chan error, 1)
	go func() {
		sl, err := runlease.ClaimSlotsWait(ctx, s, run, scopes, opts...)
		if err == nil {
			_ = sl // held until the test ends
		}
		done <- err
	}()
	return done
}

func waitErr(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("ClaimSlotsWait did not return")
		return nil
	}
}

// Two waiters of one principal queue, then give up. Each place moved the
// principal's fair-share mark (so the two got distinct tags); a wait that
// ends without admission moves it back to what it was, unless a later run
// of the principal moved it since. Given up last first, they leave no
// mark behind; given up in the order they queued, the second finds the
// mark as its place left it and moves it back to the first's: the
// principal is charged for the first run, as if it had been admitted,
// never for more.
func TestQueueAdversaryCancelledWaitersOfOnePrincipalLeaveNoMark(t *testing.T) {
	t.Parallel()
	for _, lastFirst := range []bool{true, false} {
		t.Run("last_first="+strconv.FormatBool(lastFirst), func(t *testing.T) {
			t.Parallel()
			bothStores(t, func(t *testing.T, s runlease.Store) {
				scopes := []runlease.Scope{runlease.MemScope(1)}
				_, err := runlease.ClaimSlots(t.Context(), s, "holder", scopes)
				require.NoError(t, err)
				before := libRows(t, s)

				ctx1, cancel1 := context.WithCancel(t.Context())
				defer cancel1()
				ctx2, cancel2 := context.WithCancel(t.Context())
				defer cancel2()
				d1 := startWait(ctx1, s, "a1", scopes, runlease.WithFairShare("a", 1))
				awaitQueued(t, s, 1)
				d2 := startWait(ctx2, s, "a2", scopes, runlease.WithFairShare("a", 1))
				awaitQueued(t, s, 2)
				require.Contains(t, get(t, s, "runfair:3:mem:a"), `{"finish":2000000,`, "each place moved the mark")

				if lastFirst {
					cancel2()
					require.Same(t, context.Canceled, waitErr(t, d2))
					cancel1()
					require.Same(t, context.Canceled, waitErr(t, d1))
				} else {
					cancel1()
					require.Same(t, context.Canceled, waitErr(t, d1))
					cancel2()
					require.Same(t, context.Canceled, waitErr(t, d2))
				}

				assert.Empty(t, queueRows(t, s))
				if lastFirst {
					assert.Equal(t, before, libRows(t, s), "two cancelled waits left a row behind")
					return
				}
				assert.Contains(t, get(t, s, "runfair:3:mem:a"), `{"finish":1000000,`, "the first run's share, no more")
				var rest []runlease.Row
				for _, r := range libRows(t, s) {
					if r.Key != "runfair:3:mem:a" {
						rest = append(rest, r)
					}
				}
				assert.Equal(t, before, rest, "no other row left behind")
			})
		})
	}
}

// On a store without batches, a waiter writes its entries (and its
// principal's marks) one conditional write at a time. When a later write of
// the set is refused (a racing writer moved the row) and the wait is then
// cancelled, the writes that landed are never taken back: the run's live
// entry stays in the queue and reserves the slot for a TTL.
func TestQueueAdversaryPlainStorePartialEntryWriteSurvivesCancel(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	f := &testkit.Faulty{Store: base}
	s := testkit.PlainStore{Store: f}
	a, b := runlease.NamedScope("a", 1), runlease.NamedScope("b", 1)
	_, err := runlease.ClaimSlots(t.Context(), base, "holder", []runlease.Scope{a, b}, runlease.WithTTL(time.Hour))
	require.NoError(t, err)
	before := libRows(t, base)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The waiter's writes: entry a, then entry b. The second is refused
	// (its condition no longer holds) and the caller gives up meanwhile.
	f.Next(testkit.Fault{Apply: true}, testkit.Fault{Apply: false, Then: cancel})
	_, err = runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{a, b}, runlease.WithWaitPoll(runlease.MinWaitPoll))
	require.Same(t, context.Canceled, err)

	assert.Empty(t, queueRows(t, base), "the cancelled waiter's entry is left in the queue")
	assert.Equal(t, before, libRows(t, base))

	// And it holds others back: a plain claim of a, once a's slot is free,
	// is refused for the sake of a waiter that is gone.
	occ, err := runlease.Occupancy(t.Context(), base)
	require.NoError(t, err)
	for _, o := range occ {
		if o.Scope == "a" {
			_, err := base.MetaDelete(t.Context(), o.Key, get(t, base, o.Key))
			require.NoError(t, err)
		}
	}
	_, err = runlease.ClaimSlots(t.Context(), base, "next", []runlease.Scope{a})
	assert.NoError(t, err, "a free slot refused for a waiter that gave up")
}

// A run's place moves the principal's fair-share mark to where the run
// finishes, and its admission keeps it there, the same way on a store
// with batches and on one without.
func TestQueueAdversaryPlainStoreAdmissionKeepsTheMark(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		plain bool
	}{{"batcher", false}, {"plain", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := newSQLite(t)
			var s runlease.Store = base
			if tc.plain {
				s = testkit.PlainStore{Store: base}
			}
			scopes := []runlease.Scope{runlease.MemScope(1)}
			held, err := runlease.ClaimSlots(t.Context(), base, "holder", scopes)
			require.NoError(t, err)
			d := startWait(t.Context(), s, "a1", scopes, runlease.WithFairShare("a", 1), runlease.WithWaitPoll(runlease.MinWaitPoll))
			awaitQueued(t, base, 1)
			// The place moved the mark, in the same batch as the entry or,
			// without batches, in a write of its own right after it.
			require.Eventually(t, func() bool {
				v, found, err := base.MetaGet(t.Context(), "runfair:3:mem:a")
				return err == nil && found && strings.HasPrefix(v, `{"finish":1000000,`)
			}, 20*time.Second, time.Millisecond, "the waiting run's place moved the mark")
			require.NoError(t, held.Release(t.Context()))
			require.NoError(t, waitErr(t, d))
			assert.Empty(t, queueRows(t, base))
			assert.Contains(t, get(t, base, "runfair:3:mem:a"), `{"finish":1000000,`, "the admitted run's share is spent")
		})
	}
}

// A wait whose admission batch lands, but whose reply is lost as the
// caller's context ends, returns context.Canceled ("ctx.Err() itself") and
// no Slots: yet the run holds the slot, which nobody can release, and the
// scope is full for a TTL. A cancelled wait must change no row but its own
// entries.
func TestQueueAdversaryCancelledWaitWhoseAdmissionLandedLeavesNoSlot(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	f := &testkit.Faulty{Store: base}
	scopes := []runlease.Scope{runlease.MemScope(1)}
	held, err := runlease.ClaimSlots(t.Context(), base, "holder", scopes)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	d := startWait(ctx, f, "r", scopes, runlease.WithWaitPoll(runlease.MinWaitPoll))
	awaitQueued(t, base, 1)
	// The next write is the admission: it commits, and the reply is lost
	// as the caller cancels.
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaBatch"), Then: cancel})
	require.NoError(t, held.Release(t.Context()))
	err = waitErr(t, d)
	if err == nil {
		return // admitted and told so: fine
	}
	occ, oerr := runlease.Occupancy(t.Context(), base)
	require.NoError(t, oerr)
	assert.Empty(t, occ, "ClaimSlotsWait returned %v, yet the run holds a slot no one can release", err)
	assert.Empty(t, queueRows(t, base))
}

// A waiter ranked behind may be admitted first only into units that no
// waiter ahead needs, and then never delays it: p1 queues for {a, b}, p2 of
// the same principal for {a} behind it; a frees while b stays full: p2 takes
// the unit of a that p1 does not need, and p1 is admitted as soon as b frees,
// into the unit of a it reserved.
func TestQueueAdversaryABackfilledRunNeverDelaysTheWaiterAhead(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		a, b := runlease.NamedScope("a", 2), runlease.NamedScope("b", 1)
		ha, err := runlease.ClaimSlots(ctx, s, "xa", []runlease.Scope{a})
		require.NoError(t, err)
		hb, err := runlease.ClaimSlots(ctx, s, "xb", []runlease.Scope{b})
		require.NoError(t, err)
		opts := []runlease.Option{runlease.WithFairShare("p", 1), runlease.WithWaitPoll(runlease.MinWaitPoll)}
		d1 := startWait(ctx, s, "p1", []runlease.Scope{a, b}, opts...)
		awaitQueued(t, s, 2)
		d2 := startWait(ctx, s, "p2", []runlease.Scope{a}, opts...)
		awaitQueued(t, s, 3)
		require.NoError(t, ha.Release(ctx))
		require.NoError(t, waitErr(t, d2), "p2 fits beside what p1 reserves")
		select {
		case err := <-d1:
			t.Fatalf("p1 returned %v while b is full", err)
		default:
		}
		ex, err := runlease.ExplainSlots(ctx, s, "p1", []runlease.Scope{a, b})
		require.NoError(t, err)
		assert.Equal(t, "", ex.Scopes[0].BlockedBy, "p1's unit of a is still free for it")
		assert.Equal(t, "capacity", ex.Scopes[1].BlockedBy)
		require.NoError(t, hb.Release(ctx))
		require.NoError(t, waitErr(t, d1), "p1 is admitted once b frees")
	})
}

// "A second call waiting for the same run while the first still waits
// fails with ErrAlreadyQueued": a run waits once. When the second call asks
// for fewer units than the first, it ignores its own run's reservation and
// is admitted into the units the first waiter reserved, without RUN-E026.
func TestQueueAdversaryASecondCallOfAWaitingRunIsRefused(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	gpu := runlease.NamedScope("gpu", 3)
	_, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{gpu})
	require.NoError(t, err)
	d := startWait(ctx, s, "r", []runlease.Scope{gpu.Take(3)})
	awaitQueued(t, s, 1)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
	defer wcancel()
	_, err = runlease.ClaimSlotsWait(wctx, s, "r", []runlease.Scope{gpu})
	assert.ErrorIs(t, err, runlease.ErrAlreadyQueued, "a second call for a run that waits")
	select {
	case err := <-d:
		t.Fatalf("first waiter returned %v", err)
	default:
	}
}

// A wait whose read fails as its deadline passes, before the context's
// timer has said so, returns the deadline's error itself, as when the timer
// had run first (deadlinePassed: lineage_twice_test.go), and leaves no entry.
func TestQueueAdversaryDeadlinePassedBeforeItsTimerRan(t *testing.T) {
	t.Parallel()
	base := newSQLite(t)
	f := &testkit.Faulty{Store: base}
	a := runlease.NamedScope("a", 1)
	_, err := runlease.ClaimSlots(t.Context(), base, "holder", []runlease.Scope{a}, runlease.WithTTL(time.Hour))
	require.NoError(t, err)
	before := libRows(t, base)

	f.FailReads(1)
	_, err = runlease.ClaimSlotsWait(deadlinePassed{t.Context()}, f, "r", []runlease.Scope{a}, runlease.WithWaitPoll(runlease.MinWaitPoll))
	require.Equal(t, context.DeadlineExceeded, err)
	assert.Empty(t, queueRows(t, base))
	assert.Equal(t, before, libRows(t, base))
}

// A wait that cannot be admitted, whose deadline has passed while the
// context's timer has not said so, returns the deadline's error instead of
// queueing, as AcquireWait does on a run held elsewhere; one that can be
// admitted at once is, as AcquireWait takes a free run.
func TestQueueAdversaryDeadlinePassedEndsTheWaitBeforeItQueues(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	a := runlease.NamedScope("a", 1)
	first, err := runlease.ClaimSlots(t.Context(), s, "holder", []runlease.Scope{a}, runlease.WithTTL(time.Hour))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runlease.ClaimSlotsWait(deadlinePassed{ctx}, s, "r", []runlease.Scope{a}, runlease.WithWaitPoll(runlease.MinWaitPoll))
		done <- err
	}()
	var werr error
	select {
	case werr = <-done:
	case <-time.After(30 * time.Second): // a guard against a hang, not a timing
		cancel()
		t.Fatalf("a wait whose deadline had passed queued and waited; cancelled, it returned %v", <-done)
	}
	require.Equal(t, context.DeadlineExceeded, werr)
	assert.Empty(t, queueRows(t, s), "it wrote no entry")

	require.NoError(t, first.Release(t.Context()))
	sl, err := runlease.ClaimSlotsWait(deadlinePassed{t.Context()}, s, "r", []runlease.Scope{a})
	require.NoError(t, err, "a free slot is taken, as by AcquireWait")
	require.NoError(t, sl.Release(t.Context()))
}
