package runlease

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The pins make the store's guarantees independent of the defaults a role,
// a database or a connection may set (ALTER ROLE … SET, a DSN's options, a
// pool's AfterConnect), for the call's implicit transaction only:
//
//   - pgPinIsolation makes the transaction READ COMMITTED, the level the
//     statements are written for: a conditional write that waited for a
//     concurrent one re-checks its condition against the row that one
//     committed, and so loses the race, where REPEATABLE READ or
//     SERIALIZABLE would fail with a serialization failure (40001). It is a
//     SET, not SET LOCAL or SET TRANSACTION, because those two warn outside
//     a transaction block, which the server would log at every call; and a
//     SET of transaction_isolation lasts only for the transaction it is
//     made in (SET TRANSACTION is the same SET), so nothing of the session
//     changes. It leads every call, reads too, as a statement of its own:
//     the level is fixed by the transaction's first snapshot, which any
//     other statement, even a SELECT of set_config, takes before it runs.
//     A read, one SELECT, would see the same rows at any level, and
//     without the SET it runs at 0.93–1.01 of the bare SELECT instead of
//     0.83–0.87 (BENCHMARKS.md); but under a SERIALIZABLE default it would
//     take part in the server's serializable conflict checks, where it can
//     fail with 40001 and make the caller's own serializable transactions
//     on the table fail, so reads keep it.
//   - pgDurable makes a write's commit wait for its WAL to be flushed, so
//     that an acknowledged write survives a crash of the server: with
//     synchronous_commit = off, an immediate restart loses the last commits
//     and fences would go backwards. A setting that already waits for the
//     local flush (on, remote_write, remote_apply) is left as it is; off
//     and local become on, which also waits for synchronous standbys, if
//     any, so that a failover keeps the write too. set_config(…, true) sets
//     it for this transaction only, without a warning. It is not a
//     statement of its own but an expression that every write statement
//     evaluates for each row it writes (in a RETURNING clause, which the
//     server computes for every row a data-modifying statement or CTE
//     changes, whether or not anything reads it), or once in a SELECT list
//     of one row: a transaction that changed a row for good has then
//     always set it before it commits, which is when the server reads the
//     setting (a MetaCASMany whose placeholders were all it wrote leaves
//     nothing to lose). Folding it in spares a write a statement; a new
//     write statement must carry it too, which
//     TestPostgresEveryWriteCommitsWithItsPinsWhateverTheDefaults checks,
//     kind by kind, at each commit. pgPinDurable is the same as a
//     statement, for DDL, which has no RETURNING.
//
// Both end at the call's commit and travel in the same message as the
// call's statements, so a call stays one round trip, works through
// transaction-pooling proxies, and leaves the caller's connections as they
// were.
const (
	pgPinIsolation = `SET transaction_isolation = 'read committed'`
	pgDurable      = `CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN set_config('synchronous_commit', 'on', true) END`
	pgPinDurable   = `SELECT ` + pgDurable
)

// pgStmt is one statement of a call, with its arguments.
type pgStmt struct {
	sql  string
	args []any
}

// send runs stmts on c as one implicit transaction, led by the isolation
// pin, and returns one result per statement of stmts, or the first error.
// A write's statements carry the durability pin themselves (pgDurable).
// Everything leaves in one write ending in one Sync and the reply ends
// with one ReadyForQuery, so it is one round trip. The arguments are
// encoded here and sent with the unnamed statement, as in pgx's
// QueryExecModeExec: nothing is prepared, which would cost a second round
// trip on a new connection.
func send(ctx context.Context, c *pgx.Conn, stmts ...pgStmt) ([]*pgconn.Result, error) {
	batch := &pgconn.Batch{}
	batch.ExecParams(pgPinIsolation, nil, nil, nil, nil)
	for _, st := range stmts {
		var b pgx.ExtendedQueryBuilder
		if err := b.Build(c.TypeMap(), nil, st.args); err != nil {
			return nil, err
		}
		batch.ExecParams(st.sql, b.ParamValues, nil, b.ParamFormats, nil)
	}
	results, err := c.PgConn().ExecBatch(ctx, batch).ReadAll()
	for _, r := range results {
		if r.Err != nil {
			return nil, r.Err // the server rolled the transaction back
		}
	}
	if err != nil {
		return nil, err
	}
	if len(results) != 1+len(stmts) {
		return nil, errors.New("unexpected reply: wrong number of results")
	}
	return results[1:], nil
}
