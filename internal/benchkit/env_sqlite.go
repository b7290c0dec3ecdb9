package benchkit

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"sync/atomic"

	_ "modernc.org/sqlite" // the driver the store uses

	"github.com/areev/runlease"
)

// SQLiteSynchronous is the synchronous pragma of the baseline's handle. It
// must be the store's setting (store_sqlite.go): FULL, every write durable
// when it returns. Whoever changes the store's durability settings changes
// this too, or the ratios compare different work.
var SQLiteSynchronous = "FULL"

// Baseline statements: the store's own (see store_sqlite.go).
const (
	sqlGet    = `SELECT value FROM runlease_meta WHERE key = ?`
	sqlInsert = `INSERT INTO runlease_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`
	sqlUpdate = `UPDATE runlease_meta SET value = ? WHERE key = ? AND value = ?`
	sqlDelete = `DELETE FROM runlease_meta WHERE key = ? AND value = ?`
	sqlScan   = `SELECT key, value FROM runlease_meta WHERE key >= ? AND key < ? ORDER BY key`
	sqlUpsert = `INSERT INTO runlease_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`
)

// OpenSQLite opens an Env on a fresh SQLite file in dir: the store
// (runlease.OpenSQLite, its calls counted) and a Raw with handles of its
// own on the same file, set up as the store's are: one writing connection
// with WAL, synchronous as [SQLiteSynchronous], busy_timeout and
// IMMEDIATE transactions, and four read-only reading connections. The store
// and the Raw never run at once, so they never wait for each other's locks.
func OpenSQLite(ctx context.Context, dir string) (*Env, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	path := filepath.Join(dir, "bench-"+hex.EncodeToString(b[:])+".db")
	store, err := runlease.OpenSQLite(path)
	if err != nil {
		return nil, err
	}
	counted := CountCalls(store)
	e := &Env{Kind: "sqlite", Store: counted, trips: counted.Load}
	e.onClose(store.Close)
	raw, err := newSQLiteRaw(ctx, path)
	if err != nil {
		e.Close()
		return nil, err
	}
	e.onClose(raw.close)
	e.Raw = raw
	return e, nil
}

type sqliteRaw struct {
	w, r                                   *sql.DB
	get, insert, update, del, scan, upsert *sql.Stmt
	trips                                  atomic.Int64
}

func newSQLiteRaw(ctx context.Context, path string) (*sqliteRaw, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	uri := "file:" + (&url.URL{Path: abs}).EscapedPath() + "?_pragma=busy_timeout(10000)"
	r := &sqliteRaw{}
	writer := fmt.Sprintf("%s&_pragma=journal_mode(WAL)&_pragma=synchronous(%s)&_txlock=immediate", uri, SQLiteSynchronous)
	if r.w, err = openDB(writer, 1); err != nil {
		return nil, err
	}
	if r.r, err = openDB(uri+"&_pragma=query_only(1)", 4); err != nil {
		r.w.Close()
		return nil, err
	}
	prep := func(db *sql.DB, q string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var st *sql.Stmt
		st, err = db.PrepareContext(ctx, q)
		return st
	}
	r.get, r.scan = prep(r.r, sqlGet), prep(r.r, sqlScan)
	r.insert, r.update = prep(r.w, sqlInsert), prep(r.w, sqlUpdate)
	r.del, r.upsert = prep(r.w, sqlDelete), prep(r.w, sqlUpsert)
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func openDB(dsn string, conns int) (*sql.DB, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}

func (r *sqliteRaw) close() error { return errors.Join(r.r.Close(), r.w.Close()) }

func (r *sqliteRaw) Trips() int64 { return r.trips.Load() }

func (r *sqliteRaw) Get(ctx context.Context, key string) (string, bool, error) {
	r.trips.Add(1)
	var v string
	err := r.get.QueryRowContext(ctx, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	return v, err == nil, err
}

func applied(res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (r *sqliteRaw) Insert(ctx context.Context, key, value string) (bool, error) {
	r.trips.Add(1)
	return applied(r.insert.ExecContext(ctx, key, value))
}

func (r *sqliteRaw) Update(ctx context.Context, key, old, value string) (bool, error) {
	r.trips.Add(1)
	return applied(r.update.ExecContext(ctx, value, key, old))
}

func (r *sqliteRaw) UpdateNotify(ctx context.Context, key, old, value string) (bool, error) {
	return r.Update(ctx, key, old, value)
}

func (r *sqliteRaw) Delete(ctx context.Context, key, old string) (bool, error) {
	r.trips.Add(1)
	return applied(r.del.ExecContext(ctx, key, old))
}

func (r *sqliteRaw) Scan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	r.trips.Add(1)
	end, _ := runlease.PrefixEnd(prefix)
	rows, err := r.scan.QueryContext(ctx, prefix, end)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []runlease.Row
	for rows.Next() {
		var row runlease.Row
		if err := rows.Scan(&row.Key, &row.Value); err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// FencedWrite is one IMMEDIATE transaction: the conditional update, then
// the upsert only if it applied.
func (r *sqliteRaw) FencedWrite(ctx context.Context, key, old, value, key2, value2 string) (ok bool, err error) {
	r.trips.Add(1)
	tx, err := r.w.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() {
		if !ok {
			_ = tx.Rollback()
		}
	}()
	if ok, err = applied(tx.StmtContext(ctx, r.update).ExecContext(ctx, value, key, old)); !ok || err != nil {
		return false, err
	}
	if _, err = tx.StmtContext(ctx, r.upsert).ExecContext(ctx, key2, value2); err != nil {
		return false, err
	}
	if err = tx.Commit(); err != nil {
		return false, err
	}
	return true, nil
}

func (r *sqliteRaw) Upsert(ctx context.Context, rows []runlease.Row) (err error) {
	r.trips.Add(1)
	tx, err := r.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	st := tx.StmtContext(ctx, r.upsert)
	for _, row := range rows {
		if _, err = st.ExecContext(ctx, row.Key, row.Value); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}
