package runlease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/areev/runlease/internal/wakeup"
)

// The embedded store's schema and statements. WITHOUT ROWID keeps each row in
// the primary-key b-tree, and TEXT compares with the BINARY collation, which
// is byte order: the order MetaScan promises.
const (
	sqliteSchema = `CREATE TABLE IF NOT EXISTS runlease_meta (
	key   TEXT PRIMARY KEY NOT NULL,
	value TEXT NOT NULL
) WITHOUT ROWID`

	sqliteGet       = `SELECT value FROM runlease_meta WHERE key = ?`
	sqliteInsert    = `INSERT INTO runlease_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`
	sqliteUpdate    = `UPDATE runlease_meta SET value = ? WHERE key = ? AND value = ?`
	sqliteDelete    = `DELETE FROM runlease_meta WHERE key = ? AND value = ?`
	sqliteDeleteAny = `DELETE FROM runlease_meta WHERE key = ?`
	sqliteUpsert    = `INSERT INTO runlease_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`
	sqliteScan      = `SELECT key, value FROM runlease_meta WHERE key >= ? AND key < ? ORDER BY key`
	sqliteScanOpen  = `SELECT key, value FROM runlease_meta WHERE key >= ? ORDER BY key`
	sqliteBusyMilli = 10000

	sqliteReadConns     = 4 // reading connections of a store opened to write
	sqliteReadOnlyConns = 2 // reading connections of a read-only store
)

// errLocked is what lockFile returns when another opener holds the lock.
var errLocked = errors.New("locked")

// SQLiteStore is the embedded [Store]: one SQLite file (in WAL mode) that one
// process writes. OpenSQLite enforces that with a lock, so two drivers can
// never share an embedded store by accident; nodes that must share leases use
// a Postgres store.
//
// All writes go through one connection, so writers in this process queue in
// Go rather than meet SQLITE_BUSY; reads use a small pool of their own and do
// not wait for writes. A read waits for a free reading connection in Go,
// where its context can end the wait, and then runs to its end without a
// watcher on its context (one would cost more than the read: a goroutine
// and a progress handler per statement): it checks the context before it
// starts and between the rows of a scan, but does not interrupt SQLite
// within one step, nor in a wait for another process's recovery of the
// file (at most the busy timeout, 10 s). Every write is durable when it returns
// (synchronous=FULL). Writes that arrive from concurrent goroutines while a
// commit is in flight share the next transaction and its one sync to disk
// (group commit): each is still checked and applied in its order of arrival,
// under a savepoint of its own when it sends more than one statement, and
// each returns only once the sync that covers it is done. A failed commit
// fails every write it carried. A SQLiteStore is safe for concurrent use.
type SQLiteStore struct {
	path   string
	lock   *os.File // the writer lock on path+".lock"; nil for :memory: and read-only
	dbLock *dbLock  // the writer lock on the database file; nil as lock is
	w, r   *sql.DB  // r == w for :memory:, whose data lives in one connection
	stmts  sqliteStmts
	subs   wakeup.Set
	closed atomic.Bool // set once Close began; read without the gate's lock
	gate   callGate
	// readers holds a token for each read in flight, one per reading
	// connection, so that a read never waits inside database/sql's pool,
	// where its context would need a watcher. nil when r == w (:memory:):
	// reads then share the writing connection and run on their context.
	readers chan struct{}
	group   groupQueue   // writes waiting for the next group commit
	hooks   *sqliteHooks // nil but in tests

	// oneTxPerCall, set only by tests and benchmarks before the store is
	// used, commits every write in a transaction of its own, as a baseline.
	oneTxPerCall bool
}

type sqliteStmts struct {
	get, insert, update, del, scan, scanOpen *sql.Stmt
	ranges                                   sqliteRangeStmts // store_sqlite_range.go
	// A batch's reads and writes, on the writing pool: prepared once, as
	// the embedded driver would otherwise compile them at every use.
	getW, deleteAny, upsert *sql.Stmt
	// A group commit's savepoints, prepared once rather than parsed for
	// every write of every group.
	savepoint, release, undo *sql.Stmt
}

// OpenSQLite opens (creating if needed) the embedded store at path, or a
// private in-memory store when path is ":memory:".
//
// The file is locked for this store until Close: a second OpenSQLite of the
// same file, from this process or another, fails at once with a
// [*StoreLockedError] (matching [ErrStoreLocked]). The lock is an flock on
// a side file, path+".lock", and another on the database file itself, so
// that deleting the side file lets no second writer in; the operating
// system drops both when the process dies, so a crashed writer never leaves
// the store locked.
//
// A database file with more than one hard link is refused with
// [ErrInvalidArgument]: SQLite keeps the write-ahead log beside the name it
// opens, so an opener by another name would miss commits. A symbolic link
// is resolved and fine.
func OpenSQLite(path string) (*SQLiteStore, error) {
	if path == "" {
		return nil, invalidArg("path", "empty")
	}
	if path == ":memory:" {
		db, err := openSQLiteDB("file::memory:", false, 1)
		if err != nil {
			return nil, err
		}
		return newSQLiteStore(path, db, db, 0)
	}
	abs, err := canonicalPath(path)
	if err != nil {
		return nil, &StorageError{Op: "OpenSQLite", Key: path, Err: err}
	}
	lock, err := lockFile(abs + ".lock")
	if err != nil {
		return nil, openLockError(path, err)
	}
	dbl, err := lockDatabase(abs)
	if err != nil {
		unlockFile(lock)
		return nil, openLockError(path, err)
	}
	unlock := func() {
		dbl.unlock()
		unlockFile(lock)
	}
	uri := "file:" + (&url.URL{Path: abs}).EscapedPath()
	w, err := openSQLiteDB(uri, false, 1)
	if err != nil {
		unlock()
		return nil, err
	}
	r, err := openSQLiteDB(uri, true, sqliteReadConns)
	if err != nil {
		w.Close()
		unlock()
		return nil, err
	}
	s, err := newSQLiteStore(path, w, r, sqliteReadConns)
	if err != nil {
		unlock()
		return nil, err
	}
	s.lock, s.dbLock = lock, dbl
	return s, nil
}

// OpenSQLiteReadOnly opens an existing embedded store for reading only,
// without taking the writer lock, so that status tools can look at a store
// that a driver has open. Reads see every write committed before they start.
// Writes fail with [ErrInvalidArgument] and change nothing. A missing file is
// a [*StorageError]: a read-only open never creates a store. A file with
// more than one hard link is refused with [ErrInvalidArgument], as by
// [OpenSQLite]: read by another name than its writer's, it would show rows
// older than the writer's commits.
func OpenSQLiteReadOnly(path string) (*SQLiteStore, error) {
	if path == "" || path == ":memory:" {
		return nil, invalidArg("path", "%q cannot be opened read-only", path)
	}
	abs, err := canonicalPath(path)
	var fi os.FileInfo
	if err == nil {
		fi, err = os.Stat(abs)
	}
	if err != nil {
		return nil, &StorageError{Op: "OpenSQLiteReadOnly", Key: path, Err: err}
	}
	if err := checkLinks(fi); err != nil {
		return nil, invalidArg("path", "%q: %v", path, err)
	}
	r, err := openSQLiteDB("file:"+(&url.URL{Path: abs}).EscapedPath(), true, sqliteReadOnlyConns)
	if err != nil {
		return nil, err
	}
	return newSQLiteStore(path, nil, r, sqliteReadOnlyConns)
}

// openSQLiteDB opens a handle on uri with at most conns connections. Every
// connection waits for locks (busy_timeout) rather than failing, although
// with one writing connection per file the only waits left are the rare ones
// of checkpoints and recovery.
func openSQLiteDB(uri string, readOnly bool, conns int) (*sql.DB, error) {
	dsn := fmt.Sprintf("%s?_pragma=busy_timeout(%d)", uri, sqliteBusyMilli)
	if readOnly {
		dsn += "&_pragma=query_only(1)"
	} else {
		dsn += "&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, &StorageError{Op: "OpenSQLite", Err: err}
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	return db, nil
}

// newSQLiteStore makes the store on w and r, whose pool holds readConns
// connections (0 when r == w), or closes them on failure. The caller sets
// the locks, and releases them on failure.
func newSQLiteStore(path string, w, r *sql.DB, readConns int) (*SQLiteStore, error) {
	s := &SQLiteStore{path: path, w: w, r: r}
	if readConns > 0 {
		s.readers = make(chan struct{}, readConns)
	}
	ctx := context.Background()
	if w != nil {
		if _, err := w.ExecContext(ctx, sqliteSchema); err != nil {
			return nil, s.failOpen(err)
		}
	}
	var err error
	prepare := func(db *sql.DB, q string) *sql.Stmt {
		if err != nil || db == nil {
			return nil
		}
		var st *sql.Stmt
		st, err = db.PrepareContext(ctx, q)
		return st
	}
	s.stmts = sqliteStmts{
		get:      prepare(r, sqliteGet),
		insert:   prepare(w, sqliteInsert),
		update:   prepare(w, sqliteUpdate),
		del:      prepare(w, sqliteDelete),
		scan:     prepare(r, sqliteScan),
		scanOpen: prepare(r, sqliteScanOpen),
		ranges:   prepareRanges(prepare, r),

		getW:      prepare(w, sqliteGet),
		deleteAny: prepare(w, sqliteDeleteAny),
		upsert:    prepare(w, sqliteUpsert),

		savepoint: prepare(w, sqliteSavepoint),
		release:   prepare(w, sqliteRelease),
		undo:      prepare(w, sqliteUndo),
	}
	if err != nil {
		return nil, s.failOpen(err)
	}
	return s, nil
}

// failOpen closes a store whose opening failed with err, and returns err
// classified. It classifies first: once closed, the store would report an
// error that is not SQLite's as ErrStoreClosed.
func (s *SQLiteStore) failOpen(err error) error {
	f := s.fault("OpenSQLite", s.path, err)
	s.Close()
	return f
}

// Path returns the path the store was opened with.
func (s *SQLiteStore) Path() string { return s.path }

// MetaGet implements [Store].
func (s *SQLiteStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if err := s.enter("MetaGet"); err != nil {
		return "", false, err
	}
	defer s.exit("MetaGet")
	if err := s.check(key); err != nil {
		return "", false, err
	}
	rctx, err := s.startRead(ctx, "MetaGet", key)
	if err != nil {
		return "", false, err
	}
	defer s.endRead()
	var v string
	err = s.stmts.get.QueryRowContext(rctx, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, s.fault("MetaGet", key, err)
	}
	return v, true, nil
}

// MetaCAS implements [Store]. Writes from concurrent goroutines share
// transactions and syncs to disk (see [SQLiteStore]).
func (s *SQLiteStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := s.enter("MetaCAS"); err != nil {
		return false, err
	}
	defer s.exit("MetaCAS")
	if err := s.checkWrite(key); err != nil {
		return false, err
	}
	if err := CheckValue(value); err != nil {
		return false, err
	}
	if err := notStarted(ctx, "MetaCAS", key); err != nil {
		return false, err
	}
	c := &groupCall{op: "MetaCAS", key: key}
	c.alone = func(ctx context.Context, c *groupCall) error {
		var res sql.Result
		var err error
		if expected == nil {
			res, err = s.stmts.insert.ExecContext(ctx, key, value)
		} else {
			res, err = s.stmts.update.ExecContext(ctx, value, key, *expected)
		}
		c.res.ok, err = s.applied("MetaCAS", key, res, err)
		return err
	}
	c.inTx = func(t *sqliteTx, c *groupCall) error {
		var res sql.Result
		var err error
		if expected == nil {
			res, err = t.stmt(&t.insert, s.stmts.insert).Exec(key, value)
		} else {
			res, err = t.stmt(&t.update, s.stmts.update).Exec(value, key, *expected)
		}
		c.res.ok, err = rowChanged(res, err)
		c.res.wrote = c.res.ok
		return err
	}
	res, err := s.write(ctx, c)
	return res.ok, err
}

// MetaDelete implements [Store]. Writes from concurrent goroutines share
// transactions and syncs to disk (see [SQLiteStore]).
func (s *SQLiteStore) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if err := s.enter("MetaDelete"); err != nil {
		return false, err
	}
	defer s.exit("MetaDelete")
	if err := s.checkWrite(key); err != nil {
		return false, err
	}
	if err := notStarted(ctx, "MetaDelete", key); err != nil {
		return false, err
	}
	c := &groupCall{op: "MetaDelete", key: key}
	c.alone = func(ctx context.Context, c *groupCall) error {
		res, err := s.stmts.del.ExecContext(ctx, key, expected)
		c.res.ok, err = s.applied("MetaDelete", key, res, err)
		return err
	}
	c.inTx = func(t *sqliteTx, c *groupCall) error {
		var err error
		c.res.ok, err = rowChanged(t.stmt(&t.del, s.stmts.del).Exec(key, expected))
		c.res.wrote = c.res.ok
		return err
	}
	res, err := s.write(ctx, c)
	return res.ok, err
}

// rowChanged reports whether the statement that returned res changed a row.
func rowChanged(res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// MetaScan implements [Store].
func (s *SQLiteStore) MetaScan(ctx context.Context, prefix string) ([]Row, error) {
	if err := s.enter("MetaScan"); err != nil {
		return nil, err
	}
	defer s.exit("MetaScan")
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	rctx, err := s.startRead(ctx, "MetaScan", prefix)
	if err != nil {
		return nil, err
	}
	defer s.endRead()
	var rows *sql.Rows
	if end, ok := PrefixEnd(prefix); ok {
		rows, err = s.stmts.scan.QueryContext(rctx, prefix, end)
	} else {
		rows, err = s.stmts.scanOpen.QueryContext(rctx, prefix)
	}
	if err != nil {
		return nil, s.fault("MetaScan", prefix, err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		if s.hooks != nil && s.hooks.scanned != nil {
			s.hooks.scanned(len(out) + 1)
		}
		// SQLite does not watch ctx (see startRead): a long scan ends
		// here, between rows, once it has ended.
		if err := ctx.Err(); err != nil {
			return nil, &StorageError{Op: "MetaScan", Key: prefix, Err: err}
		}
		if out == nil {
			out = make([]Row, 0, 8)
		}
		var r Row
		if err := rows.Scan(&r.Key, &r.Value); err != nil {
			return nil, s.fault("MetaScan", prefix, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fault("MetaScan", prefix, err)
	}
	return out, nil
}

// MetaScanMany implements [MultiScanner]: one scan after another, each as
// MetaScan does it; in process, a scan costs no round trip to save.
func (s *SQLiteStore) MetaScanMany(ctx context.Context, prefixes []string) ([][]Row, error) {
	if err := CheckPrefixes(prefixes); err != nil {
		return nil, err
	}
	return scanEach(ctx, s, prefixes)
}

// startRead admits a read once a reading connection is free, and returns
// the context to run its statement on; the caller calls endRead when its
// rows are closed. A read that has started is not interrupted: its
// statements run on a context that never ends, since database/sql and the
// driver would each start a goroutine per statement to watch one that can.
// What ctx still bounds is the wait for a connection, which is the only
// wait of a read in this process; the caller checks it between rows.
func (s *SQLiteStore) startRead(ctx context.Context, op, key string) (context.Context, error) {
	if s.readers == nil {
		return ctx, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, &StorageError{Op: op, Key: key, Err: err}
	}
	// A free connection is taken without asking ctx for its Done channel,
	// which a context makes on the first call.
	select {
	case s.readers <- struct{}{}:
		return context.Background(), nil
	default:
	}
	if s.hooks != nil && s.hooks.waiting != nil {
		s.hooks.waiting(op)
	}
	select {
	case s.readers <- struct{}{}:
		return context.Background(), nil
	case <-ctx.Done():
		return nil, &StorageError{Op: op, Key: key, Err: ctx.Err()}
	}
}

// endRead ends a read that startRead admitted.
func (s *SQLiteStore) endRead() {
	if s.readers != nil {
		<-s.readers
	}
}

// check validates the key of a call that enter admitted.
func (s *SQLiteStore) check(key string) error { return CheckKey(key) }

// checkWrite is check for a write.
func (s *SQLiteStore) checkWrite(key string) error {
	if s.w == nil {
		return invalidArg("store", "%q was opened read-only", s.path)
	}
	return s.check(key)
}

func (s *SQLiteStore) applied(op, key string, res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, s.commitFault(op, key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, s.fault(op, key, err)
	}
	return n == 1, nil
}

// notStarted refuses a write whose context has already ended, before
// anything is sent: its outcome is known (nothing applied).
func notStarted(ctx context.Context, op, key string) error {
	if err := ctx.Err(); err != nil {
		return &StorageError{Op: op, Key: key, Err: err}
	}
	return nil
}

// commitFault classifies the error of a call that may have committed: an
// autocommit write, or a transaction's Commit. When its context ended during
// the call, the driver reports the context's error even if the commit
// completed, so the outcome is unknown.
func (s *SQLiteStore) commitFault(op, key string, err error) error {
	f := s.fault(op, key, err)
	var se *StorageError
	if errors.As(f, &se) && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		se.Unknown = true
	}
	return f
}

// txFault classifies the error of a statement inside a transaction, or of
// its Commit. When the call's context ends, database/sql rolls the
// transaction back on its own and refuses what follows, before it reaches
// SQLite, with errors of its own ("transaction has already been committed
// or rolled back", "statement is closed") instead of the context's error.
// The caller is told of the context, which is what ended the call, and
// that nothing was applied: a refused Commit did not commit.
func (s *SQLiteStore) txFault(ctx context.Context, op, key string, err error) error {
	var e *sqlite.Error
	if cerr := ctx.Err(); cerr != nil && !errors.As(err, &e) && !errors.Is(err, cerr) {
		return &StorageError{Op: op, Key: key, Err: fmt.Errorf("%w (%w)", cerr, err)}
	}
	return s.fault(op, key, err)
}

// fault classifies a SQLite error. A statement that fails in autocommit mode
// is rolled back, so its outcome is known (nothing was applied) except for
// I/O errors, after which the file's state is not certain.
func (s *SQLiteStore) fault(op, key string, err error) error {
	var e *sqlite.Error
	isSQLite := errors.As(err, &e)
	// A call that overlaps Close finds the handle or its statements closed
	// ("sql: database is closed", "sql: statement is closed", ErrConnDone):
	// database/sql refused it before it reached SQLite, so nothing was
	// applied and the caller is told the store is closed, not that it failed.
	if s.closed.Load() && !isSQLite && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return ErrStoreClosed
	}
	se := &StorageError{Op: op, Key: key, Err: err}
	if isSQLite {
		switch e.Code() & 0xff {
		case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_FULL:
			se.Unknown = true
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			se.Retryable = true
		}
	}
	return se
}
