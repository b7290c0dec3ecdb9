package benchkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease"
)

// PoolConns is the size of every pool a Postgres Env opens: room for 16
// goroutines, a listener, and the store's clock sampler, so that no
// measured call waits for a connection. (pgxpool's default, the greater of
// 4 and the number of CPUs, would make 16 goroutines queue for 4.)
const PoolConns = 32

// Baseline statements: the store's own (see store_postgres.go), sent with
// the same query mode, QueryExecModeExec, one round trip each. %s is the
// sanitized table name.
const (
	pgGet    = `SELECT value FROM %s WHERE key = $1`
	pgInsert = `INSERT INTO %s (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`
	pgUpdate = `UPDATE %s SET value = $3 WHERE key = $1 AND value = $2`
	pgDelete = `DELETE FROM %s WHERE key = $1 AND value = $2`
	// pgUpdateNotify is the store's notifying write; $4 is the channel.
	pgUpdateNotify = `UPDATE %s SET value = $3 WHERE key = $1 AND value = $2 RETURNING pg_notify($4, $1)`
	pgScan         = `SELECT key, value FROM %s WHERE key >= $1 AND key < $2 ORDER BY key`
	// pgFenced is a fenced write in one statement: the upsert happens only
	// if the conditional update did.
	pgFenced = `WITH lease AS (UPDATE %[1]s SET value = $3 WHERE key = $1 AND value = $2 RETURNING 1)
INSERT INTO %[1]s (key, value) SELECT $4, $5 FROM lease
ON CONFLICT (key) DO UPDATE SET value = excluded.value`
	pgUpsert = `INSERT INTO %s (key, value) SELECT * FROM unnest($1::text[], $2::text[])
ON CONFLICT (key) DO UPDATE SET value = excluded.value`
)

// OpenPostgres opens an Env on a fresh table of the server at dsn, dropped
// by Close: a pool of PoolConns connections whose round trips are counted,
// a store on it (runlease.NewPostgres), and a Raw on the same pool.
func OpenPostgres(ctx context.Context, dsn string) (*Env, error) {
	if dsn == "" {
		return nil, errors.New("benchkit: no Postgres DSN")
	}
	trips := &TripCounter{}
	pool, err := openPool(ctx, dsn, trips)
	if err != nil {
		return nil, err
	}
	e := &Env{Kind: "postgres", trips: trips.Load}
	e.onClose(func() error { pool.Close(); return nil })
	var b [8]byte
	_, _ = rand.Read(b[:])
	table := "runlease_bench_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{table}.Sanitize()
	store, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(table))
	if err != nil {
		e.Close()
		return nil, err
	}
	e.onClose(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+ident)
		return err
	})
	e.onClose(store.Close)
	e.Store = store
	e.Raw = newPgRaw(pool, ident, trips)
	e.warm = func(ctx context.Context, n int) error { return warmPool(ctx, pool, n) }
	e.pg = &pgEnv{dsn: dsn, table: table, ident: ident, trips: trips, pool: pool}
	return e, nil
}

// pgEnv is what a Postgres Env keeps to open more nodes on its table.
type pgEnv struct {
	dsn, table, ident string
	trips             *TripCounter
	pool              *pgxpool.Pool
}

// peer opens a second node on the table: a pool of its own, counted by
// the same counter, and a store on it, both closed by closeFn.
func (p *pgEnv) peer(ctx context.Context) (s *runlease.PostgresStore, pool *pgxpool.Pool, closeFn func() error, err error) {
	pool, err = openPool(ctx, p.dsn, p.trips)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err = runlease.NewPostgres(ctx, pool, runlease.WithTable(p.table))
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return s, pool, func() error { s.Close(); pool.Close(); return nil }, nil
}

func openPool(ctx context.Context, dsn string, trips *TripCounter) (*pgxpool.Pool, error) {
	return OpenCountedPool(ctx, dsn, PoolConns, trips)
}

// OpenCountedPool opens a pool of at most maxConns connections (pgxpool's
// default when 0) on dsn, whose round trips trips counts, and checks that
// the server answers.
func OpenCountedPool(ctx context.Context, dsn string, maxConns int32, trips *TripCounter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("benchkit: the Postgres DSN does not parse")
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.DialFunc = trips.Dial(cfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// warmPool holds n connections at once, so that the pool has them open.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range min(n, PoolConns-2) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

type pgRaw struct {
	pool  *pgxpool.Pool
	trips *TripCounter
	q     struct{ get, insert, update, notify, del, scan, fenced, upsert string }
}

func newPgRaw(pool *pgxpool.Pool, table string, trips *TripCounter) *pgRaw {
	r := &pgRaw{pool: pool, trips: trips}
	r.q.get = fmt.Sprintf(pgGet, table)
	r.q.insert = fmt.Sprintf(pgInsert, table)
	r.q.update = fmt.Sprintf(pgUpdate, table)
	r.q.notify = fmt.Sprintf(pgUpdateNotify, table)
	r.q.del = fmt.Sprintf(pgDelete, table)
	r.q.scan = fmt.Sprintf(pgScan, table)
	r.q.fenced = fmt.Sprintf(pgFenced, table)
	r.q.upsert = fmt.Sprintf(pgUpsert, table)
	return r
}

// PostgresBaselinePrepared makes the bare statements of the Postgres
// baseline run as prepared statements, cached per connection as pgx does by
// default (QueryExecModeCacheStatement), instead of parsed afresh at every
// call (QueryExecModeExec). The store prepares its statements; this is the
// baseline of a caller who does too.
var PostgresBaselinePrepared bool

// pgMode is how the baseline sends its statements.
func pgMode() pgx.QueryExecMode {
	if PostgresBaselinePrepared {
		return pgx.QueryExecModeCacheStatement
	}
	return pgx.QueryExecModeExec
}

func (r *pgRaw) Trips() int64 { return r.trips.Load() }

func (r *pgRaw) Get(ctx context.Context, key string) (string, bool, error) {
	var v string
	err := r.pool.QueryRow(ctx, r.q.get, pgMode(), key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return v, err == nil, err
}

func (r *pgRaw) exec(ctx context.Context, sql string, args ...any) (bool, error) {
	tag, err := r.pool.Exec(ctx, sql, append([]any{pgMode()}, args...)...)
	return tag.RowsAffected() == 1, err
}

func (r *pgRaw) Insert(ctx context.Context, key, value string) (bool, error) {
	return r.exec(ctx, r.q.insert, key, value)
}

func (r *pgRaw) Update(ctx context.Context, key, old, value string) (bool, error) {
	return r.exec(ctx, r.q.update, key, old, value)
}

// notifyChannel is the channel of the baseline's notifications, which no
// one listens to: as for a release no one waits for.
const notifyChannel = "runlease_bench_notify"

func (r *pgRaw) UpdateNotify(ctx context.Context, key, old, value string) (bool, error) {
	return r.exec(ctx, r.q.notify, key, old, value, notifyChannel)
}

func (r *pgRaw) Delete(ctx context.Context, key, old string) (bool, error) {
	return r.exec(ctx, r.q.del, key, old)
}

func (r *pgRaw) FencedWrite(ctx context.Context, key, old, value, key2, value2 string) (bool, error) {
	return r.exec(ctx, r.q.fenced, key, old, value, key2, value2)
}

func (r *pgRaw) Scan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	end, _ := runlease.PrefixEnd(prefix)
	rows, err := r.pool.Query(ctx, r.q.scan, pgMode(), prefix, end)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[runlease.Row])
}

func (r *pgRaw) Upsert(ctx context.Context, rows []runlease.Row) error {
	keys, values := make([]string, len(rows)), make([]string, len(rows))
	for i, row := range rows {
		keys[i], values[i] = row.Key, row.Value
	}
	_, err := r.pool.Exec(ctx, r.q.upsert, pgMode(), keys, values)
	return err
}

// DSN returns the Postgres server's DSN, and CountConn wraps a connection
// to it so that its round trips count with the Env's: together they let a
// baseline written against another driver (another lock library, say)
// connect to the same server and be counted alike. A Postgres Env only.
func (e *Env) DSN() string {
	if e.pg == nil {
		return ""
	}
	return e.pg.dsn
}

// CountConn returns conn with its round trips counted by e (see DSN).
func (e *Env) CountConn(conn net.Conn) net.Conn {
	if e.pg == nil {
		return conn
	}
	return e.pg.trips.Wrap(conn)
}

// OnClose registers fn to run when e is closed, before what e opened
// itself is closed.
func (e *Env) OnClose(fn func() error) { e.onClose(fn) }
