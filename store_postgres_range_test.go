package runlease

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

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
