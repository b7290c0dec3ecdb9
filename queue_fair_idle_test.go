package runlease_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// admitBeforePlace is an embedded store that, just before the first batch
// writing a line entry of run, takes entry out of the line: as if the run
// ahead were admitted between the new waiter's read and its place.
type admitBeforePlace struct {
	*runlease.SQLiteStore
	run   string
	entry runlease.Row
	once  sync.Once
}

func (s *admitBeforePlace) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	for _, op := range ops {
		if strings.HasPrefix(op.Key, runlease.QueuePrefix) && strings.HasSuffix(op.Key, ":"+s.run) {
			s.once.Do(func() {
				_, _ = s.SQLiteStore.MetaDelete(ctx, s.entry.Key, s.entry.Value)
			})
		}
	}
	return s.SQLiteStore.MetaBatch(ctx, conds, ops)
}

// TestAPrincipalBackFromIdleStartsAtTheHeadItWouldFind: a principal with
// nothing waiting starts at the head of the queue. When the head moves on
// between its read and its place (the run at the head admitted), the place
// must not land at the old head's tag, ahead of the runs now at the head:
// it reads again and starts at the new head.
func TestAPrincipalBackFromIdleStartsAtTheHeadItWouldFind(t *testing.T) {
	t.Parallel()
	raw, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	scope := runlease.NamedScope("gpu", 1)
	holder, err := runlease.ClaimSlots(ctx, raw, "holder", []runlease.Scope{scope})
	require.NoError(t, err)
	defer holder.Release(context.Background())

	// A has two runs waiting, at tags 0 and 1 (in units of a run's share).
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for i, run := range []string{"a1", "a2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = runlease.ClaimSlotsWait(wctx, raw, run, []runlease.Scope{scope}, runlease.WithFairShare("A", 1))
		}()
		require.Eventually(t, func() bool { return len(lineRows(t, raw, "gpu")) == i+1 }, 10*time.Second, 5*time.Millisecond)
	}
	head := lineRowOf(t, raw, "gpu", "a1")
	next := lineEntry(t, raw, "gpu", "a2")

	s := &admitBeforePlace{SQLiteStore: raw, run: "b1", entry: head}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = runlease.ClaimSlotsWait(wctx, s, "b1", []runlease.Scope{scope}, runlease.WithFairShare("B", 1))
	}()
	require.Eventually(t, func() bool { return len(lineRowsOf(t, raw, "gpu", "b1")) == 1 }, 10*time.Second, 5*time.Millisecond)
	b := lineEntry(t, raw, "gpu", "b1")
	require.GreaterOrEqual(t, b["tag"].(float64), next["tag"].(float64),
		"B, back from idle, placed at the tag of a head that had moved on (%v), ahead of A's run now at the head (%v)", b["tag"], next["tag"])
}
