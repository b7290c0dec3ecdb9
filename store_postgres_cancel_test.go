package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/systest"
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

// TestPostgresCancelledWaitForTheStandby cuts short the wait of commits
// for their synchronous standby, which is down: the primary then keeps
// each commit (visible there, missing on the standby) and warns
// "canceling wait for synchronous replication". An acquisition, a renewal
// and a fenced write whose waits were cut short are reported as faults of
// unknown outcome, never as landed, however the wait ended: by the end of
// the call's context, on a pool that cancels through the server (the server
// answers with a success and the warning) or one that cuts the connection
// (the commit then waits on), or by pg_terminate_backend (the commit is
// visible at once, to the call's read-back too). After the standby is
// promoted, no fence was granted that the new primary does not know of, and
// no Lease trusts a renewal the new primary lacks, so no two holders trust
// one run.
func TestPostgresCancelledWaitForTheStandby(t *testing.T) {
	systest.Mark(t) // a private primary and standby
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cancel bool // the pool answers a context's end with a cancel request
		end    func(pair *pgtest.Replicated, pid int, cancel context.CancelFunc)
	}{
		{"by_a_cancel_request_when_the_context_ends", true, endByContext},
		{"by_the_end_of_the_context_on_a_pool_that_cuts_the_connection", false, endByContext},
		{"by_pg_terminate_backend", false, func(pair *pgtest.Replicated, pid int, _ context.CancelFunc) { pair.Terminate(pid) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testCancelledWaitForTheStandby(t, tc.cancel, tc.end)
		})
	}
}

func endByContext(_ *pgtest.Replicated, _ int, cancel context.CancelFunc) { cancel() }

// replicatedPool returns a pool on the pair, whose connections answer the
// end of a context with a cancel request when cancel is set.
func replicatedPool(t *testing.T, dsn string, cancel bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	if cancel {
		cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: time.Minute}
		}
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func testCancelledWaitForTheStandby(t *testing.T, cancelRequest bool, end func(*pgtest.Replicated, int, context.CancelFunc)) {
	pair := pgtest.StartReplicated(t, true)
	ctx := t.Context()
	s, err := runlease.NewPostgres(ctx, replicatedPool(t, pair.DSN(), cancelRequest), runlease.WithTable("syncrep"))
	require.NoError(t, err)
	ttl := runlease.WithTTL(time.Minute) // nothing expires while the test runs

	first, err := runlease.Acquire(ctx, s, "acquire", "A", ttl)
	require.NoError(t, err)
	require.NoError(t, first.Release(ctx))
	renewer, err := runlease.Acquire(ctx, s, "renew", "A", ttl)
	require.NoError(t, err)
	writer, err := runlease.Acquire(ctx, s, "write", "A", ttl)
	require.NoError(t, err)
	confirmed := map[string]time.Time{"renew": renewer.Expiry(), "write": writer.Expiry()}

	// From here on every commit waits for the standby.
	pair.DisconnectStandby()
	var acquired *runlease.Lease
	calls := []func(context.Context) error{
		func(ctx context.Context) (err error) {
			acquired, err = runlease.Acquire(ctx, s, "acquire", "B", ttl)
			return err
		},
		renewer.Renew,
		func(ctx context.Context) error { return writer.Write(ctx, runlease.Put("ckpt:write", "in doubt")) },
	}
	var pids []int
	var doubts []*inDoubt
	for i, call := range calls {
		cctx, cancel := context.WithCancel(ctx)
		d := &inDoubt{name: []string{"acquire", "renew", "write"}[i], cancel: cancel, done: make(chan error, 1)}
		go func() { d.done <- call(cctx) }()
		d.pid = pair.WaitSyncRepWaiter(pids...)
		pids = append(pids, d.pid)
		doubts = append(doubts, d)
	}
	for _, d := range doubts {
		end(pair, d.pid, d.cancel)
	}
	// A call whose wait was cut short with its context alive reads its row
	// back through a commit that waits for the standby as well; it ends
	// with the primary.
	results := waitDecidedOrBarred(t, pair, pids, doubts)
	pair.KillPrimary()
	for _, d := range doubts {
		if _, ok := results[d.name]; !ok {
			results[d.name] = <-d.done
		}
		d.cancel()
	}
	for name, err := range results {
		require.Error(t, err, "%s: a commit the standby may lack is not reported as landed", name)
		assert.True(t, runlease.IsOutcomeUnknown(err), "%s: the outcome is unknown: %v", name, err)
		var lost *runlease.LeaseLostError
		assert.False(t, errors.As(err, &lost), "%s: a fault is not a loss: %v", name, err)
	}
	assert.Nil(t, acquired, "no lease is granted")

	pair.ReconnectStandby()
	pair.Promote()
	promoted, err := runlease.OpenPostgres(ctx, pair.Standby.DSN(), runlease.WithTable("syncrep"))
	require.NoError(t, err)
	t.Cleanup(func() { promoted.Close() })

	// The writes in doubt are missing there, as the premise has it.
	info, err := runlease.Peek(ctx, promoted, "acquire")
	require.NoError(t, err)
	require.True(t, info.Released, "the release before the standby went down is there, B's acquisition is not")
	_, found, err := promoted.MetaGet(ctx, "ckpt:write")
	require.NoError(t, err)
	require.False(t, found, "the fenced write in doubt is not there")
	// The fence of the acquisition in doubt was granted to nobody, so the
	// next holder's fence, the same number, is its own.
	c, err := runlease.Acquire(ctx, promoted, "acquire", "C", ttl)
	require.NoError(t, err)
	assert.Equal(t, first.Fence()+1, c.Fence())
	// No Lease trusts past what the new primary holds: the next holder
	// takes the run only once the row there has expired, and the Lease's
	// trust ended before it.
	for _, l := range []*runlease.Lease{renewer, writer} {
		info, err := runlease.Peek(ctx, promoted, l.RunID())
		require.NoError(t, err)
		assert.Equal(t, l.Fence(), info.Fence, "%s: the fence did not go back", l.RunID())
		assert.False(t, l.Expiry().After(info.Until),
			"%s: the Lease confirmed an expiry %v past the row on the new primary",
			l.RunID(), fmt.Sprint(l.Expiry().Sub(info.Until)))
		assert.Equal(t, confirmed[l.RunID()].UnixMilli(), info.Until.UnixMilli(), "%s: the row is the one confirmed before the standby went down", l.RunID())
	}
}

// waitDecidedOrBarred waits until each call in doubt has returned or waits
// for the standby again: a call whose wait was cut short reads its row
// back through a barrier that waits for the standby too (see
// store_postgres_doubt.go). It returns the errors of the calls that
// returned, by name.
func waitDecidedOrBarred(t *testing.T, pair *pgtest.Replicated, pids []int, doubts []*inDoubt) map[string]error {
	t.Helper()
	results := map[string]error{}
	deadline := time.Now().Add(time.Minute) // a guard against a hang, not a timing assertion
	for {
		for _, d := range doubts {
			select {
			case err := <-d.done:
				results[d.name] = err
			default:
			}
		}
		pending := len(doubts) - len(results)
		if pending == 0 {
			return results
		}
		waiting, err := pair.SyncRepWaiters()
		require.NoError(t, err)
		barred := 0
		for _, pid := range waiting {
			if !slices.Contains(pids, pid) {
				barred++
			}
		}
		if barred >= pending {
			return results
		}
		require.True(t, time.Now().Before(deadline), "%d calls neither returned nor wait for the standby", pending)
		time.Sleep(20 * time.Millisecond)
	}
}

// inDoubt is a call whose commit waits for the standby.
type inDoubt struct {
	name   string
	cancel context.CancelFunc
	done   chan error
	pid    int // the primary's backend that waits
}
