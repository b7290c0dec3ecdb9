package runlease

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The shared store's statements. %s stands for the sanitized table name and
// is filled in once, at open; keys and values always travel as parameters.
// The key column's "C" collation makes every comparison byte order, the
// order MetaScan promises, and lets the range scan use the primary key.
const (
	pgSchema   = `CREATE TABLE IF NOT EXISTS %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL)`
	pgGet      = `SELECT value FROM %s WHERE key = $1`
	pgInsert   = `INSERT INTO %s (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`
	pgUpdate   = `UPDATE %s SET value = $3 WHERE key = $1 AND value = $2`
	pgDelete   = `DELETE FROM %s WHERE key = $1 AND value = $2`
	pgScan     = `SELECT key, value FROM %s WHERE key >= $1 AND key < $2 ORDER BY key`
	pgScanOpen = `SELECT key, value FROM %s WHERE key >= $1 ORDER BY key`

	// pgRelkind and pgColumns inspect an existing table. $1 is the sanitized
	// name, which to_regclass resolves as the statements above do (through
	// search_path when it has no schema); it is NULL when there is no table.
	pgRelkind = `SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)`
	pgColumns = `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
	coalesce(co.collname::text, ''), coalesce(co.collisdeterministic, true),
	EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary
		AND i.indnatts = 1 AND i.indkey[0] = a.attnum)
FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`
)

// pgMode sends every statement with the extended protocol and no prepared
// statement: Parse, Bind, Describe, Execute and Sync leave in one write and
// the reply ends with one ReadyForQuery, so each Store call is one round
// trip, on a fresh connection too (the default mode prepares first, which
// costs a second round trip per connection), and works behind transaction
// pooling proxies. Every parameter is a string, whose type the server infers
// from the column it is compared with.
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

// PostgresSchema returns the statement that creates the store's table, for
// migration tools: the one OpenPostgres runs when the table is absent. It
// fails with an error matching [ErrInvalidArgument] when table is not a name
// [WithTable] accepts.
func PostgresSchema(table string) (string, error) {
	id, err := pgTableIdent(table)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(pgSchema, id.Sanitize()), nil
}

func pgTableIdent(name string) (pgx.Identifier, error) {
	if name == "" {
		return nil, invalidArg("table", "empty")
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, invalidArg("table", "%q has %d dot-separated parts, want table or schema.table", name, len(parts))
	}
	for _, p := range parts {
		switch {
		case p == "":
			return nil, invalidArg("table", "%q has an empty part", name)
		case !utf8.ValidString(p):
			return nil, invalidArg("table", "%q is not valid UTF-8", name)
		case strings.IndexByte(p, 0) >= 0:
			return nil, invalidArg("table", "%q contains NUL", name)
		case len(p) > 63:
			return nil, invalidArg("table", "%q is %d bytes long, PostgreSQL names hold at most 63", p, len(p))
		}
	}
	return pgx.Identifier(parts), nil
}

// SchemaError reports that the store's table does not have the shape
// [PostgresSchema] gives it, or, with WithCreateTable(false), does not
// exist. The store never alters an existing table, so nothing was changed. It
// matches [ErrSchemaMismatch].
type SchemaError struct {
	Table   string // the table as given to WithTable
	Problem string // what is wrong, such as "column value has type jsonb, want text"
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("%s: table %q does not fit the store: %s", CodeSchemaMismatch, e.Table, e.Problem)
}

// Code returns [CodeSchemaMismatch].
func (e *SchemaError) Code() string { return CodeSchemaMismatch }

// Is reports whether target is [ErrSchemaMismatch].
func (e *SchemaError) Is(target error) bool { return target == ErrSchemaMismatch }

// PostgresStore is the shared [Store]: one table in PostgreSQL that any
// number of nodes use at once. Each call is one statement in autocommit mode
// (READ COMMITTED), so a conditional write is atomic on its own row: MetaCAS
// is an INSERT … ON CONFLICT DO NOTHING or an UPDATE whose WHERE clause
// holds the expected value, and MetaDelete a DELETE of the same kind.
//
// Each call is one round trip on a connection of the pool (see pgx's
// QueryExecModeExec). pgxpool may ping a connection that sat idle for more
// than a second before handing it out; that check precedes the statement,
// and a connection that fails it is replaced.
//
// Faults are [*StorageError] values wrapping pgx's error. A write whose
// statement may have reached the server before the fault (a timeout, a
// cancelled context or a dropped connection after sending, or a FATAL error
// from the server) is reported with Unknown set; a refused connection or an
// ERROR from the server, after which the statement was rolled back, is not.
// A context's error stays reachable with [errors.Is], and no message carries
// the password of the pool's configuration.
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
	channel string // the table's LISTEN/NOTIFY channel
	listen  pgListener
	closed  atomic.Bool
}

// pgQueries are the statements for one table, formatted at open.
type pgQueries struct {
	get, insert, update, del, scan, scanOpen string
	batchHold, batchApply                    string
	insertNotify, updateNotify               string
	casMany                                  string
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
		return nil, fmt.Errorf("%w: %w", invalidArg("dsn", "pgx cannot parse it"), withheldError{err})
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
// with a deterministic collation); otherwise NewPostgres returns a
// [*SchemaError] naming the problem. On failure nothing else is left behind.
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
		pool:   pool,
		owned:  owned,
		table:  o.table,
		secret: pool.Config().ConnConfig.Password,
		q: pgQueries{
			get:      fmt.Sprintf(pgGet, t),
			insert:   fmt.Sprintf(pgInsert, t),
			update:   fmt.Sprintf(pgUpdate, t),
			del:      fmt.Sprintf(pgDelete, t),
			scan:     fmt.Sprintf(pgScan, t),
			scanOpen: fmt.Sprintf(pgScanOpen, t),
		},
	}
	formatBatch(&s.q, t)
	formatCASMany(&s.q, t)
	s.q.insertNotify = fmt.Sprintf(pgInsertNotify, t)
	s.q.updateNotify = fmt.Sprintf(pgUpdateNotify, t)
	s.channel = pgChannel(t)
	if err := s.prepareTable(ctx, op, t, o.create); err != nil {
		return nil, err
	}
	if err := s.startClock(ctx, o.local); err != nil {
		return nil, err
	}
	return s, nil
}

// prepareTable checks the table, creating it first when it is absent and
// create is set.
func (s *PostgresStore) prepareTable(ctx context.Context, op, table string, create bool) error {
	for attempt := 0; ; attempt++ {
		kind, problems, err := s.inspect(ctx, op, table)
		switch {
		case err != nil:
			return err
		case kind != "" && len(problems) > 0:
			return &SchemaError{Table: s.table, Problem: strings.Join(problems, "; ")}
		case kind != "":
			return nil
		case !create:
			return &SchemaError{Table: s.table, Problem: "table does not exist (create it with the statement of PostgresSchema)"}
		case attempt == 3:
			return &SchemaError{Table: s.table, Problem: "table is not visible after creating it (check search_path)"}
		}
		err = s.do(ctx, op, "", true, func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, fmt.Sprintf(pgSchema, table), pgMode)
			return err
		})
		// Two sessions that run CREATE TABLE IF NOT EXISTS at once can both
		// miss the other's uncommitted table; the loser then fails on a
		// catalog unique index once the winner commits. The table exists by
		// then, so look again.
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07")) {
			return err
		}
	}
}

// inspect returns the table's relkind ("" when there is no such table) and
// what is wrong with its shape.
func (s *PostgresStore) inspect(ctx context.Context, op, table string) (string, []string, error) {
	var kind string
	var problems []string
	err := s.do(ctx, op, "", false, func(c *pgx.Conn) error {
		err := c.QueryRow(ctx, pgRelkind, pgMode, table).Scan(&kind)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		rows, err := c.Query(ctx, pgColumns, pgMode, table)
		if err != nil {
			return err
		}
		cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pgColumn])
		problems = shapeProblems(kind, cols)
		return err
	})
	return kind, problems, err
}

type pgColumn struct {
	Name, Type    string
	NotNull       bool
	Collation     string
	Deterministic bool
	PrimaryKey    bool
}

func shapeProblems(kind string, cols []pgColumn) []string {
	var p []string
	if kind != "r" && kind != "p" {
		p = append(p, fmt.Sprintf("relation is not a table (relkind %q)", kind))
	}
	seen := map[string]bool{}
	for _, c := range cols {
		seen[c.Name] = true
		switch {
		case c.Name != "key" && c.Name != "value":
			p = append(p, fmt.Sprintf("unexpected column %q", c.Name))
		case c.Type != "text":
			p = append(p, fmt.Sprintf("column %s has type %s, want text", c.Name, c.Type))
		case c.Name == "key" && c.Collation != "C" && c.Collation != "POSIX":
			p = append(p, fmt.Sprintf(`column key has collation %q, want "C"`, c.Collation))
		case c.Name == "value" && !c.Deterministic:
			p = append(p, fmt.Sprintf("column value has the nondeterministic collation %q", c.Collation))
		}
		if c.Name == "key" && !c.PrimaryKey {
			p = append(p, "column key is not the primary key")
		}
		if c.Name == "value" && !c.NotNull {
			p = append(p, "column value is not NOT NULL")
		}
	}
	for _, name := range []string{"key", "value"} {
		if !seen[name] {
			p = append(p, fmt.Sprintf("column %s is missing", name))
		}
	}
	return p
}

// Table returns the table name the store was opened with.
func (s *PostgresStore) Table() string { return s.table }

// Close stops the store; calls after Close fail with [ErrStoreClosed]. A
// store from OpenPostgres also closes its pool, waiting for calls in flight
// to return their connections; one from NewPostgres leaves the pool open.
// Close is idempotent and always returns nil.
func (s *PostgresStore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
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
	var v string
	found := true
	err := s.do(ctx, "MetaGet", key, false, func(c *pgx.Conn) error {
		err := c.QueryRow(ctx, s.q.get, pgMode, key).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			found, err = false, nil
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
	var out []Row
	err := s.do(ctx, "MetaScan", prefix, false, func(c *pgx.Conn) error {
		var rows pgx.Rows
		var err error
		if end, ok := PrefixEnd(prefix); ok {
			rows, err = c.Query(ctx, s.q.scan, pgMode, prefix, end)
		} else {
			rows, err = c.Query(ctx, s.q.scanOpen, pgMode, prefix)
		}
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Row])
		return err
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
	err := s.do(ctx, op, key, true, func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, sql, append([]any{pgMode}, args...)...)
		n = tag.RowsAffected()
		return err
	})
	return n == 1, err
}

// do runs stmt on a connection of its own. Taking the connection is a step
// of its own so that a fault there is known to have sent nothing.
func (s *PostgresStore) do(ctx context.Context, op, key string, write bool, stmt func(*pgx.Conn) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.fault(ctx, op, key, write, false, err)
	}
	defer conn.Release()
	if err := stmt(conn.Conn()); err != nil {
		return s.fault(ctx, op, key, write, true, err)
	}
	return nil
}

// fault classifies an error of pgx. sent is false when the statement never
// left (the connection could not be taken), so nothing can have changed; a
// write that may have reached the server is Unknown unless the server
// answered with an ERROR, which rolls the autocommit statement back.
func (s *PostgresStore) fault(ctx context.Context, op, key string, write, sent bool, err error) error {
	var pgErr *pgconn.PgError
	isPg := errors.As(err, &pgErr)
	if isPg && (pgErr.Code == "22021" || pgErr.Code == "22P05") {
		// The database's encoding cannot hold the text. CheckKey and
		// CheckValue let only UTF-8 through, so this is a database whose
		// encoding is not UTF-8: the call is refused like any bad argument.
		return fmt.Errorf("%w: %w", invalidArg("text", "the database cannot store it in its encoding"), s.redact(err))
	}
	if !sent && s.closed.Load() {
		return ErrStoreClosed
	}
	if cerr := ctx.Err(); cerr != nil && !isPg && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", err, cerr) // the context caused it: keep it matchable
	}
	se := &StorageError{Op: op, Key: key, Err: s.redact(err)}
	switch {
	case isPg && (!sent || !pgFatal(pgErr)):
		se.Retryable = pgRetryable(pgErr.Code)
	case isPg:
		// FATAL or PANIC ends the session; a statement in flight may have
		// committed just before, so a write's outcome is not known.
		se.Unknown = write
		se.Retryable = true
	default:
		se.Unknown = write && sent && !pgconn.SafeToRetry(err)
		se.Retryable = ctx.Err() == nil && netTransient(err)
	}
	return se
}

// pgFatal reports whether the server ended the session with the error.
func pgFatal(e *pgconn.PgError) bool {
	sev := e.SeverityUnlocalized
	if sev == "" {
		sev = e.Severity
	}
	return sev == "FATAL" || sev == "PANIC"
}

// pgRetryable reports whether a SQLSTATE names a condition that a retry is
// expected to clear: a serialization failure or deadlock (class 40), a lock
// or statement timeout, a server shutting down or starting up, too few
// resources (class 53) or a connection fault (class 08).
func pgRetryable(code string) bool {
	switch code {
	case "55P03", "57014", "57P01", "57P02", "57P03":
		return true
	}
	switch {
	case strings.HasPrefix(code, "40"), strings.HasPrefix(code, "53"), strings.HasPrefix(code, "08"):
		return true
	}
	return false
}

// netTransient reports whether err is a network fault: a refused, reset or
// timed-out connection, or one that the other side closed.
func netTransient(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, pgconn.ErrConnClosed)
}

// redact keeps the pool's password out of err's text. pgx leaves passwords
// out of its messages; this is a second line of defence, so that no message
// of this package can carry one even if a driver's message quoted the DSN.
func (s *PostgresStore) redact(err error) error {
	if s.secret == "" || !strings.Contains(err.Error(), s.secret) {
		return err
	}
	return &redactedError{err: err, secret: s.secret}
}

type redactedError struct {
	err    error
	secret string
}

func (e *redactedError) Error() string { return strings.ReplaceAll(e.err.Error(), e.secret, "xxxxx") }
func (e *redactedError) Unwrap() error { return e.err }

// withheldError wraps an error whose text may quote a password, such as
// pgx's error for a DSN it cannot parse: errors.As still reaches it, but its
// text is not printed.
type withheldError struct{ err error }

func (e withheldError) Error() string { return "pgx's message withheld: it may quote the password" }
func (e withheldError) Unwrap() error { return e.err }
