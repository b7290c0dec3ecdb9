package runlease_test

import (
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// TestPostgresPinsLeaveTheCallersConnectionsAsTheyWere proves that the
// settings the store pins for its own statements end with each call: on a
// pool whose one connection defaults to synchronous_commit = off and
// SERIALIZABLE, the connection still has both after every kind of call, and
// no call raised a notice (SET LOCAL outside a transaction block would warn,
// and the server would log it at every call).
func TestPostgresPinsLeaveTheCallersConnectionsAsTheyWere(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	var notices atomic.Int64
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		notices.Add(1)
		t.Logf("notice: %s %s", n.Severity, n.Message)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := pgStore(t, pool)

	ctx := t.Context()
	require.True(t, mustCAS(t, s, "k", nil, "v1"))
	require.True(t, mustCAS(t, s, "k", strptr("v1"), "v2"))
	_, _, err = s.MetaGet(ctx, "k")
	require.NoError(t, err)
	_, err = s.MetaScan(ctx, "")
	require.NoError(t, err)
	_, err = s.MetaCASNotify(ctx, "n", nil, "v")
	require.NoError(t, err)
	_, err = s.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals("k", "v2")}, []runlease.Op{runlease.Put("k", "v3")})
	require.NoError(t, err)
	_, err = s.MetaCASMany(ctx, []runlease.CASWrite{{Key: "k", Expected: strptr("v3"), Value: "v4"}})
	require.NoError(t, err)
	_, err = s.MetaDelete(ctx, "k", "v4")
	require.NoError(t, err)

	var syncCommit, isolation string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('transaction_isolation')").
		Scan(&syncCommit, &isolation))
	assert.Equal(t, "off", syncCommit)
	assert.Equal(t, "serializable", isolation)
	assert.Zero(t, notices.Load(), "notices")
}
