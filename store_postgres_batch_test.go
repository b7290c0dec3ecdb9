package runlease_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// pgReplace replaces a row by a new one in one transaction (the simple
// protocol runs both statements in one).
const pgReplace = `DELETE FROM %[1]s WHERE key = $1; INSERT INTO %[1]s (key, value) VALUES ($1, 'c') ON CONFLICT DO NOTHING`

// TestPostgresMetaBatch covers what the conformance suite cannot: batches
// whose rows other writers delete and create while they run.
func TestPostgresMetaBatch(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)

	t.Run("a_batch_whose_rows_keep_being_replaced_is_decided_never_failed", func(t *testing.T) {
		t.Parallel()
		s, table := pgStoreAndTable(t, pool)
		keys := []string{"r:a", "r:b", "r:c"}
		for _, k := range keys {
			mustCAS(t, s, k, nil, "c")
		}
		stop := make(chan struct{})
		var churn sync.WaitGroup
		for i := range 2 * len(keys) {
			churn.Go(func() { replaceUntil(t, pool, table, keys[i%len(keys)], stop) })
		}
		var errs []error
		for range 300 {
			var ops []runlease.Op
			for _, k := range keys {
				ops = append(ops, runlease.Put(k, "c"))
			}
			if _, err := s.MetaBatch(t.Context(), nil, ops); err != nil {
				errs = append(errs, err)
			}
		}
		close(stop)
		churn.Wait()
		assert.Empty(t, errs, "of 300 batches")
	})
}

// replaceUntil deletes key's row and creates it again in one transaction,
// over and over, until stop closes: a batch that waits for the row's lock
// then finds it deleted, and its successor not yet visible.
func replaceUntil(t *testing.T, pool *pgxpool.Pool, table, key string, stop <-chan struct{}) {
	sql := fmt.Sprintf(pgReplace, pgtest.Ident(table))
	for {
		select {
		case <-stop:
			return
		default:
		}
		_, _ = pool.Exec(t.Context(), sql, pgx.QueryExecModeSimpleProtocol, key)
	}
}
