package runlease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// pageStallStore is a SQLite store whose next read of a line past its
// first rows (a range read after a key: a waiter reading on past expired
// entries at the head) is held up for stall before it reads, as in a
// stalled server or network.
type pageStallStore struct {
	*runlease.SQLiteStore
	mu    sync.Mutex
	stall time.Duration
}

func (s *pageStallStore) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	paging := false
	for _, r := range ranges {
		paging = paging || r.After != ""
	}
	if paging {
		s.mu.Lock()
		d := s.stall
		s.stall = 0
		s.mu.Unlock()
		time.Sleep(d)
	}
	return s.SQLiteStore.MetaRanges(ctx, ranges)
}

// pollingStore is a store that rings no bell: its waiters look at their
// polls and at the expiry of the entries ahead of them.
type pollingStore struct {
	runlease.Store
	runlease.Batcher
	runlease.RangeReader
}

// "A waiter stalled past its TTL, less the margin, loses its place, and
// queues again at the back": also when what stalled is its read of the
// line. Waiter w (TTL 6 s, margin 600 ms) holds the first place in mem; q,
// of the same principal, queues behind it and also needs gpu, which stays
// full. Expired entries of dead waiters lie at the head of mem, so w's
// read reads on past them, and that read stalls 4.7 s, while mem is
// freed: it returns 5.7 s after w wrote its entry, past the entry's trust,
// when others may take it for expired. w must not be admitted on that
// place, but queue again, behind q.
func TestAWaiterWhoseReadStalledPastItsTTLQueuesAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		base := queueBubbleStore(t)
		ps := &pageStallStore{SQLiteStore: base}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		gpu, mem := runlease.NamedScope("gpu", 1), runlease.MemScope(1)
		hour := runlease.WithTTL(time.Hour)
		_, err := runlease.ClaimSlots(ctx, base, "g", []runlease.Scope{gpu}, hour)
		require.NoError(t, err)
		h, err := runlease.ClaimSlots(ctx, base, "h", []runlease.Scope{mem}, hour)
		require.NoError(t, err)

		requeued := make(chan runlease.RequeueEvent, 8)
		wDone := make(chan error, 1)
		go func() {
			_, err := runlease.ClaimSlotsWait(ctx, ps, "w", []runlease.Scope{mem}, runlease.WithTTL(6*time.Second),
				runlease.WithFairShare("a", 1), runlease.WithWaitPoll(time.Minute),
				runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }}))
			wDone <- err
		}()
		synctest.Wait()
		time.Sleep(time.Second)
		qDone := make(chan error, 1)
		go func() {
			_, err := runlease.ClaimSlotsWait(ctx, pollingStore{base, base, base}, "q", []runlease.Scope{gpu, mem}, hour,
				runlease.WithFairShare("a", 1), runlease.WithWaitPoll(time.Minute))
			qDone <- err
		}()
		synctest.Wait()
		require.Equal(t, []string{"w", "q"}, lapseRuns(t, base, "mem"), "w first, q behind it")

		// Three expired entries of dead waiters at the head of mem (a
		// higher priority), more than its head read of limit+1 rows.
		for i := range 3 {
			key := fmt.Sprintf("%s3:mem:0999999.%019d.%016d:dead%d", runlease.QueuePrefix, i, 1, i)
			val := fmt.Sprintf(`{"run":"dead%d","waiter":"dead%d","fence":0,"seq":1,"principal":"x","weight":1,"priority":1,"units":1,"tag":%d,"enq_ms":1,"until_ms":1,"scopes":["mem"]}`, i, i, i)
			ok, err := base.MetaCAS(ctx, key, nil, val)
			require.NoError(t, err)
			require.True(t, ok)
		}
		ps.mu.Lock()
		ps.stall = 4700 * time.Millisecond
		ps.mu.Unlock()
		// mem is freed: its release wakes w, whose read stalls.
		require.NoError(t, h.Release(ctx))
		time.Sleep(12 * time.Second)
		synctest.Wait()

		select {
		case err := <-wDone:
			t.Fatalf("w returned (err %v) though its read stalled past its place's trust, and q ranks ahead of it now", err)
		default:
		}
		assert.Equal(t, []string{"q", "w"}, lapseRuns(t, base, "mem"), "w queued again, behind q")
		require.NotEmpty(t, requeued, "w is told it lost its place")
		assert.Contains(t, (<-requeued).Reason, "stalled")
		cancel()
		<-wDone
		<-qDone
	})
}

// lapseRuns returns the runs of the live entries of scope's line, in rank
// order.
func lapseRuns(t *testing.T, s runlease.Store, scope string) []string {
	t.Helper()
	var runs []string
	now := time.Now().UnixMilli()
	for _, e := range takeoverLine(t, s, scope) {
		if e.UntilMS > now {
			runs = append(runs, e.Run)
		}
	}
	return runs
}
