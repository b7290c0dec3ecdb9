package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// pgPoolDroppingCancel returns a pool of n connections on the test server,
// all open and idle, and drop, which makes the next new connection fail
// and returns a channel closed once one has. While every call finds an
// open connection, that next one is the cancel request pgx sends for a
// call whose context ended: dropped, as a network fault may drop it, it
// leaves the server running the call its client gave up.
func pgPoolDroppingCancel(t *testing.T, n int32) (pool *pgxpool.Pool, drop func() <-chan struct{}) {
	t.Helper()
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns, cfg.MinConns = n, 0
	cfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("runlease-drop-%d", rand.Uint64())
	var mu sync.Mutex
	var armed chan struct{}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dropped := armed
		armed = nil
		mu.Unlock()
		if dropped != nil {
			close(dropped)
			return nil, errors.New("network unreachable")
		}
		return dial(ctx, network, addr)
	}
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		conns[i], err = pool.Acquire(ctx)
		require.NoError(t, err)
	}
	for _, c := range conns {
		c.Release()
	}
	return pool, func() <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		armed = make(chan struct{})
		return armed
	}
}

// awaitBackends waits until as many backends of pool as want match where,
// a condition on pg_stat_activity, for 10 s at most, and reports whether
// they did. It fails t otherwise, without stopping it, so that it can run
// beside the call it waits for.
func awaitBackends(t *testing.T, pool *pgxpool.Pool, where string, want int) bool {
	t.Helper()
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, pgtest.DSN(t))
	if !assert.NoError(t, err) {
		return false
	}
	defer admin.Close(context.Background())
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	n := -1
	for end := time.Now().Add(10 * time.Second); n != want && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND "+where, app).Scan(&n)
		if !assert.NoError(t, err) {
			return false
		}
	}
	return assert.Equal(t, want, n, "backends of the pool where %s", where)
}

// holdKey inserts key into table in a transaction of its own that stays
// open: a write of key waits for it until release rolls it back.
func holdKey(t *testing.T, table, key string) (release func()) {
	t.Helper()
	ctx := t.Context()
	holder, err := pgx.Connect(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close(context.Background()) })
	_, err = holder.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = holder.Exec(ctx, "INSERT INTO "+table+" (key, value) VALUES ($1, 'held')", key)
	require.NoError(t, err)
	return func() {
		_, err := holder.Exec(ctx, "ROLLBACK")
		require.NoError(t, err)
	}
}

// TestPostgresReadOfABatchInDoubtWaitsWhileTheBatchMayStillRun: a batch
// whose context ends while it waits for a row lock fails with an unknown
// outcome, and its cancel request is lost, so the server goes on with it.
// A read of one of its keys (the read-back that resolves it) must not
// return the row as it was while the batch may still commit: it waits
// until the batch's backend is done, and returns what the batch wrote.
func TestPostgresReadOfABatchInDoubtWaitsWhileTheBatchMayStillRun(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, drop := pgPoolDroppingCancel(t, 3)
	table := pgtest.NewTable(t, pool)
	s, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })

	release := holdKey(t, table, "b") // the batch takes a, then waits at b
	dropped := drop()
	bctx, cancel := context.WithCancel(ctx)
	go func() {
		awaitBackends(t, pool, "wait_event_type = 'Lock'", 1)
		cancel()
	}()
	_, err = s.MetaBatch(bctx, []runlease.Cond{{Key: "a"}, {Key: "b"}},
		[]runlease.Op{runlease.Put("a", "va"), runlease.Put("b", "vb")})
	cancel()
	require.True(t, runlease.IsOutcomeUnknown(err), "batch: %v", err)
	select {
	case <-dropped:
	case <-time.After(10 * time.Second):
		t.Fatal("pgx sent no cancel request")
	}

	type read struct {
		v     string
		found bool
		err   error
	}
	reads := make(chan read, 1)
	go func() {
		v, found, err := s.MetaGet(ctx, "a")
		reads <- read{v, found, err}
	}()
	select {
	case r := <-reads:
		release()
		t.Fatalf("the read returned (%q, found %v, %v) while the batch could still commit", r.v, r.found, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	release() // the batch goes on, and commits
	r := <-reads
	require.NoError(t, r.err)
	assert.True(t, r.found)
	assert.Equal(t, "va", r.v)
	v, found, err := s.MetaGet(ctx, "b")
	require.NoError(t, err)
	assert.True(t, found)
	assert.Equal(t, "vb", v)
}
