package runlease_test

// The storetest harnesses of the built-in stores: a second handle on the
// same storage, and faults injected for real, so that the conformance suite
// checks how each store labels the outcome of a failed write.
//
// SQLite. The second handle is OpenSQLiteReadOnly on the same file (the
// writer lock forbids a second writer). Faults come from a commit hook that
// every connection to a file registered in sqliteFaults gets: it turns the
// commit into a rollback (SQLITE_CONSTRAINT_COMMITHOOK, a fault before the
// write applies), or ends the call's context while the commit goes ahead
// (a fault after it applies, which the driver reports as the context's
// error when its watcher sees the context end in time).
//
// Postgres. The second handle is a store on the same table through a pool
// of its own. Faults come from the faulty store's pool: before a write
// applies, its connections are dropped and the next dial is refused, so
// nothing is sent; after it applies, the connection that carries the write
// reads the server's whole reply, up to ReadyForQuery (the commit is done
// by then), drops it and fails with a reset.

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"modernc.org/sqlite"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/storetest"
)

// sqliteHarness is the harness of the embedded store on a file.
func sqliteHarness() storetest.Harness {
	return storetest.Harness{
		New: func(t *testing.T) runlease.Store { return openSQLiteFile(t, filepath.Join(t.TempDir(), "store.db")) },
		Reopen: func(t *testing.T, s runlease.Store) runlease.Store {
			r, err := runlease.OpenSQLiteReadOnly(s.(*runlease.SQLiteStore).Path())
			require.NoError(t, err)
			t.Cleanup(func() { r.Close() })
			return r
		},
		ReopenReadOnly: true,
		Faulty:         sqliteFaulty,
	}
}

func openSQLiteFile(t *testing.T, path string) *runlease.SQLiteStore {
	t.Helper()
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// sqliteFaults maps the file name of each faulty store to its armed fault.
var sqliteFaults sync.Map // string → *armedFault

// armedFault is the fault armed for a store's next write.
type armedFault struct {
	mu sync.Mutex
	f  storetest.Fault
}

func (a *armedFault) inject(f storetest.Fault) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.f = f
}

// take returns the armed fault and disarms it.
func (a *armedFault) take() storetest.Fault {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.f
	a.f = storetest.Fault{}
	return f
}

func init() {
	sqlite.RegisterConnectionHook(func(conn sqlite.ExecQuerierContext, dsn string) error {
		var armed *armedFault
		sqliteFaults.Range(func(name, a any) bool {
			if strings.Contains(dsn, name.(string)) {
				armed = a.(*armedFault)
			}
			return armed == nil
		})
		if armed == nil {
			return nil
		}
		hooks, ok := conn.(sqlite.HookRegisterer)
		if !ok {
			return errors.New("the SQLite connection takes no commit hook")
		}
		hooks.RegisterCommitHook(func() int32 { return sqliteCommitFault(armed.take()) })
		return nil
	})
}

// sqliteCommitFault strikes f inside a commit. A non-zero result turns the
// commit into a rollback.
func sqliteCommitFault(f storetest.Fault) int32 {
	switch f.Kind {
	case storetest.FaultBeforeApply:
		return 1
	case storetest.FaultAfterApply:
		f.Cancel()
		// The driver reports the context's error only if its watcher
		// goroutine, woken by the cancel, marks the call before it returns:
		// give it the chance to run. When it does not, the write succeeds,
		// which the suite accepts, and tries again.
		for range 10 {
			runtime.Gosched()
		}
	}
	return 0
}

// sqliteFaulty returns an embedded store on a file of its own, whose
// connections take the commit hook.
func sqliteFaulty(t *testing.T) storetest.FaultyStore {
	name := pgtest.UniqueName("faulty-") + ".db"
	armed := &armedFault{}
	sqliteFaults.Store(name, armed)
	t.Cleanup(func() { sqliteFaults.Delete(name) })
	return storetest.FaultyStore{Store: openSQLiteFile(t, filepath.Join(t.TempDir(), name)), Inject: armed.inject}
}

// pgHarness is the harness of the shared store, on pool's server.
func pgHarness(t *testing.T, pool *pgxpool.Pool) storetest.Harness {
	second := pgPool(t, 4, nil)
	return storetest.Harness{
		New: func(t *testing.T) runlease.Store { return pgStore(t, pool) },
		Reopen: func(t *testing.T, s runlease.Store) runlease.Store {
			r, err := runlease.NewPostgres(t.Context(), second,
				runlease.WithTable(s.(*runlease.PostgresStore).Table()), runlease.WithCreateTable(false))
			require.NoError(t, err)
			t.Cleanup(func() { r.Close() })
			return r
		},
		Faulty: func(t *testing.T) storetest.FaultyStore { return pgFaulty(t, pool) },
	}
}

// pgPool returns a pool of at most conns connections on the test server,
// changed by edit if not nil, and closes it when t ends.
func pgPool(t *testing.T, conns int32, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = conns
	if edit != nil {
		edit(cfg)
	}
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// pgFaulty returns a shared store on a table of its own, whose pool's
// connections suffer the faults armed; admin drops the table at the end.
func pgFaulty(t *testing.T, admin *pgxpool.Pool) storetest.FaultyStore {
	f := &pgFaults{}
	f.pool = pgPool(t, 2, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DialFunc = f.dial
		// A ping on acquire would be the first request to meet the fault.
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
			c.PgConn().Conn().(*faultConn).ready.Store(true)
			return nil
		}
	})
	s, err := runlease.NewPostgres(t.Context(), f.pool, runlease.WithTable(pgtest.NewTable(t, admin)))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return storetest.FaultyStore{Store: s, Inject: f.inject}
}

// pgFaults arms the faults of one pool.
type pgFaults struct {
	pool       *pgxpool.Pool
	refuseDial atomic.Bool // the next dial fails
	dropReply  atomic.Bool // the next request's reply is read, then the connection dropped
}

var errInjectedDial = errors.New("injected fault: connection refused")

func (f *pgFaults) inject(fault storetest.Fault) {
	f.refuseDial.Store(fault.Kind == storetest.FaultBeforeApply)
	f.dropReply.Store(fault.Kind == storetest.FaultAfterApply)
	if fault.Kind == storetest.FaultBeforeApply {
		f.pool.Reset() // so that the next call must dial
	}
}

func (f *pgFaults) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if f.refuseDial.CompareAndSwap(true, false) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errInjectedDial}
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: c, f: f}, nil
}

// faultConn is a connection of a faulty pool. pgx may read from another
// goroutine while it writes, hence the atomics.
type faultConn struct {
	net.Conn
	f        *pgFaults
	ready    atomic.Bool // the connection is set up: requests from now on are calls
	dropping atomic.Bool // the reply to the request sent is to be dropped
}

func (c *faultConn) Write(b []byte) (int, error) {
	if c.ready.Load() && c.f.dropReply.CompareAndSwap(true, false) {
		c.dropping.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Read(b []byte) (int, error) {
	if !c.dropping.Load() {
		return c.Conn.Read(b)
	}
	if err := readUntilReady(c.Conn); err != nil {
		return 0, err
	}
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Conn.Close()
	return 0, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
}

// readUntilReady reads backend messages from r until a ReadyForQuery
// ('Z'), which the server sends once the request's transaction has ended.
func readUntilReady(r io.Reader) error {
	var header [5]byte // type, then length (which counts itself)
	for {
		if _, err := io.ReadFull(r, header[:]); err != nil {
			return err
		}
		body := make([]byte, binary.BigEndian.Uint32(header[1:])-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return err
		}
		if header[0] == 'Z' {
			return nil
		}
	}
}
