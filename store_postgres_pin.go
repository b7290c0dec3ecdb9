package runlease

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The pins lead the statements of every call, in the same implicit
// transaction, so that the store's guarantees do not depend on defaults a
// role, a database or a connection may set (ALTER ROLE … SET, a DSN's
// options, a pool's AfterConnect):
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
//     changes. It must come first: the level is fixed by the first snapshot.
//   - pgPinDurable makes a write's commit wait for its WAL to be flushed,
//     so that an acknowledged write survives a crash of the server: with
//     synchronous_commit = off, an immediate restart loses the last commits
//     and fences would go backwards. set_config(…, true) sets it for this
//     transaction only, without a warning. A setting that already waits for
//     the local flush (on, remote_write, remote_apply) is left as it is; off
//     and local become on, which also waits for synchronous standbys, if
//     any, so that a failover keeps the write too.
//
// Both travel in the same message as the statement and end at its commit,
// so a call stays one round trip, works through transaction-pooling
// proxies, and leaves the caller's connections as they were.
const (
	pgPinIsolation = `SET transaction_isolation = 'read committed'`
	pgPinDurable   = `SELECT set_config('synchronous_commit', 'on', true) WHERE current_setting('synchronous_commit') IN ('off', 'local')`
)

// pgStmt is one statement of a call, with its arguments.
type pgStmt struct {
	sql  string
	args []any
}

// send runs stmts on c as one implicit transaction, led by the pins (the
// durability pin only for a write), and returns one result per statement of
// stmts, or the first error. Everything leaves in one write ending in one
// Sync and the reply ends with one ReadyForQuery, so it is one round trip.
// The arguments are encoded here and sent with the unnamed statement, as in
// pgx's QueryExecModeExec: nothing is prepared, which would cost a second
// round trip on a new connection.
func send(ctx context.Context, c *pgx.Conn, write bool, stmts ...pgStmt) ([]*pgconn.Result, error) {
	batch := &pgconn.Batch{}
	batch.ExecParams(pgPinIsolation, nil, nil, nil, nil)
	pins := 1
	if write {
		batch.ExecParams(pgPinDurable, nil, nil, nil, nil)
		pins++
	}
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
	if len(results) != pins+len(stmts) {
		return nil, errors.New("unexpected reply: wrong number of results")
	}
	return results[pins:], nil
}
