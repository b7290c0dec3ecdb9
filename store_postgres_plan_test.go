package runlease

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

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
