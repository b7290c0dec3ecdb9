//go:build linux

package runlease_test

// Linearizability of the stores, checked with porcupine (internal/linearize):
// many clients make random gets, conditional writes and deletes over a few
// keys, every call is timed on CLOCK_MONOTONIC (internal/history.Mono, one
// clock for every process of the machine), and the checker must find an
// order of the calls that respects real time and the model of a map of
// compare-and-swap registers. A call whose outcome is unknown may land at
// any instant after it was made; one that certainly changed nothing is left
// out (internal/linearize explains the rules).
//
// The checks are shown to fail: the same workload on deliberately broken
// stores (a compare-and-swap that reads, then writes; writes acknowledged
// but dropped) must be rejected, and those tests stay in the suite.
//
// Sizes. The SQLite check is 8 goroutines × 1,000 calls over 4 keys at
// every size. The Postgres check (linearizability_pg_test.go) runs a CI
// size by default and the full size (2 processes × 16 goroutines × 2,000
// calls over 8 keys, with more faults) under -tags chaos or with
// RUNLEASE_CHAOS=1.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/linearize"
	"github.com/areev/runlease/internal/systest"
)

// linCheckTimeout bounds porcupine's search: far above what a correct
// history of these sizes needs (well under a second per key), so that
// running out of time, which counts as a failure, means something is wrong.
const linCheckTimeout = 2 * time.Minute

// linValues are the values clients write: few, so that clients collide.
var linValues = []string{"a", "b", "c", "d"}

func linKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("lin:%d", i)
	}
	return keys
}

// linRun runs goroutines clients on store, each making calls until it has
// made n, and returns the records kept. A call that fails is only allowed
// when faults is set.
func linRun(t *testing.T, store runlease.Store, w *linearize.Workload, goroutines, n int, faults bool) []linearize.Record {
	t.Helper()
	var (
		mu   sync.Mutex
		recs []linearize.Record
		errs atomic.Int64
	)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			c := w.NewClient(store, 0, g, uint64(time.Now().UnixNano()))
			local := make([]linearize.Record, 0, n)
			for range n {
				rec, keep, err := c.Step(t.Context())
				if err != nil {
					errs.Add(1)
				}
				if keep {
					local = append(local, rec)
				}
			}
			mu.Lock()
			recs = append(recs, local...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if !faults {
		require.Zero(t, errs.Load(), "calls failed on a store without faults")
	}
	return recs
}

// linStats counts what a history exercised, so that a pass is not vacuous.
type linStats struct {
	gets, found, casWon, casLost, deleted, batches, batchesApplied, unknown int
}

func linCount(recs []linearize.Record) linStats {
	var s linStats
	for _, r := range recs {
		switch {
		case r.Unknown:
			s.unknown++
		case r.Kind == linearize.Get:
			s.gets++
			if r.Found {
				s.found++
			}
		case r.Kind == linearize.CAS && r.OK:
			s.casWon++
		case r.Kind == linearize.CAS:
			s.casLost++
		case r.Kind == linearize.Delete && r.OK:
			s.deleted++
		case r.Kind == linearize.Batch:
			s.batches++
			if r.OK {
				s.batchesApplied++
			}
		}
	}
	return s
}

// requireLinearizable checks recs and fails t unless porcupine says Ok. On
// a failure it writes porcupine's view of the history next to the test's
// temporary files and names it.
func requireLinearizable(t *testing.T, recs []linearize.Record, keys []string, partition bool) linearize.Result {
	t.Helper()
	res := linearize.Check(recs, keys, partition, linCheckTimeout)
	if res.Verdict != porcupine.Ok {
		linVisualize(t, res)
		t.Fatalf("history of %d calls (%d uncertain) is not linearizable: porcupine says %s after %v",
			res.Ops, res.Uncertain, res.Verdict, res.Took)
	}
	s := linCount(recs)
	assert.Positive(t, s.casWon, "no cas won: the history proves little")
	assert.Positive(t, s.casLost, "no cas lost: the clients never collided")
	assert.Positive(t, s.found, "no get found a value")
	t.Logf("%d calls linearizable in %v: %+v", res.Ops, res.Took, s)
	return res
}

// linVisualize writes porcupine's view of a failed history to a file that
// outlives the test, and names it. Histories too large to draw are skipped.
func linVisualize(t *testing.T, res linearize.Result) {
	t.Helper()
	if res.Ops > 20000 {
		return
	}
	f, err := os.CreateTemp("", "runlease-history-*.html")
	if err != nil {
		return
	}
	f.Close()
	if err := res.Visualize(f.Name(), linCheckTimeout); err != nil {
		t.Logf("no view of the history: %v", err)
		return
	}
	t.Logf("porcupine's view of the history (open it in a browser): %s", f.Name())
}

func linOpenSQLite(t *testing.T) *runlease.SQLiteStore {
	t.Helper()
	s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "lin.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSQLiteIsLinearizable: 8 goroutines × 1,000 calls over 4 keys on a
// store file, whose reads go through their own connections, as in use.
func TestSQLiteIsLinearizable(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	s := linOpenSQLite(t)
	w := &linearize.Workload{Keys: linKeys(4), Values: linValues, Now: history.Mono}
	recs := linRun(t, s, w, 8, 1000, false)
	require.Len(t, recs, 8000)
	requireLinearizable(t, recs, w.Keys, true)
}

// TestSQLiteBatchesAreLinearizable mixes MetaBatch calls into the workload
// and checks the history as one map, since a batch spans keys.
func TestSQLiteBatchesAreLinearizable(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	s := linOpenSQLite(t)
	w := &linearize.Workload{Keys: linKeys(3), Values: linValues, BatchShare: 0.25, Now: history.Mono}
	recs := linRun(t, s, w, 4, 250, false)
	requireLinearizable(t, recs, w.Keys, false)
	assert.Positive(t, linCount(recs).batchesApplied, "no batch was applied")
}

// TestSQLiteIsLinearizableWhenCallsAreCancelled gives a fifth of the calls
// a deadline of up to a millisecond, so that some end before, while and
// after they reach the file; batches are included, and the history is
// checked as one map. A write the store reports as not applied must not
// have landed. (modernc.org/sqlite returns the context's error for a
// statement that completed, and committed, when the context ends during
// the call; the store reports such a write as an unknown outcome.)
func TestSQLiteIsLinearizableWhenCallsAreCancelled(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	s := linOpenSQLite(t)
	w := &linearize.Workload{Keys: linKeys(3), Values: linValues, BatchShare: 0.25, Now: history.Mono,
		CutShare: 0.2, CutWithin: time.Millisecond}
	recs := linRun(t, s, w, 6, 300, true)
	requireLinearizable(t, recs, w.Keys, false)
}

// TestLinearizabilityCheckRejectsBrokenStores runs the SQLite workload on
// stores broken on purpose, and requires the checker to reject each
// history: proof that the checks above can fail.
func TestLinearizabilityCheckRejectsBrokenStores(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	cases := []struct {
		name  string
		wrap  func(*runlease.SQLiteStore) runlease.Store
		batch float64
	}{
		{"cas_that_reads_then_writes", func(s *runlease.SQLiteStore) runlease.Store { return &readThenWriteStore{s} }, 0},
		{"writes_acknowledged_then_dropped", func(s *runlease.SQLiteStore) runlease.Store { return &droppingStore{Store: s, every: 7} }, 0},
		{"batch_applied_in_two_halves", func(s *runlease.SQLiteStore) runlease.Store { return &tornBatchStore{s} }, 0.3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := &linearize.Workload{Keys: linKeys(3), Values: linValues, BatchShare: tc.batch, Now: history.Mono}
			store := tc.wrap(linOpenSQLite(t))
			recs := linRun(t, store, w, 6, 150, false)
			res := linearize.Check(recs, w.Keys, tc.batch == 0, linCheckTimeout)
			require.Equal(t, porcupine.Illegal, res.Verdict,
				"the checker accepted %d calls of a broken store (in %v)", res.Ops, res.Took)
			t.Logf("rejected after %v, as it must be", res.Took)
		})
	}
}

// readThenWriteStore is broken on purpose: its conditional writes read the
// key, compare in Go and then write unconditionally, so two writers that
// read the same value both win.
type readThenWriteStore struct{ *runlease.SQLiteStore }

func (s *readThenWriteStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	v, found, err := s.MetaGet(ctx, key)
	if err != nil || found != (expected != nil) || (found && v != *expected) {
		return false, err
	}
	time.Sleep(100 * time.Microsecond) // widen the window another writer races through
	return s.MetaBatch(ctx, nil, []runlease.Op{runlease.Put(key, value)})
}

func (s *readThenWriteStore) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	v, found, err := s.MetaGet(ctx, key)
	if err != nil || !found || v != expected {
		return false, err
	}
	time.Sleep(100 * time.Microsecond)
	return s.MetaBatch(ctx, nil, []runlease.Op{runlease.Delete(key)})
}

// droppingStore is broken on purpose: every so often it acknowledges a
// conditional write whose condition holds without writing it.
type droppingStore struct {
	runlease.Store
	every int64
	n     atomic.Int64
}

func (s *droppingStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if s.n.Add(1)%s.every != 0 {
		return s.Store.MetaCAS(ctx, key, expected, value)
	}
	v, found, err := s.MetaGet(ctx, key)
	return err == nil && found == (expected != nil) && (!found || v == *expected), err
}

// tornBatchStore is broken on purpose: it checks a batch's conditions and
// applies its ops one at a time, so others see half a batch.
type tornBatchStore struct{ *runlease.SQLiteStore }

func (s *tornBatchStore) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	for _, c := range conds {
		v, found, err := s.MetaGet(ctx, c.Key)
		if err != nil || found != (c.Value != nil) || (found && v != *c.Value) {
			return false, err
		}
	}
	for _, op := range ops {
		if _, err := s.SQLiteStore.MetaBatch(ctx, nil, []runlease.Op{op}); err != nil {
			return false, err
		}
		time.Sleep(100 * time.Microsecond)
	}
	return true, nil
}
