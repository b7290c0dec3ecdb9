package runlease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// quickDeadlocks makes the server look for a deadlock after 10 ms of
// waiting for a lock instead of its default second, so that tests that
// provoke deadlocks run in moments. Only a superuser may set it; for
// another role the default stays, and such tests are only slower.
func quickDeadlocks(t *testing.T) func(*pgxpool.Config) {
	t.Helper()
	var super bool
	err := pgtest.Pool(t).QueryRow(t.Context(), `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super)
	require.NoError(t, err)
	return func(cfg *pgxpool.Config) {
		cfg.MaxConns = 24
		if super {
			cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "10ms"
		}
	}
}

// TestPostgresFencedBatchRaces races fenced batches, which take their
// condition's key first, with each other and with batches of the general
// form, which take every key in key order.
func TestPostgresFencedBatchRaces(t *testing.T) {
	t.Parallel()

	t.Run("of_batches_racing_over_one_value_exactly_one_applies_whole", func(t *testing.T) {
		t.Parallel()
		s, _, _ := recordedStore(t, quickDeadlocks(t))
		cur := "v0"
		require.True(t, mustCAS(t, s, "lease", nil, cur))
		const racers, rounds = 8, 15
		for round := range rounds {
			var won [racers]bool
			var errs [racers]error
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range racers {
				// Even racers are fenced batches; odd ones have a second
				// condition, which always holds, so take the general form.
				conds := []runlease.Cond{runlease.IfEquals("lease", cur)}
				if i%2 == 1 {
					conds = append(conds, runlease.IfAbsent("never"))
				}
				ops := []runlease.Op{
					runlease.Put("lease", fmt.Sprintf("v%d-%d", round, i)),
					runlease.Put("ckpt", fmt.Sprintf("c%d-%d", round, i)),
					runlease.Put("aside", fmt.Sprintf("a%d-%d", round, i)),
				}
				wg.Go(func() {
					<-start
					won[i], errs[i] = s.MetaBatch(t.Context(), conds, ops)
				})
			}
			close(start)
			wg.Wait()
			winner := -1
			for i := range racers {
				require.NoError(t, errs[i], "round %d, racer %d", round, i)
				if won[i] {
					require.Equal(t, -1, winner, "round %d: racers %d and %d both applied", round, winner, i)
					winner = i
				}
			}
			require.NotEqual(t, -1, winner, "round %d: no racer applied", round)
			cur = fmt.Sprintf("v%d-%d", round, winner)
			wantRows(t, s, map[string]*string{
				"lease": strptr(cur),
				"ckpt":  strptr(fmt.Sprintf("c%d-%d", round, winner)),
				"aside": strptr(fmt.Sprintf("a%d-%d", round, winner)),
			})
		}
	})

	t.Run("a_deadlock_between_a_fenced_and_a_key_order_batch_is_tried_again", func(t *testing.T) {
		t.Parallel()
		s, r, _ := recordedStore(t, quickDeadlocks(t))
		// Fenced batches lock "k:b", then "k:a"; general ones "k:a", then
		// "k:b". Every condition always holds, so every batch applies.
		require.True(t, mustCAS(t, s, "k:a", nil, "a"))
		require.True(t, mustCAS(t, s, "k:b", nil, "b"))
		fenced := func(i int) (bool, error) {
			return s.MetaBatch(t.Context(), []runlease.Cond{runlease.IfEquals("k:b", "b")},
				[]runlease.Op{runlease.Put("k:b", "b"), runlease.Put("k:a", fmt.Sprintf("fenced %d", i))})
		}
		general := func(i int) (bool, error) {
			return s.MetaBatch(t.Context(), []runlease.Cond{runlease.IfAbsent("k:c")},
				[]runlease.Op{runlease.Put("k:a", fmt.Sprintf("general %d", i)), runlease.Put("k:b", "b")})
		}
		mark := r.mark()
		var calls, retried atomic.Int64
		var mu sync.Mutex
		var errs []error
		deadline := time.Now().Add(20 * time.Second)
		var wg sync.WaitGroup
		for w := range 8 {
			batch := fenced
			if w%2 == 1 {
				batch = general
			}
			wg.Go(func() {
				for i := 0; i < 20 || retried.Load() == 0 && time.Now().Before(deadline); i++ {
					calls.Add(1) // before it is sent: trips > calls only after a retry
					ok, err := batch(i)
					if err == nil && !ok {
						err = fmt.Errorf("batch %d of worker %d did not apply", i, w)
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					if trips := int64(len(r.since(mark))); trips > calls.Load() {
						retried.Store(trips - calls.Load())
					}
				}
			})
		}
		wg.Wait()
		require.Empty(t, errs)
		trips := r.since(mark)
		t.Logf("%d batches in %d round trips", calls.Load(), len(trips))
		assert.Greater(t, int64(len(trips)), calls.Load(), "the premise: some batch met a deadlock and was tried again")
		for _, trip := range kinds(trips) {
			assert.Contains(t, [][]string{{"fenced"}, {"hold", "apply"}}, trip)
		}
		wantRows(t, s, map[string]*string{"k:b": strptr("b")})
	})
}

// TestPostgresFencedBatchContext ends the context of a fenced batch before
// it is sent and while it waits for its condition's row.
func TestPostgresFencedBatchContext(t *testing.T) {
	t.Parallel()
	batch := func(ctx context.Context, s *runlease.PostgresStore) (bool, error) {
		return s.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals("lease", "v1")},
			[]runlease.Op{runlease.Put("lease", "v2"), runlease.Put("ckpt", "c2"), runlease.Put("new", "n2")})
	}
	unchanged := map[string]*string{"lease": strptr("v1"), "ckpt": strptr("c1"), "new": nil}
	seed := func(t *testing.T, s runlease.Store) {
		require.True(t, mustCAS(t, s, "lease", nil, "v1"))
		require.True(t, mustCAS(t, s, "ckpt", nil, "c1"))
	}

	t.Run("a_fenced_batch_whose_context_has_ended_sends_nothing", func(t *testing.T) {
		t.Parallel()
		s, r, _ := recordedStore(t, nil)
		seed(t, s)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		mark := r.mark()
		_, err := batch(ctx, s)
		require.ErrorIs(t, err, context.Canceled)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.False(t, se.Unknown, "nothing was sent")
		assert.False(t, se.Retryable, "the caller gave up")
		assert.Empty(t, r.since(mark), "round trips")
		wantRows(t, s, unchanged)
	})

	t.Run("a_fenced_batch_cancelled_by_the_server_while_waiting_changes_nothing", func(t *testing.T) {
		t.Parallel()
		pool := cancelRequestPool(t)
		s, table := pgStoreAndTable(t, pool)
		seed(t, s)
		tx := lockRow(t, pool, table, "lease")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := batch(ctx, s); done <- err }()
		waitForLockWait(t, pool, table)
		cancel()
		err := <-done
		require.ErrorIs(t, err, context.Canceled)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "the premise: the server answered the cancel request")
		assert.Equal(t, "57014", pgErr.Code, "query_canceled")
		assert.False(t, se.Unknown, "the server rolled the statement back and said so")
		assert.False(t, se.Retryable, "the caller gave up")
		require.NoError(t, tx.Rollback(t.Context()))
		wantRows(t, s, unchanged)
	})

	t.Run("a_fenced_batch_whose_connection_is_cut_while_waiting_is_unknown_and_all_or_nothing", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		s, table := pgStoreAndTable(t, pool)
		seed(t, s)
		tx := lockRow(t, pool, table, "lease")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := batch(ctx, s); done <- err }()
		waitForLockWait(t, pool, table)
		cancel()
		err := <-done
		require.ErrorIs(t, err, context.Canceled)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.True(t, se.Unknown, "the statement had reached the server")
		assert.False(t, se.Retryable, "the caller gave up")
		require.NoError(t, tx.Rollback(t.Context()))
		// The orphaned statement may still run and commit: wait until no
		// statement on the table is left, then find all of it or none.
		require.Eventually(t, func() bool {
			var n int
			err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
				WHERE state <> 'idle' AND pid <> pg_backend_pid() AND query LIKE $1`, "%"+table+"%").Scan(&n)
			return err == nil && n == 0
		}, 10*time.Second, 10*time.Millisecond)
		v, _, err := s.MetaGet(t.Context(), "lease")
		require.NoError(t, err)
		if v == "v1" {
			wantRows(t, s, unchanged)
		} else {
			wantRows(t, s, map[string]*string{"lease": strptr("v2"), "ckpt": strptr("c2"), "new": strptr("n2")})
		}
	})
}
