package runlease_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// The shapes of table that a crash or the end of a session empties.
const (
	pgUnloggedTable = `CREATE UNLOGGED TABLE %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL)`
	pgPartitioned   = `CREATE TABLE %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL) PARTITION BY RANGE (key)`
	pgLoggedPart    = `CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (MINVALUE) TO ('m')`
	pgUnloggedPart  = `CREATE UNLOGGED TABLE %s PARTITION OF %s FOR VALUES FROM ('m') TO (MAXVALUE)`
	pgTempTable     = `CREATE TEMPORARY TABLE %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL)`
)

// TestPostgresRefusesATableThatACrashEmpties proves that the store refuses
// tables whose rows do not survive a crash or a session: after a crash an
// unlogged table is empty, so the next holder of every run would start again
// at fence 1, and a temporary table is private to one connection and gone
// with it.
func TestPostgresRefusesATableThatACrashEmpties(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)

	t.Run("an_unlogged_table_is_refused", func(t *testing.T) {
		t.Parallel()
		table := pgtest.NewTable(t, pool)
		mustExec(t, pool, fmt.Sprintf(pgUnloggedTable, pgtest.Ident(table)))
		requireRefused(t, pool, table, "unlogged")
	})

	t.Run("a_partitioned_table_with_an_unlogged_partition_is_refused", func(t *testing.T) {
		t.Parallel()
		table := pgtest.NewTable(t, pool) // dropping it drops its partitions
		mustExec(t, pool, fmt.Sprintf(pgPartitioned, pgtest.Ident(table)))
		mustExec(t, pool, fmt.Sprintf(pgLoggedPart, pgtest.Ident(table+"_a"), pgtest.Ident(table)))
		mustExec(t, pool, fmt.Sprintf(pgUnloggedPart, pgtest.Ident(table+"_b"), pgtest.Ident(table)))
		requireRefused(t, pool, table, "unlogged")
	})

	t.Run("a_partitioned_table_with_logged_partitions_is_accepted", func(t *testing.T) {
		t.Parallel()
		table := pgtest.NewTable(t, pool)
		mustExec(t, pool, fmt.Sprintf(pgPartitioned, pgtest.Ident(table)))
		mustExec(t, pool, fmt.Sprintf(pgLoggedPart, pgtest.Ident(table+"_a"), pgtest.Ident(table)))
		s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		assert.True(t, mustCAS(t, s, "a", nil, "v"))
	})

	t.Run("a_temporary_table_is_refused", func(t *testing.T) {
		t.Parallel()
		// Every connection of this pool has its own temporary table of the
		// name, which shadows any other through search_path.
		table := pgtest.UniqueName("runlease_temp_")
		cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
		require.NoError(t, err)
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, fmt.Sprintf(pgTempTable, pgtest.Ident(table)))
			return err
		}
		temp, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(temp.Close)
		requireRefused(t, temp, table, "temporary")
	})
}

// requireRefused checks that opening a store on table fails with a
// *SchemaError whose problem mentions want.
func requireRefused(t *testing.T, pool *pgxpool.Pool, table, want string) {
	t.Helper()
	s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	if err == nil {
		s.Close()
	}
	require.ErrorIs(t, err, runlease.ErrSchemaMismatch)
	var se *runlease.SchemaError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, table, se.Table)
	assert.Contains(t, se.Problem, want)
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	_, err := pool.Exec(t.Context(), sql)
	require.NoError(t, err, sql)
}
