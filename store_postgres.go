package runlease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The shared store's statements. %s stands for the sanitized table name and
// is filled in once, at open; keys and values always travel as parameters.
// Each write returns pgDurable of the row it writes, which pins its commit's
// durability (see store_postgres_pin.go); its command tag still counts the
// rows written.
// The key column's "C" collation makes every comparison byte order, the
// order MetaScan promises, and lets the range scan use the primary key.
const (
	pgSchema   = `CREATE TABLE IF NOT EXISTS %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL)`
	pgGet      = `SELECT value FROM %s WHERE key = $1`
	pgInsert   = `INSERT INTO %s (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING ` + pgDurable
	pgUpdate   = `UPDATE %s SET value = $3 WHERE key = $1 AND value = $2 RETURNING ` + pgDurable
	pgDelete   = `DELETE FROM %s WHERE key = $1 AND value = $2 RETURNING ` + pgDurable
	pgScan     = `SELECT key, value FROM %s WHERE key >= $1 AND key < $2 ORDER BY key`
	pgScanOpen = `SELECT key, value FROM %s WHERE key >= $1 ORDER BY key`

	// pgRelation and pgColumns inspect an existing table. $1 is the
	// sanitized name, which to_regclass resolves as the statements above do
	// (through search_path when it has no schema); there is no row when
	// there is no such relation. pgRelation gives its kind, its persistence
	// ('p' permanent, 'u' unlogged, 't' temporary), whether any partition of
	// it is not permanent, and its schema-qualified name, quoted.
	pgRelation = `SELECT c.relkind::text, c.relpersistence::text,
	EXISTS (SELECT 1 FROM pg_partition_tree(c.oid) p JOIN pg_class pc ON pc.oid = p.relid
		WHERE pc.relpersistence <> 'p'),
	format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`
	pgColumns = `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
	coalesce(co.collname::text, ''), coalesce(co.collisdeterministic, true),
	EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary
		AND i.indnatts = 1 AND i.indkey[0] = a.attnum)
FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`
)

// pgMode is how the store sends the statements that are not calls of the
// Store (the schema check at open, the clock's samples): with the extended
// protocol and no prepared statement, so that each is one round trip on a
// fresh connection too (the default mode prepares first, which costs a
// second round trip per connection), and works behind transaction pooling
// proxies. The calls themselves go through send, which does the same for
// several statements at once.
const pgMode = pgx.QueryExecModeExec

// DefaultPostgresTable is the table a [PostgresStore] uses unless
// [WithTable] names another.
const DefaultPostgresTable = "runlease_meta"

// PostgresOption configures [OpenPostgres] and [NewPostgres].
type PostgresOption func(*pgOptions)

type pgOptions struct {
	table  string
	create bool
	local  func() time.Time
}

// WithTable makes the store use the named table instead of
// [DefaultPostgresTable]. The name is used exactly as given, case and all, as
// a quoted identifier; a name with one dot, such as "myschema.leases", names
// a table in that schema, and one without a dot resolves through search_path.
// Each part must be non-empty, valid UTF-8 without NUL and at most 63 bytes
// long (PostgreSQL would otherwise shorten it); otherwise the open fails with
// an error matching [ErrInvalidArgument].
func WithTable(name string) PostgresOption {
	return func(o *pgOptions) { o.table = name }
}

// WithCreateTable controls whether opening creates the table when it is
// absent (the default, true). With false, for deployments whose migrations
// own the schema (see [PostgresSchema]), a missing table is a
// [*SchemaError]. An existing table is checked either way, and never changed.
func WithCreateTable(create bool) PostgresOption {
	return func(o *pgOptions) { o.create = create }
}

// PostgresStore is the shared [Store]: one table in PostgreSQL that any
// number of nodes use at once. Each call is one implicit transaction at
// READ COMMITTED, so a conditional write is atomic on its own row: MetaCAS
// is an INSERT … ON CONFLICT DO NOTHING or an UPDATE whose WHERE clause
// holds the expected value, and MetaDelete a DELETE of the same kind. A
// write's commit waits until its WAL is flushed. The store pins both for
// its own transactions, whatever the role, the database or the connection
// defaults to (default_transaction_isolation, synchronous_commit), without
// changing the connection's settings: a losing racer gets false, nil, not a
// serialization failure, and an acknowledged write survives a crash of the
// server.
//
// Each call is one round trip on a connection of the pool: its statements,
// led by the isolation pin, each one that writes carrying the durability
// pin, leave in one write with one Sync. They run as prepared statements of
// the connection (named "runlease_" and a hash of their text), each
// prepared in the message of its first use, so preparing costs no round
// trip of its own; a call that finds one dropped by other code on the
// connection (DEALLOCATE, DISCARD ALL) was rolled back, and goes out again
// with it prepared afresh. pgxpool
// may ping a connection that sat idle for more than a second before
// handing it out; that check precedes the call, and a connection that
// fails it is replaced.
//
// Faults are [*StorageError] values wrapping pgx's error. A write whose
// statement may have reached the server before the fault (a timeout, a
// cancelled context or a dropped connection after sending, or a FATAL error
// from the server) is reported with Unknown set, and so is a write whose
// context ended before its reply was read, even one the server said it
// committed: with a synchronous standby, that may be a commit whose wait
// for the standby was cancelled, which a failover loses. A MetaGet of a
// key after a write of it whose outcome was unknown (the read-back that
// resolves the write) is itself a commit that waits for the standby, so a
// row it returns has landed for good; it needs EXECUTE on
// pg_logical_emit_message, which every role has unless it was revoked. It
// also waits while the server may still run such a write, whose client
// gave it up, so that the row it returns is not one that write replaces
// after it (store_postgres_doubt.go). A
// refused connection or an ERROR from the server, after which the call's
// transaction was rolled back, is not. When the call's context has ended, the error matches the
// context's error with [errors.Is] and is not Retryable, however pgx
// handled the end (by cutting the connection, or by a cancel request that
// the server answers with an ERROR). No message carries the password of the
// pool's configuration.
//
// It needs PostgreSQL 12 or later. A PostgresStore is safe for concurrent
// use.
type PostgresStore struct {
	pool    *pgxpool.Pool
	owned   bool   // the pool was opened by OpenPostgres, and Close closes it
	table   string // as given to WithTable
	secret  string // the password of the pool's config, kept out of messages
	q       pgQueries
	clock   *pgClock
	channel string // the table's LISTEN/NOTIFY channel, from its resolved name
	listen  pgListener
	waiters pgWaiters // the marks of the keys this store's subscribers wait on
	doubts  pgDoubts  // keys whose last write's outcome is unknown (store_postgres_doubt.go)
	closed  atomic.Bool
}

// pgQueries are the statements for one table, formatted at open.
type pgQueries struct {
	get, insert, update, del, scan, scanOpen string
	getDurable                               string // get through a barrier (store_postgres_doubt.go)
	batchHold, batchApply                    string
	batchFenced, batchFencedOne              string
	insertNotify, updateNotify               string
	deleteNotify                             string
	markPut, markDelete, markExpired         string
	casMany                                  string
	rangeTo, rangeOpen, rangesOne            string // store_postgres_range.go
}

// OpenPostgres opens a pool on dsn (a pgx connection string: a URL or
// key=value pairs, including pool_ settings) and returns a store that owns
// it: Close closes the pool. It creates the table if it is absent and
// checks its shape; see [NewPostgres].
//
// On failure it closes the pool and returns an error matching
// [ErrInvalidArgument] (a bad option or a DSN pgx cannot parse, whose
// message then leaves out pgx's text because it may quote the password),
// [ErrSchemaMismatch], or [ErrStorage] (the server could not be reached or
// refused the table).
func OpenPostgres(ctx context.Context, dsn string, opts ...PostgresOption) (*PostgresStore, error) {
	o, id, err := pgApply(opts)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, &dsnParseError{arg: invalidArg("dsn", "pgx cannot parse it: %s", dsnReason(dsn, err)), err: err}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		s := &PostgresStore{secret: cfg.ConnConfig.Password}
		return nil, s.fault(ctx, "OpenPostgres", "", false, false, err)
	}
	s, err := newPostgresStore(ctx, "OpenPostgres", pool, true, o, id)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// NewPostgres returns a store on the caller's pool. It never closes or
// reconfigures the pool: Close on the store only stops the store, and the
// caller closes the pool when it is done with it.
//
// The table ([DefaultPostgresTable] unless [WithTable] says otherwise) is
// created when absent, unless WithCreateTable(false), and safely so when
// several nodes open it at once. An existing table must have exactly the
// columns key (text COLLATE "C", the primary key) and value (text NOT NULL,
// with a deterministic collation), and be a permanent table, in every
// partition: an UNLOGGED table, which a crash of the server empties so that
// fences would start again at 1, or a TEMPORARY one, private to one
// connection, is refused. Otherwise NewPostgres returns a [*SchemaError]
// naming the problem. On failure nothing else is left behind.
func NewPostgres(ctx context.Context, pool *pgxpool.Pool, opts ...PostgresOption) (*PostgresStore, error) {
	if pool == nil {
		return nil, invalidArg("pool", "nil")
	}
	o, id, err := pgApply(opts)
	if err != nil {
		return nil, err
	}
	return newPostgresStore(ctx, "NewPostgres", pool, false, o, id)
}

func pgApply(opts []PostgresOption) (pgOptions, pgx.Identifier, error) {
	o := pgOptions{table: DefaultPostgresTable, create: true}
	for _, opt := range opts {
		opt(&o)
	}
	id, err := pgTableIdent(o.table)
	return o, id, err
}

func newPostgresStore(ctx context.Context, op string, pool *pgxpool.Pool, owned bool, o pgOptions, id pgx.Identifier) (*PostgresStore, error) {
	t := id.Sanitize()
	s := &PostgresStore{
		waiters: newPgWaiters(),
		pool:    pool,
		owned:   owned,
		table:   o.table,
		secret:  pool.Config().ConnConfig.Password,
		q: pgQueries{
			get:      fmt.Sprintf(pgGet, t),
			insert:   fmt.Sprintf(pgInsert, t),
			update:   fmt.Sprintf(pgUpdate, t),
			del:      fmt.Sprintf(pgDelete, t),
			scan:     fmt.Sprintf(pgScan, t),
			scanOpen: fmt.Sprintf(pgScanOpen, t),
		},
	}
	s.q.getDurable = fmt.Sprintf(pgGetDurable, t)
	formatBatch(&s.q, t)
	formatCASMany(&s.q, t)
	formatRanges(&s.q, t)
	s.q.insertNotify = fmt.Sprintf(pgInsertNotify, t)
	s.q.updateNotify = fmt.Sprintf(pgUpdateNotify, t)
	formatMarks(&s.q, t)
	formatDeleteNotify(&s.q, t)
	resolved, err := s.prepareTable(ctx, op, t, o.create)
	if err != nil {
		return nil, err
	}
	s.channel = pgChannel(resolved)
	if err := s.startClock(ctx, o.local); err != nil {
		return nil, err
	}
	return s, nil
}

// Table returns the table name the store was opened with.
func (s *PostgresStore) Table() string { return s.table }

// Closed implements [ClosedReporter]: it reports whether Close has begun.
func (s *PostgresStore) Closed() bool { return s.closed.Load() }

// Close stops the store; calls after Close fail with [ErrStoreClosed]. A
// store from OpenPostgres also closes its pool, waiting for calls in flight
// to return their connections; one from NewPostgres leaves the pool open.
// Close is idempotent and always returns nil.
func (s *PostgresStore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	ForgetStore(s)
	s.stopClock()
	s.stopListening(false)
	if s.owned {
		s.pool.Close()
	}
	return nil
}

// MetaGet implements [Store].
func (s *PostgresStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if err := s.check(key); err != nil {
		return "", false, err
	}
	if s.doubts.has(key) {
		return s.getDurable(ctx, key)
	}
	var v string
	var found bool
	err := s.do(ctx, "MetaGet", key, false, func(c *pgx.Conn) error {
		res, err := send(ctx, c, pgStmt{s.q.get, []any{key}})
		if err == nil && len(res[0].Rows) == 1 {
			v, found = string(res[0].Rows[0][0]), true
		}
		return err
	})
	if err != nil {
		return "", false, err
	}
	return v, found, nil
}

// MetaCAS implements [Store].
func (s *PostgresStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := s.check(key); err != nil {
		return false, err
	}
	if err := CheckValue(value); err != nil {
		return false, err
	}
	if expected == nil {
		return s.exec(ctx, "MetaCAS", key, s.q.insert, key, value)
	}
	if CheckValue(*expected) != nil {
		return s.neverMatches(ctx, "MetaCAS", key)
	}
	return s.exec(ctx, "MetaCAS", key, s.q.update, key, *expected, value)
}

// MetaDelete implements [Store].
func (s *PostgresStore) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if err := s.check(key); err != nil {
		return false, err
	}
	if CheckValue(expected) != nil {
		return s.neverMatches(ctx, "MetaDelete", key)
	}
	return s.exec(ctx, "MetaDelete", key, s.q.del, key, expected)
}

// MetaScan implements [Store].
func (s *PostgresStore) MetaScan(ctx context.Context, prefix string) ([]Row, error) {
	if s.closed.Load() {
		return nil, ErrStoreClosed
	}
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	st := pgStmt{s.q.scanOpen, []any{prefix}}
	if end, ok := PrefixEnd(prefix); ok {
		st = pgStmt{s.q.scan, []any{prefix, end}}
	}
	out := []Row{}
	err := s.do(ctx, "MetaScan", prefix, false, func(c *pgx.Conn) error {
		res, err := send(ctx, c, st)
		if err != nil {
			return err
		}
		for _, r := range res[0].Rows {
			out = append(out, Row{Key: string(r[0]), Value: string(r[1])})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *PostgresStore) check(key string) error {
	if s.closed.Load() {
		return ErrStoreClosed
	}
	return CheckKey(key)
}

// neverMatches answers a conditional write whose expected value no row can
// hold, because CheckValue refuses it: the condition is false, as on the
// embedded store, which compares without checking. The server would refuse
// such text instead of comparing it, so it is not sent.
func (s *PostgresStore) neverMatches(ctx context.Context, op, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, s.fault(ctx, op, key, true, false, err)
	}
	return false, nil
}

// exec runs a conditional write and reports whether it changed a row.
func (s *PostgresStore) exec(ctx context.Context, op, key, sql string, args ...any) (bool, error) {
	var n int64
	var run pgRun
	err := s.do(ctx, op, key, true, func(c *pgx.Conn) error {
		defer func() { run = runOf(c) }()
		res, err := send(ctx, c, pgStmt{sql, args})
		if err == nil {
			n = res[0].CommandTag.RowsAffected()
		}
		return err
	})
	s.note(err, n == 1, run, key)
	return n == 1, err
}

// do runs stmt on a connection of its own. Taking the connection is a step
// of its own so that a fault there is known to have sent nothing.
func (s *PostgresStore) do(ctx context.Context, op, key string, write bool, stmt func(*pgx.Conn) error) error {
	for try := 0; ; try++ {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return s.fault(ctx, op, key, write, false, err)
		}
		err = stmt(conn.Conn())
		conn.Release() // a connection that broke is destroyed, not pooled again
		if cerr := ctx.Err(); err == nil && write && cerr != nil {
			// The server answered that the write committed, but the
			// answer may be that of a commit whose wait for a
			// synchronous standby the context's end cancelled: committed
			// here, perhaps not there (store_postgres_doubt.go).
			err = fmt.Errorf("the write's wait for a synchronous standby may have been cancelled: %w", cerr)
		}
		if err == nil {
			return nil
		}
		if try < maxUnsentRetries && ctx.Err() == nil && (pgconn.SafeToRetry(err) || !write && connBroke(err)) {
			// Nothing reached the server, or the call only reads: the
			// pooled connection was dead (its server restarted, or a
			// failover moved the primary), so the call goes out again on
			// another, or on a new one.
			continue
		}
		return s.fault(ctx, op, key, write, true, err)
	}
}

// connBroke reports whether err is the failure of the connection, not an
// answer of the server.
func connBroke(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) || pgFatal(pgErr)
}

// maxUnsentRetries bounds how many times one call is sent again after a
// pooled connection failed before sending anything (or, for a read, at
// all): after a server restart
// or failover every idle connection of the pool is dead, and each is found
// so only when used.
const maxUnsentRetries = 16
