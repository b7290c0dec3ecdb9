package runlease

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

// TestPostgresClockFollowsTheMonotonicClock steps a node's wall clock
// without stepping its monotonic clock, as NTP or a resumed VM does, and
// proves that the store's estimate of the server's time does not move, nor
// after the next sample of the server's clock, taken with the stepped wall
// clock.
func TestPostgresClockFollowsTheMonotonicClock(t *testing.T) {
	t.Parallel()
	var step atomic.Int64
	wall := func() time.Time { return time.Now().Round(0).Add(time.Duration(step.Load())) } // no monotonic reading
	s, err := NewPostgres(t.Context(), pgtest.Pool(t), WithTable(pgtest.NewTable(t, pgtest.Pool(t))),
		WithLocalClock(wall))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })

	for _, jump := range []time.Duration{-time.Hour, time.Hour, -24 * time.Hour} {
		before, _ := s.ClockNow()
		step.Add(int64(jump))
		after, u := s.ClockNow()
		assert.Less(t, after.Sub(before).Abs(), time.Minute, "a wall-clock step of %v moved the estimate", jump)
		assertServerTime(t, s, after, u)

		require.NoError(t, s.measure(t.Context()))
		remeasured, u := s.ClockNow()
		assert.Less(t, remeasured.Sub(before).Abs(), time.Minute, "after a step of %v and a new sample", jump)
		assertServerTime(t, s, remeasured, u)
	}
}

// assertServerTime checks est against a fresh read of the server's clock.
// The read follows the estimate, so the server may be ahead of it by the
// read's own duration, which is bounded loosely: the check is of steps of an
// hour, not of latency.
func assertServerTime(t *testing.T, s *PostgresStore, est time.Time, u time.Duration) {
	t.Helper()
	var micros int64
	require.NoError(t, s.pool.QueryRow(t.Context(), pgNowMicros).Scan(&micros))
	server := time.UnixMicro(micros)
	assert.False(t, est.After(server.Add(u)), "the estimate %v is ahead of the server's later %v", est, server)
	assert.Less(t, server.Sub(est), time.Minute, "the estimate %v lags the server's %v", est, server)
}

// TestPostgresBatchPinStaysInItsTransaction: the sequential-scan pin of
// a batch must not outlive the call on the caller's connection: after every
// batch (applied, refused, failed), SHOW enable_seqscan on the pool's one
// connection says on, as it did before.
func TestPostgresBatchPinStaysInItsTransaction(t *testing.T) {
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := pgtest.NewTable(t, pool)
	s, err := NewPostgres(ctx, pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	show := func(step string) {
		t.Helper()
		var v string
		require.NoError(t, pool.QueryRow(ctx, "SHOW enable_seqscan", pgx.QueryExecModeSimpleProtocol).Scan(&v))
		require.Equal(t, "on", v, "after %s", step)
	}
	show("open")
	v := "v"
	ok, err := s.MetaBatch(ctx, []Cond{{Key: "a"}}, []Op{Put("a", "v"), Put("b", "w")})
	require.NoError(t, err)
	require.True(t, ok)
	show("an applied batch")
	ok, err = s.MetaBatch(ctx, []Cond{{Key: "a"}}, []Op{Put("a", "v")})
	require.NoError(t, err)
	require.False(t, ok)
	show("a refused batch")
	_, err = s.MetaBatch(ctx, []Cond{{Key: "a", Value: &v}}, []Op{Put("a", "bad\x00")})
	t.Logf("batch with a NUL: %v", err)
	show("a batch with a bad value")
	got, err := s.MetaCASMany(ctx, []CASWrite{{Key: "a", Expected: &v, Value: "x"}, {Key: "c", Value: "y"}})
	require.NoError(t, err)
	t.Logf("MetaCASMany: %v", got)
	show("MetaCASMany")
	_, err = pool.Exec(ctx, "DEALLOCATE ALL")
	require.NoError(t, err)
	x := "x"
	ok, err = s.MetaBatch(ctx, []Cond{{Key: "a", Value: &x}}, []Op{Put("a", "z")})
	require.NoError(t, err)
	require.True(t, ok)
	show("a batch after DEALLOCATE ALL")
	// Inside a transaction of the caller's own on another pool connection
	// nothing can leak; here the store's session is the caller's.
	var seq string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('enable_seqscan')", pgx.QueryExecModeSimpleProtocol).Scan(&seq))
	require.Equal(t, "on", seq)
}

// TestPostgresBatchesFindTheirRowsByKeyWhateverThePlan: a connection plans
// a prepared statement once and keeps that generic plan, and a plan made
// while the table was young lasts while the table grows to 100,000 queued
// runs (until the next ANALYZE). The batched writes (MetaBatch,
// MetaCASMany) must still find their rows by the primary key then, never
// by reading the whole table on each call. Here the store's one connection
// makes its plans on a table of 800 rows (plan_cache_mode
// force_generic_plan, which a pool may set, makes them generic at once),
// the table grows to 30,800 rows without new statistics, and the server's
// count of sequential scans of the table must not move over 40 more calls.
func TestPostgresBatchesFindTheirRowsByKeyWhateverThePlan(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = 1 // one connection, whose plans every call uses
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := pgtest.NewTable(t, pool)
	s, err := NewPostgres(ctx, pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	id := pgtest.Ident(table)
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	exec(fmt.Sprintf("ALTER TABLE %s SET (autovacuum_enabled = false)", id)) // no statistics behind the test's back
	exec(fmt.Sprintf(`INSERT INTO %s SELECT 'a/' || i, 'v' FROM generate_series(1, 800) i`, id))
	exec("ANALYZE " + id)

	calls := func(round int) {
		t.Helper()
		for i := range 20 {
			a, b := fmt.Sprintf("k/%06d", 2*i+1), fmt.Sprintf("k/%06d", 2*i+2)
			v, w := fmt.Sprintf("v%d", round), fmt.Sprintf("v%d", round+1)
			_, err := s.MetaBatch(ctx, []Cond{{Key: a, Value: &v}}, []Op{Put(a, w), Put(b, w)})
			require.NoError(t, err)
			_, err = s.MetaCASMany(ctx, []CASWrite{{Key: a, Expected: &w, Value: v}, {Key: b, Expected: &w, Value: v}})
			require.NoError(t, err)
		}
	}
	calls(0) // the plans are made here, on the young table
	exec(fmt.Sprintf(`INSERT INTO %s SELECT 'k/' || lpad(i::text, 6, '0'), 'v1' FROM generate_series(1, 30000) i
		ON CONFLICT (key) DO UPDATE SET value = 'v1'`, id))

	// seqScans is the server's count of sequential scans of the table once
	// the connection's own last scan, on purpose, is counted: a backend
	// reports its counts in order, so the ones before it are in too.
	seqScans := func() int64 {
		t.Helper()
		exec("SELECT pg_stat_force_next_flush()")
		var before int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = $1::regclass", id).Scan(&before))
		exec(fmt.Sprintf("SET enable_seqscan = on; SELECT count(*) FROM %s", id))
		var n int64
		require.Eventually(t, func() bool {
			exec("SELECT pg_stat_force_next_flush()")
			require.NoError(t, pool.QueryRow(ctx, "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = $1::regclass", id).Scan(&n))
			return n > before
		}, 20*time.Second, 50*time.Millisecond)
		return n
	}
	base := seqScans()
	calls(1)
	require.Equal(t, base+1, seqScans(), "the batched writes read the whole table (besides the one scan made to count)")
}

// TestPostgresRangesReadOnlyTheHead runs the statements of MetaRanges under
// EXPLAIN ANALYZE, with the plans the server makes for the values of a call
// and the generic plan it may switch a prepared statement to, on a prefix
// of 20,000 rows between others: each is a scan of the primary key that
// stops at the limit, whether After is empty, below the prefix or inside
// it, and touches a handful of pages, not the prefix's hundreds.
func TestPostgresRangesReadOnlyTheHead(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	s, err := NewPostgres(t.Context(), pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	id := pgx.Identifier(strings.Split(table, ".")).Sanitize()
	_, err = pool.Exec(t.Context(), fmt.Sprintf(`INSERT INTO %s
		SELECT 'q/' || lpad(i::text, 6, '0'), repeat('v', 100) FROM generate_series(1, 20000) i
		UNION ALL SELECT 'a/' || i, 'v' FROM generate_series(1, 3000) i
		UNION ALL SELECT 'z/' || i, 'v' FROM generate_series(1, 3000) i`, id))
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), "ANALYZE "+id)
	require.NoError(t, err)

	conn, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Release() })
	c := conn.Conn()
	exec := func(sql string) {
		t.Helper()
		_, err := c.Exec(t.Context(), sql, pgx.QueryExecModeSimpleProtocol)
		require.NoError(t, err, sql)
	}
	exec(fmt.Sprintf("PREPARE rr_to(text, text, text, bigint) AS %s", s.q.rangeTo))
	exec(fmt.Sprintf("PREPARE rr_open(text, text, bigint) AS %s", s.q.rangeOpen))
	t.Cleanup(func() { c.Exec(t.Context(), "DEALLOCATE rr_to; DEALLOCATE rr_open", pgx.QueryExecModeSimpleProtocol) })
	calls := []string{
		"rr_to('', 'q/', 'q0', 8)",
		"rr_to('a/5', 'q/', 'q0', 8)",      // After below the prefix
		"rr_to('q/010000', 'q/', 'q0', 8)", // After inside it
		"rr_to('', 'q/', 'q0', 1)",
		"rr_open('', '', 8)",
		"rr_open('q/', '', 8)",
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		exec("SET plan_cache_mode = " + mode)
		for _, call := range calls {
			var out []byte
			err := c.QueryRow(t.Context(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE "+call, pgx.QueryExecModeSimpleProtocol).Scan(&out)
			require.NoError(t, err, call)
			var plans []struct{ Plan pgPlanNode }
			require.NoError(t, json.Unmarshal(out, &plans), "%s", out)
			require.Len(t, plans, 1)
			top := plans[0].Plan
			require.Equal(t, "Limit", top.NodeType, "%s, %s: %s", mode, call, out)
			require.Len(t, top.Plans, 1, "%s, %s: %s", mode, call, out)
			scan := top.Plans[0]
			assert.Equal(t, "Index Scan", scan.NodeType, "%s, %s: %s", mode, call, out)
			assert.True(t, strings.HasSuffix(scan.IndexName, "_pkey"), "%s, %s: index %q", mode, call, scan.IndexName)
			limit := 8.0
			if strings.HasSuffix(call, ", 1)") {
				limit = 1
			}
			assert.Equal(t, limit, top.ActualRows, "%s, %s", mode, call)
			assert.LessOrEqual(t, scan.ActualRows, limit, "%s, %s: the scan stops at the limit", mode, call)
			assert.Less(t, top.HitBlocks+top.ReadBlocks, 20, "%s, %s: pages read: %s", mode, call, out)
		}
	}
	exec("RESET plan_cache_mode")
}

// pgPlanNode is what TestPostgresRangesReadOnlyTheHead reads of a node of
// EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON).
type pgPlanNode struct {
	NodeType   string       `json:"Node Type"`
	IndexName  string       `json:"Index Name"`
	ActualRows float64      `json:"Actual Rows"`
	HitBlocks  int          `json:"Shared Hit Blocks"`
	ReadBlocks int          `json:"Shared Read Blocks"`
	Plans      []pgPlanNode `json:"Plans"`
}
