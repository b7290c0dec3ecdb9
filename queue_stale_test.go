package runlease_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// stallingStore is a SQLite store whose batches that take a slot (a
// waiter's admission) are held up, as in a stalled server or network: for
// a while before they apply, or, hung, until their context ends, when they
// apply and report an unknown outcome. When hung, its reads and deletes
// also wait for their context to end. With hangAfter, it hangs from the
// moment the stalled admission has landed (closing landed), as a store that
// went away just after answering.
type stallingStore struct {
	*runlease.SQLiteStore
	mu        sync.Mutex
	stall     time.Duration // the next admission waits this long, then applies
	hung      bool
	hangAfter bool
	landed    chan struct{} // with hangAfter: closed once the stalled admission applied
}

func (s *stallingStore) isHung() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hung
}

func (s *stallingStore) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	admission := false
	for _, op := range ops {
		admission = admission || strings.HasPrefix(op.Key, runlease.SlotPrefix)
	}
	if admission {
		s.mu.Lock()
		d, hung := s.stall, s.hung
		s.stall = 0
		s.mu.Unlock()
		if hung {
			<-ctx.Done()
			_, _ = s.SQLiteStore.MetaBatch(context.WithoutCancel(ctx), conds, ops)
			return false, testkit.Unknown("MetaBatch")
		}
		time.Sleep(d)
		if d > 0 && s.hangAfter {
			ok, err := s.SQLiteStore.MetaBatch(context.WithoutCancel(ctx), conds, ops)
			s.mu.Lock()
			s.hung = true
			s.mu.Unlock()
			close(s.landed)
			return ok, err
		}
	}
	return s.SQLiteStore.MetaBatch(ctx, conds, ops)
}

func (s *stallingStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return "", false, testkit.Unknown("MetaGet")
	}
	return s.SQLiteStore.MetaGet(ctx, key)
}

func (s *stallingStore) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return false, testkit.Unknown("MetaDelete")
	}
	return s.SQLiteStore.MetaDelete(ctx, key, expected)
}

func (s *stallingStore) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return false, testkit.Unknown("MetaDeleteNotify")
	}
	return s.SQLiteStore.MetaDeleteNotify(ctx, key, expected, wakeKey)
}

// TestAnAdmissionConfirmedAfterItsTrustWindowIsGivenBack: a waiter's
// admission stamps its slot rows from the start of the attempt, so one that
// lands, or is confirmed, a TTL less the margin later can no longer be
// trusted (its rows are expiring or gone). The waiter gives the slots back,
// is told it lost its place, and queues again, instead of returning a claim
// that Held() shows empty.
func TestAnAdmissionConfirmedAfterItsTrustWindowIsGivenBack(t *testing.T) {
	t.Parallel()
	for _, stall := range []time.Duration{4800 * time.Millisecond, 6 * time.Second} { // rows live, and expired, at landing
		t.Run(stall.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &stallingStore{SQLiteStore: bubbleStore(t), stall: stall}
				requeued := make(chan runlease.RequeueEvent, 4)
				start := time.Now()
				sl, err := runlease.ClaimSlotsWait(t.Context(), s, "a", []runlease.Scope{runlease.MemScope(1)},
					runlease.WithTTL(5*time.Second),
					runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }}))
				require.NoError(t, err)
				require.Len(t, sl.Held(), 1, "admitted, with a trust window of its own")
				assert.Equal(t, time.Now().Add(5*time.Second-500*time.Millisecond), sl.TrustedUntil(),
					"the trust window of the second admission, which was not held up")
				assert.Equal(t, start.Add(stall), time.Now(), "admitted at once after the stalled batch")
				require.Len(t, requeued, 1, "the waiter is told its first admission came too late")
				e := <-requeued
				assert.Contains(t, e.Reason, "trust window")
				// One slot row, the one it holds.
				live, err := runlease.Occupancy(t.Context(), s)
				require.NoError(t, err)
				require.Len(t, live, 1)
				assert.Equal(t, sl.Held()[0].Key, live[0].Key)
				require.NoError(t, sl.Release(t.Context()))
			})
		})
	}
}

// TestAWaitWhoseAdmissionHungReturnsWithinItsBound: a queued wait whose
// context ends while its admission is in doubt takes its entries out and
// frees the slots that admission may have taken within one leaveTimeout
// (2 s) of the end of its context, however long the store takes to answer.
func TestAWaitWhoseAdmissionHungReturnsWithinItsBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := &stallingStore{SQLiteStore: bubbleStore(t), hung: true}
		mem := []runlease.Scope{runlease.MemScope(1)}
		// Run x holds the slot, through the store itself: its release is
		// not held up, and wakes the waiter.
		x, err := runlease.ClaimSlots(t.Context(), s.SQLiteStore, "x", mem, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		deadline, _ := ctx.Deadline()
		done := make(chan error, 1)
		go func() {
			_, err := runlease.ClaimSlotsWait(ctx, s, "a", mem, runlease.WithTTL(5*time.Second))
			done <- err
		}()
		time.Sleep(time.Second)
		require.Len(t, queueRows(t, s.SQLiteStore), 1, "the waiter is queued")
		require.NoError(t, x.Release(t.Context()))
		err = <-done
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, context.DeadlineExceeded, err, "ctx.Err() itself")
		assert.LessOrEqual(t, time.Since(deadline), 2*time.Second, "returned within leaveTimeout of the end of its context")
	})
}

// TestAWaitCancelledWhileGivingBackALateAdmissionReturnsWithinItsBound: a
// queued waiter's admission lands after its trust window, so the waiter
// gives the slots back; its context ends just after the give-back began,
// while the store hangs from then on. The give-back and the wait's clean-up
// share one bound: the call returns within 2 s of the end of its context.
func TestAWaitCancelledWhileGivingBackALateAdmissionReturnsWithinItsBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := &stallingStore{SQLiteStore: bubbleStore(t), stall: 6 * time.Second, hangAfter: true, landed: make(chan struct{})}
		mem := []runlease.Scope{runlease.MemScope(1)}
		// x holds the only slot: the waiter queues (writes its entry).
		x, err := runlease.ClaimSlots(t.Context(), s.SQLiteStore, "x", mem, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := runlease.ClaimSlotsWait(ctx, s, "a", mem, runlease.WithTTL(5*time.Second))
			done <- err
		}()
		time.Sleep(time.Second)
		require.Len(t, queueRows(t, s.SQLiteStore), 1, "the waiter is queued")
		require.NoError(t, x.Release(t.Context())) // wakes the waiter: its admission stalls 6 s
		<-s.landed                                 // landed past the trust window (4.5 s): giveBack begins
		time.Sleep(time.Millisecond)
		cancel()
		ended := time.Now()
		err = <-done
		assert.Equal(t, context.Canceled, err, "ctx.Err() itself")
		assert.LessOrEqual(t, time.Since(ended), 2*time.Second,
			"ClaimSlotsWait returned %v after its context ended; README: within 2 s", time.Since(ended))
	})
}

func TestAStalledWaiterQueuesAgainAtTheBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s, clk := bubbleStore(t), testkit.NewClock(epoch)
		requeued := make(chan runlease.RequeueEvent, 4)
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now),
			runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }})}
		scopes := []runlease.Scope{runlease.MemScope(1)}
		_, err := runlease.ClaimSlots(t.Context(), s, "x", scopes, runlease.WithTTL(time.Hour), runlease.WithClock(clk.Now))
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		// The first waiter looks again only when its entry is due for
		// renewal (a third of the TTL), as a paused process would.
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, s, "first", scopes, append(opts, runlease.WithWaitPoll(time.Hour))...)
		}()
		synctest.Wait()
		require.Len(t, queueRows(t, s), 1)
		first := queueRows(t, s)[0].Value

		// Its entry expires on the store's clock as if its process had
		// paused; another run queues meanwhile and is now ahead.
		clk.Advance(6 * time.Second)
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, s, "second", scopes, append(opts, runlease.WithWaitPoll(time.Hour))...)
		}()
		synctest.Wait()
		lineRowOf(t, s, "mem", "second")
		time.Sleep(runlease.MinTTL / 3) // the first waiter's renewal is due
		synctest.Wait()
		require.Len(t, requeued, 1, "the stalled waiter is told it lost its place")
		e := <-requeued
		assert.Equal(t, "first", e.RunID)
		assert.Equal(t, []string{"mem"}, e.Scopes)
		r := queueRows(t, s)
		require.Len(t, r, 2)
		assert.NotEqual(t, first, lineRowOf(t, s, "mem", "first").Value)
		a, b := lineEntry(t, s, "mem", "first"), lineEntry(t, s, "mem", "second")
		assert.Greater(t, a["tag"], b["tag"], "it queued again behind the run that came meanwhile")
		_, firstRun, _ := parseLine(r[0].Key)
		assert.Equal(t, "second", firstRun, "the line's order says so too")
		cancel()
		synctest.Wait()
	})
}

// gatedStore is a SQLite store whose reads and renewals can be held up, as
// a process paused mid-wait is; with writesPass, only its reads are.
type gatedStore struct {
	*runlease.SQLiteStore
	writesPass bool
	mu         sync.Mutex
	gate       chan struct{} // nil: reads pass
	refused    atomic.Int64  // batches whose conditions did not hold
}

func (g *gatedStore) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	ok, err := g.SQLiteStore.MetaBatch(ctx, conds, ops)
	if err == nil && !ok {
		g.refused.Add(1)
	}
	return ok, err
}

func (g *gatedStore) hold() { g.mu.Lock(); g.gate = make(chan struct{}); g.mu.Unlock() }

func (g *gatedStore) open() { g.mu.Lock(); close(g.gate); g.gate = nil; g.mu.Unlock() }

func (g *gatedStore) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return g.SQLiteStore.MetaScanMany(ctx, prefixes)
}

// MetaRanges, how a waiter reads the scopes it waits for, is held up as
// MetaScanMany is.
func (g *gatedStore) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return g.SQLiteStore.MetaRanges(ctx, ranges)
}

// MetaCASMany, the entries' renewal, is held up too, until the gate opens
// or its context ends.
func (g *gatedStore) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil && !g.writesPass {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, &runlease.StorageError{Op: "MetaCASMany", Err: ctx.Err(), Unknown: true}
		}
	}
	return g.SQLiteStore.MetaCASMany(ctx, writes)
}

func TestAWaiterStalledPastItsTTLGivesUpAPlaceTheStoreStillShows(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// The store's clock stands still, so the entry looks live to
		// everyone; the waiter's own clock says it went unrenewed for
		// longer than its TTL less the margin, so others may have judged
		// it expired meanwhile: it must not renew the place as if nothing
		// happened.
		g, clk := &gatedStore{SQLiteStore: bubbleStore(t)}, testkit.NewClock(epoch)
		requeued := make(chan runlease.RequeueEvent, 4)
		scopes := []runlease.Scope{runlease.MemScope(1)}
		_, err := runlease.ClaimSlots(t.Context(), g, "x", scopes, runlease.WithTTL(time.Hour), runlease.WithClock(clk.Now))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, g, "r", scopes, runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now),
				runlease.WithWaitPoll(time.Hour),
				runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }}))
		}()
		synctest.Wait()
		placed := lineRowOf(t, g, "mem", "r").Value

		g.hold()
		time.Sleep(runlease.MinTTL + time.Second) // its renewal hangs meanwhile
		g.open()
		synctest.Wait()
		require.Len(t, requeued, 1)
		e := <-requeued
		assert.Equal(t, "the waiter stalled past its TTL", e.Reason)
		var was, now map[string]any
		require.NoError(t, json.Unmarshal([]byte(placed), &was))
		require.NoError(t, json.Unmarshal([]byte(lineRowOf(t, g, "mem", "r").Value), &now))
		assert.Equal(t, was["waiter"], now["waiter"], "the same waiter")
		assert.Greater(t, now["seq"], was["seq"], "wrote a new place")
		cancel()
		synctest.Wait()
	})
}

// queuedEntry decodes the queue entry of run in scope mem.
func queuedEntry(t *testing.T, s runlease.Store, run string) map[string]any {
	t.Helper()
	return lineEntry(t, s, "mem", run)
}

// TestAWaiterFoundStalledWhileItsEntryIsVisibleQueuesAgainAtTheBack proves
// the README's "a waiter stalled past its TTL, less the margin, loses its
// place ... and queues again at the back" when the store still shows its
// entry live: the expiry clock lags the waiter's own, so its read after the
// stall finds the entry in place, yet others may have judged it expired
// meanwhile. The waiter must not keep the place it had: its new entry has
// a new fair-share tag and enqueue time, behind a run that queued while it
// was stalled.
func TestAWaiterFoundStalledWhileItsEntryIsVisibleQueuesAgainAtTheBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s, clk := bubbleStore(t), testkit.NewClock(epoch)
		g := &gatedStore{SQLiteStore: s, writesPass: true}
		scopes := []runlease.Scope{runlease.MemScope(1)}
		_, err := runlease.ClaimSlots(t.Context(), s, "x", scopes, runlease.WithTTL(time.Hour), runlease.WithClock(clk.Now))
		require.NoError(t, err)
		requeued := make(chan runlease.RequeueEvent, 4)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, g, "first", scopes, runlease.WithTTL(runlease.MinTTL),
				runlease.WithClock(clk.Now), runlease.WithWaitPoll(500*time.Millisecond),
				runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }}))
		}()
		synctest.Wait()
		was := queuedEntry(t, s, "first")

		// Its next look (the poll, due before its first renewal) hangs in the store past its TTL; its
		// renewals stop meanwhile. The store's clock moves a second only,
		// so the entry stays live for everyone.
		g.hold()
		time.Sleep(runlease.MinTTL + time.Second)
		clk.Advance(time.Second)
		// A run that queues meanwhile (through another Store value, so
		// its reads are not held up) ranks behind the place it sees.
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, s, "second", scopes, runlease.WithTTL(time.Hour),
				runlease.WithClock(clk.Now), runlease.WithWaitPoll(time.Hour))
		}()
		synctest.Wait()
		second := queuedEntry(t, s, "second")
		require.Greater(t, second["tag"], was["tag"], "the second run queued behind the first")
		require.Equal(t, was, queuedEntry(t, s, "first"), "the first entry is still in place, unrenewed")
		require.Empty(t, requeued)

		g.open()
		synctest.Wait()
		// It gives its place up at once, and takes a new one after a
		// read of its own rows, a moment later (a backoff of a
		// millisecond or two).
		for start := time.Now(); queuedEntry(t, s, "first")["seq"] == was["seq"] && time.Since(start) < time.Second; {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		require.Len(t, requeued, 1, "the stalled waiter is told it lost its place")
		e := <-requeued
		assert.Equal(t, "first", e.RunID)
		assert.Equal(t, "the waiter stalled past its TTL", e.Reason)
		now := queuedEntry(t, s, "first")
		assert.Equal(t, was["waiter"], now["waiter"], "the same waiter")
		assert.Greater(t, now["seq"], was["seq"], "it wrote a new place")
		assert.Greater(t, now["tag"], second["tag"], "it queued again behind the run that came meanwhile")
		assert.Greater(t, now["enq_ms"], was["enq_ms"], "with the enqueue time of its new place")
		q, err := runlease.Queues(t.Context(), s, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.Len(t, q, 2)
		assert.Equal(t, []string{"second", "first"}, []string{q[0].RunID, q[1].RunID}, "rank order")
		cancel()
		synctest.Wait()
	})
}
