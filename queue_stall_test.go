package runlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

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
