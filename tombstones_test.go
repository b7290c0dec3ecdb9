package runlease_test

import (
	"errors"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/testkit"
)

// TestReacquireAfterReleaseWritesOverTheReleasedRow checks that a run this
// process released is taken again in one round trip, and that a guess made
// stale by another node, an operator or a prune costs nothing in
// correctness: the acquisition reads the row and decides on it as it would
// have without the guess.
func TestReacquireAfterReleaseWritesOverTheReleasedRow(t *testing.T) {
	t.Parallel()
	// setup returns the store an other node writes through (s, a Store
	// value of its own, so it shares no memo with this process's) and
	// this process's view of it (c), with run r1 released here at fence 1.
	setup := func(t *testing.T) (s *runlease.SQLiteStore, c *testkit.Counting, clk *testkit.Clock) {
		s = newSQLite(t)
		c = &testkit.Counting{Store: s}
		clk = testkit.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		l, err := runlease.Acquire(t.Context(), c, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.NoError(t, l.Release(t.Context()))
		c.Reset()
		return s, c, clk
	}

	t.Run("one_round_trip", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		_, c, clk := setup(t)
		for want := uint64(2); want <= 4; want++ {
			l, err := runlease.Acquire(ctx, c, "r1", "B", runlease.WithClock(clk.Now))
			require.NoError(t, err)
			assert.Equal(t, want, l.Fence())
			assert.Equal(t, int64(1), c.Total(), "one conditional write over the released row, nothing read")
			require.NoError(t, l.Renew(ctx))
			require.NoError(t, l.Release(ctx))
			c.Reset()
		}
	})

	t.Run("the_run_taken_elsewhere_is_refused", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		s, c, clk := setup(t)
		other, err := runlease.Acquire(ctx, s, "r1", "B", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		row := get(t, s, runlease.LeasePrefix+"r1")
		_, err = runlease.Acquire(ctx, c, "r1", "A", runlease.WithClock(clk.Now))
		var lost *runlease.LeaseLostError
		require.ErrorAs(t, err, &lost)
		assert.ErrorIs(t, err, runlease.ErrTakenOver)
		assert.Equal(t, "B", lost.Holder)
		assert.Equal(t, uint64(2), lost.Fence)
		assert.Equal(t, row, get(t, s, runlease.LeasePrefix+"r1"), "the holder's row is untouched")
		assert.Equal(t, int64(2), c.Total(), "the refused guess, then the read")
		require.NoError(t, other.Renew(ctx))
	})

	t.Run("the_run_taken_and_released_elsewhere_is_taken_above_it", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		s, c, clk := setup(t)
		other, err := runlease.Acquire(ctx, s, "r1", "B", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.NoError(t, other.Release(ctx))
		l, err := runlease.Acquire(ctx, c, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Equal(t, uint64(3), l.Fence(), "above the other node's fence, never at the remembered one")
		require.NoError(t, l.Renew(ctx))
	})

	t.Run("a_row_pruned_elsewhere_starts_again_at_fence_1", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		s, c, clk := setup(t)
		clk.Advance(time.Minute)
		p, err := runlease.Prune(ctx, s, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.Equal(t, []string{"r1"}, p.Leases)
		l, err := runlease.Acquire(ctx, c, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Equal(t, uint64(1), l.Fence())
		assert.Equal(t, int64(3), c.Total(), "the refused guess, the read, the create")
	})

	t.Run("a_prune_here_forgets_the_row", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		_, c, clk := setup(t)
		clk.Advance(time.Minute)
		p, err := runlease.Prune(ctx, c, 0, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.Equal(t, []string{"r1"}, p.Leases)
		c.Reset()
		l, err := runlease.Acquire(ctx, c, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Equal(t, uint64(1), l.Fence())
		assert.Equal(t, int64(1), c.Total(), "the create alone")
	})

	t.Run("racing_acquirers_of_the_released_row_have_one_winner", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		_, c, clk := setup(t)
		const n = 8
		var wg sync.WaitGroup
		won := make(chan *runlease.Lease, n)
		for i := range n {
			wg.Go(func() {
				l, err := runlease.Acquire(ctx, c, "r1", runlease.HolderFor("driver", strconv.Itoa(i)), runlease.WithClock(clk.Now))
				if err == nil {
					won <- l
					return
				}
				if !errors.Is(err, runlease.ErrTakenOver) {
					t.Errorf("acquirer %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		close(won)
		require.Len(t, won, 1, "exactly one acquirer holds the run")
		l := <-won
		assert.Equal(t, uint64(2), l.Fence())
		require.NoError(t, l.Renew(ctx))
	})
}

// ownStore is a store that is not built in and holds a resource until
// Close: a SQLite store of its own, which it reaches through the embedded
// Store (with no Unwrap method, so it is a Store value of its own to the
// library). Its Close does what a store author's does: it refuses calls
// (closing the inner store refuses them and waits for the calls in
// flight), then calls ForgetStore.
type ownStore struct {
	runlease.Store
	inner  *runlease.SQLiteStore
	closed atomic.Bool
}

func (s *ownStore) Close() error {
	s.closed.Store(true)
	err := s.inner.Close()
	runlease.ForgetStore(s)
	return err
}

// reportingStore is an ownStore that implements runlease.ClosedReporter,
// and so may call ForgetStore as soon as it reports itself closed, before
// the calls in flight have returned.
type reportingStore struct{ ownStore }

func (s *reportingStore) Closed() bool { return s.closed.Load() }

func (s *reportingStore) Close() error {
	s.closed.Store(true)
	runlease.ForgetStore(s)
	return s.inner.Close()
}

var _ runlease.ClosedReporter = (*reportingStore)(nil)

// TestTheMemoOfReleasedRowsKeepsNoClosedStore checks that a store closed
// and dropped after a release is collected: the memo of released rows
// refers to Store values, and a store that calls ForgetStore from its
// Close, built in or not, leaves it when closed.
func TestTheMemoOfReleasedRowsKeepsNoClosedStore(t *testing.T) {
	count := func(c *atomic.Int32) { c.Add(1) }
	newInner := func(t *testing.T, i int) *runlease.SQLiteStore {
		s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), strconv.Itoa(i)+".db"))
		require.NoError(t, err)
		return s
	}
	open := map[string]func(t *testing.T, i int, freed *atomic.Int32) runlease.ClosableStore{
		"not_built_in": func(t *testing.T, i int, freed *atomic.Int32) runlease.ClosableStore {
			inner := newInner(t, i)
			s := &ownStore{Store: inner, inner: inner}
			runtime.AddCleanup(s, count, freed)
			return s
		},
		"not_built_in_reporting_closed": func(t *testing.T, i int, freed *atomic.Int32) runlease.ClosableStore {
			inner := newInner(t, i)
			s := &reportingStore{ownStore{Store: inner, inner: inner}}
			runtime.AddCleanup(s, count, freed)
			return s
		},
		"sqlite": func(t *testing.T, i int, freed *atomic.Int32) runlease.ClosableStore {
			s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), strconv.Itoa(i)+".db"))
			require.NoError(t, err)
			runtime.AddCleanup(s, count, freed)
			return s
		},
		"postgres": func(t *testing.T, i int, freed *atomic.Int32) runlease.ClosableStore {
			pool := pgtest.Pool(t)
			s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(pgtest.NewTable(t, pool)))
			require.NoError(t, err)
			runtime.AddCleanup(s, count, freed)
			return s
		},
	}
	for name, open := range open {
		t.Run(name, func(t *testing.T) {
			const n = 4
			var freed atomic.Int32
			for i := range n {
				func() {
					s := open(t, i, &freed)
					l, err := runlease.Acquire(t.Context(), s, "r1", "A")
					require.NoError(t, err)
					require.NoError(t, l.Release(t.Context()))
					require.NoError(t, s.Close())
				}()
			}
			for deadline := time.Now().Add(10 * time.Second); freed.Load() < n && time.Now().Before(deadline); {
				runtime.GC()
				time.Sleep(10 * time.Millisecond)
			}
			assert.Equal(t, int32(n), freed.Load(), "every store closed and dropped was collected")
		})
	}
}
