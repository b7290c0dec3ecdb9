package runlease

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"sync"

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
// A third pin leads the batched writes (MetaBatch, MetaCASMany), whose
// statements look up a list of keys and join it with their arguments:
//
//   - pgPinIndex turns sequential scans off for the transaction. A
//     connection keeps the generic plan of a prepared statement it made
//     once, from the statistics of that moment; made while the table was
//     young (a few hundred rows), that plan finds a batch's keys by reading
//     the whole table, and goes on doing so on every call as the table
//     grows to 100,000 queued runs, until the next ANALYZE. Every statement
//     of the store looks rows up by the primary key, so it never wants a
//     sequential scan; with them off, every plan, generic or not, uses the
//     index. TestPostgresBatchesFindTheirRowsByKeyWhateverThePlan checks
//     it. A single-key statement goes without the pin, a statement of its
//     own that every lease call would pay for: its plan reads the primary
//     key on any table of more than one page, and a table of one page is
//     analysed again by autovacuum after 50 rows change, which makes the
//     connections plan again.
//
// All end at the call's commit and travel in the same message as the
// call's statements, so a call stays one round trip and leaves the
// settings of the caller's connections as they were. (What the store
// leaves on a connection is its prepared statements; see send.)
const (
	pgPinIsolation = `SET transaction_isolation = 'read committed'`
	pgDurable      = `CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN set_config('synchronous_commit', 'on', true) END`
	pgPinDurable   = `SELECT ` + pgDurable
	pgPinIndex     = `SELECT set_config('enable_seqscan', 'off', true)`
)

// sendByIndex is send with the statements led by pgPinIndex, whose result
// it leaves out.
func sendByIndex(ctx context.Context, c *pgx.Conn, stmts ...pgStmt) ([]*pgconn.Result, error) {
	res, err := send(ctx, c, append([]pgStmt{{sql: pgPinIndex}}, stmts...)...)
	if err != nil {
		return nil, err
	}
	return res[1:], nil
}

// pgStmt is one statement of a call, with its arguments.
type pgStmt struct {
	sql  string
	args []any
}

// send runs stmts on c as one implicit transaction, led by the isolation
// pin, and returns one result per statement of stmts, or the first error.
// A write's statements carry the durability pin themselves (pgDurable).
// Everything leaves in one write ending in one Sync and the reply ends
// with one ReadyForQuery, so it is one round trip.
//
// The statements run as named prepared statements of the connection, so
// the server parses and plans each once per connection instead of at every
// call (about a sixth of a fenced write's server time, more for the longer
// statements). A statement the connection has not prepared yet is prepared
// in the same message, ahead of its first use, after a Close of its name
// (which the server ignores when nothing has the name): preparing costs no
// round trip of its own, and a statement the connection forgot it had is
// prepared afresh. A call that finds a name missing (DEALLOCATE or DISCARD
// by other code sharing the pool, or a proxy that moves sessions between
// server connections) or a plan gone stale (the table's row type altered)
// is answered with an ERROR, which rolled the whole call back, so it goes
// out again with its statements prepared afresh;
// after pgMaxNameFaults of those the connection prepares nothing any more.
func send(ctx context.Context, c *pgx.Conn, stmts ...pgStmt) ([]*pgconn.Result, error) {
	ps := connStatements(c)
	for ps.faults < pgMaxNameFaults {
		res, err := sendPrepared(ctx, c, ps, stmts)
		if !pgNameFault(err) {
			return res, err
		}
		ps.faults++
		clear(ps.names)
	}
	return sendUnnamed(ctx, c, stmts...)
}

// sendUnnamed is send with every statement parsed afresh as the unnamed
// statement, as in pgx's QueryExecModeExec; DDL, which runs once, goes
// this way.
func sendUnnamed(ctx context.Context, c *pgx.Conn, stmts ...pgStmt) ([]*pgconn.Result, error) {
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

const (
	// pgMaxConnStatements bounds the statements one connection prepares;
	// past it (stores on many tables sharing a pool), new ones go unnamed.
	pgMaxConnStatements = 256
	// pgMaxNameFaults is how many calls on one connection may find a
	// prepared statement missing or its name taken before the connection
	// stops preparing.
	pgMaxNameFaults = 3
	pgConnDataKey   = "runlease.statements"
)

// pgConnStatements is what one connection has prepared. A connection is
// used by one call at a time, so it needs no lock.
type pgConnStatements struct {
	// names maps each statement prepared on the connection to what the
	// server said of it, whose parameter types let later uses send
	// arguments in binary (text arrays, above all, which the text format
	// must quote and escape element by element).
	names  map[string]*pgconn.StatementDescription
	faults int
}

func connStatements(c *pgx.Conn) *pgConnStatements {
	data := c.PgConn().CustomData()
	ps, _ := data[pgConnDataKey].(*pgConnStatements)
	if ps == nil {
		ps = &pgConnStatements{names: map[string]*pgconn.StatementDescription{}}
		data[pgConnDataKey] = ps
	}
	return ps
}

// pgStatementNames caches each statement's name: "runlease_" and a hash of
// its text, so that every connection and every store on one table agree.
var pgStatementNames sync.Map // sql → name

func pgStatementName(sql string) string {
	if n, ok := pgStatementNames.Load(sql); ok {
		return n.(string)
	}
	h := sha256.Sum256([]byte(sql))
	n := "runlease_" + hex.EncodeToString(h[:16])
	pgStatementNames.Store(sql, n)
	return n
}

// pgNameFault reports whether err says a prepared statement was missing
// (26000), its name already taken (42P05), or its plan stale: the table's
// row type changed under it (a column's collation altered, say), which the
// server refuses with 0A000 rather than plan the statement again. Each is
// an ERROR, so the call was rolled back, and preparing afresh mends it.
func pgNameFault(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "26000", "42P05":
		return true
	case "0A000":
		return strings.Contains(pgErr.Message, "cached plan must not change result type")
	}
	return false
}

func sendPrepared(ctx context.Context, c *pgx.Conn, ps *pgConnStatements, stmts []pgStmt) ([]*pgconn.Result, error) {
	p := c.PgConn().StartPipeline(ctx)
	var preparing []string
	queue := func(sql string, args []any) error {
		name := pgStatementName(sql)
		sd, ok := ps.names[name]
		if !ok && !slices.Contains(preparing, name) {
			if len(ps.names)+len(preparing) >= pgMaxConnStatements {
				name = "" // parsed for this use only
			}
			preparing = append(preparing, name) // in the order of their replies
			if name != "" {
				p.SendDeallocate(name)
			}
			p.SendPrepare(name, sql, nil)
		}
		// A statement's first use sends its arguments as text, for the
		// server to read as the types it infers; later ones in each
		// type's preferred format.
		var b pgx.ExtendedQueryBuilder
		if err := b.Build(c.TypeMap(), sd, args); err != nil {
			return err
		}
		p.SendQueryPrepared(name, b.ParamValues, b.ParamFormats, nil)
		return nil
	}
	err := queue(pgPinIsolation, nil)
	for i := 0; err == nil && i < len(stmts); i++ {
		err = queue(stmts[i].sql, stmts[i].args)
	}
	if err == nil {
		err = p.Sync()
	}
	if err != nil {
		_ = p.Close()
		return nil, err
	}
	results := make([]*pgconn.Result, 0, 1+len(stmts))
	prepared := make([]*pgconn.StatementDescription, 0, len(preparing))
	var first error
	for {
		r, err := p.GetResults()
		if err != nil {
			first = cmp.Or(first, err)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && !pgFatal(pgErr) {
				continue // the server skips to the Sync, which still comes
			}
			break
		}
		switch r := r.(type) {
		case *pgconn.StatementDescription:
			prepared = append(prepared, r)
		case *pgconn.CloseComplete:
		case *pgconn.ResultReader:
			res := r.Read()
			if res.Err != nil {
				first = cmp.Or(first, res.Err)
			}
			results = append(results, res)
		case *pgconn.PipelineSync:
		case nil:
			first = cmp.Or(first, errors.New("unexpected reply: results ended early"))
		}
		if _, ok := r.(*pgconn.PipelineSync); ok || r == nil {
			break
		}
	}
	// A statement parsed stays prepared whatever became of the call: the
	// server keeps it through the transaction's rollback. The ones after
	// an error were skipped.
	for i, sd := range prepared[:min(len(prepared), len(preparing))] {
		if name := preparing[i]; name != "" {
			ps.names[name] = sd
		}
	}
	if err := p.Close(); err != nil {
		first = cmp.Or(first, err)
	}
	if first != nil {
		return nil, first
	}
	if len(results) != 1+len(stmts) {
		return nil, errors.New("unexpected reply: wrong number of results")
	}
	return results[1:], nil
}
