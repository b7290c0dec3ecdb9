package runlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// cancelRequestPool returns a pool whose connections answer the end of a
// context by asking the server to cancel the statement (pgx's
// CancelRequestContextWatcherHandler) rather than by cutting the
// connection; the server then ends the statement with an ERROR. The
// fallback deadline is far off, so that the server's answer comes first.
func cancelRequestPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: time.Minute}
	}
	cfg.MaxConns = 16 // room for the parallel subtests: each holds a lock, writes and watches
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestPostgresCancelRequests ends the context of writes that wait for a row
// lock on a pool that cancels through the server.
func TestPostgresCancelRequests(t *testing.T) {
	t.Parallel()
	pool := cancelRequestPool(t)
	writes := []struct {
		name  string
		write func(ctx context.Context, s *runlease.PostgresStore) error
	}{
		{"MetaCAS", func(ctx context.Context, s *runlease.PostgresStore) error {
			_, err := s.MetaCAS(ctx, "k", strptr("v1"), "v2")
			return err
		}},
		{"MetaCASNotify", func(ctx context.Context, s *runlease.PostgresStore) error {
			_, err := s.MetaCASNotify(ctx, "k", strptr("v1"), "v2")
			return err
		}},
		{"MetaDelete", func(ctx context.Context, s *runlease.PostgresStore) error {
			_, err := s.MetaDelete(ctx, "k", "v1")
			return err
		}},
		{"MetaBatch", func(ctx context.Context, s *runlease.PostgresStore) error {
			_, err := s.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals("k", "v1")}, []runlease.Op{runlease.Put("k", "v2")})
			return err
		}},
		{"MetaCASMany", func(ctx context.Context, s *runlease.PostgresStore) error {
			_, err := s.MetaCASMany(ctx, []runlease.CASWrite{{Key: "k", Expected: strptr("v1"), Value: "v2"}})
			return err
		}},
	}
	for _, w := range writes {
		t.Run("a_cancelled_"+w.name+"_returns_the_contexts_error_and_is_not_retryable", func(t *testing.T) {
			t.Parallel()
			s, table := pgStoreAndTable(t, pool)
			require.True(t, mustCAS(t, s, "k", nil, "v1"))
			tx := lockRow(t, pool, table, "k")

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- w.write(ctx, s) }()
			waitForLockWait(t, pool, table)
			cancel()
			err := <-done
			require.ErrorIs(t, err, context.Canceled)
			var se *runlease.StorageError
			require.ErrorAs(t, err, &se)
			assert.False(t, se.Retryable, "the caller gave up")
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, "the premise: the server answered the cancel request")
			assert.Equal(t, "57014", pgErr.Code, "query_canceled")
			assert.False(t, se.Unknown, "the server rolled the statement back and said so")

			require.NoError(t, tx.Rollback(t.Context()))
			v, _, err := s.MetaGet(t.Context(), "k")
			require.NoError(t, err)
			assert.Equal(t, "v1", v, "not applied, as reported")
		})
	}
}
