package runlease_test

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// sqlRecorder records, for every write on the connections it wraps, the
// statements it runs (each Bind, named by the text its statement was
// parsed from, now or by an earlier Parse on the connection) that name one
// table: one entry per round trip of a call on the table.
// It is safe for concurrent use.
type sqlRecorder struct {
	table string // as sanitized, the way the store's statements name it

	mu    sync.Mutex
	trips [][]string
}

// pool returns a pool whose connections r records, closed when t ends.
// tune, when not nil, adjusts the pool's config first.
func (r *sqlRecorder) pool(t *testing.T, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &recordingConn{Conn: c, r: r}, nil
	}
	if tune != nil {
		tune(cfg)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// since returns the round trips recorded after the first n.
func (r *sqlRecorder) since(n int) [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.trips[n:]...)
}

func (r *sqlRecorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.trips)
}

// recordingConn splits what pgx writes into frontend messages. pgx writes
// from one goroutine per connection, so buf needs no lock.
type recordingConn struct {
	net.Conn
	r       *sqlRecorder
	started bool // past the untyped startup (or SSL, cancel) messages
	buf     []byte
	parsed  map[string]string // statement name → its text
}

// pgProtocol3 is the protocol version of the startup message, the last
// message without a type byte.
const pgProtocol3 = 3 << 16

func (c *recordingConn) Write(b []byte) (int, error) {
	c.buf = append(c.buf, b...)
	var stmts []string
	for {
		if !c.started {
			if len(c.buf) < 8 || len(c.buf) < int(binary.BigEndian.Uint32(c.buf)) {
				break
			}
			n := binary.BigEndian.Uint32(c.buf)
			c.started = binary.BigEndian.Uint32(c.buf[4:]) == pgProtocol3
			c.buf = c.buf[n:]
			continue
		}
		if len(c.buf) < 5 || len(c.buf) < 1+int(binary.BigEndian.Uint32(c.buf[1:])) {
			break
		}
		n := 1 + int(binary.BigEndian.Uint32(c.buf[1:]))
		switch c.buf[0] {
		case 'P': // Parse: the statement's name, then its text
			name, rest, _ := strings.Cut(string(c.buf[5:n]), "\x00")
			query, _, _ := strings.Cut(rest, "\x00")
			if c.parsed == nil {
				c.parsed = map[string]string{}
			}
			c.parsed[name] = query
		case 'B': // Bind: the portal's name, then the statement's, run once each
			_, rest, _ := strings.Cut(string(c.buf[5:n]), "\x00")
			name, _, _ := strings.Cut(rest, "\x00")
			if query := c.parsed[name]; strings.Contains(query, c.r.table) {
				stmts = append(stmts, query)
			}
		}
		c.buf = c.buf[n:]
	}
	if len(stmts) > 0 {
		c.r.mu.Lock()
		c.r.trips = append(c.r.trips, stmts)
		c.r.mu.Unlock()
	}
	return c.Conn.Write(b)
}

// stmtKind names a statement of a batch by what it is.
func stmtKind(sql string) string {
	switch {
	case strings.HasPrefix(sql, "WITH l AS (") && strings.Contains(sql, "unnest("):
		return "fenced-many"
	case strings.HasPrefix(sql, "WITH l AS ("):
		return "fenced"
	case strings.HasPrefix(sql, "UPDATE "):
		return "update"
	case strings.HasPrefix(sql, "INSERT INTO ") && strings.Contains(sql, "WHERE false"):
		return "hold"
	case strings.HasPrefix(sql, "WITH locked AS ("):
		return "apply"
	}
	return "other: " + sql
}

// kinds names the statements of each round trip.
func kinds(trips [][]string) [][]string {
	out := make([][]string, len(trips))
	for i, trip := range trips {
		for _, sql := range trip {
			out[i] = append(out[i], stmtKind(sql))
		}
	}
	return out
}

// recordedStore returns a store on a fresh table of a recording pool, and
// its recorder.
func recordedStore(t *testing.T, tune func(*pgxpool.Config)) (*runlease.PostgresStore, *sqlRecorder, *pgxpool.Pool) {
	t.Helper()
	table := pgtest.NewTable(t, pgtest.Pool(t))
	r := &sqlRecorder{table: pgtest.Ident(table)}
	pool := r.pool(t, tune)
	s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, r, pool
}

// wantRows checks that each key holds its value, or is absent for nil.
func wantRows(t *testing.T, s runlease.Store, want map[string]*string) {
	t.Helper()
	for k, v := range want {
		got, found, err := s.MetaGet(t.Context(), k)
		require.NoError(t, err)
		if v == nil {
			assert.False(t, found, "%q: want absent, holds %q", k, got)
			continue
		}
		if assert.True(t, found, "%q: want %q, absent", k, *v) {
			assert.True(t, got == *v, "%q: not byte for byte what was written (%d bytes, want %d)", k, len(got), len(*v))
		}
	}
}
