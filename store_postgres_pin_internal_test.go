package runlease

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

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
