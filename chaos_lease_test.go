//go:build linux

package runlease_test

// Lease safety under pauses and kills, on the shared Postgres store: three
// child processes of eight drivers each compete for four runs with the
// shortest TTL, keep their leases with a Keeper, and advance each run in
// supersteps that write downstream (a plain table with a fence condition)
// and then checkpoint through lease.Write. The parent freezes children
// (SIGSTOP, for 0.2 to 2 TTLs, then SIGCONT) and kills them (SIGKILL, then
// a replacement with new holder strings) at random, and checks what the
// children streamed; internal/chaos documents each check and why it is
// sound. The slot test, in chaos_slots_test.go, shares the machinery, and
// etcdstore/chaos_test.go runs the same lease test (chaos.LeaseTest) on
// etcd.
//
// Linux only, with RUNLEASE_TEST_POSTGRES set (they skip without it):
//
//	go test -race -run TestChaos -count=1 -v .             # CI size: 25 s of faults each
//	go test -race -tags chaos -run TestChaos -count=1 -v . # full size: 60 s each
//	RUNLEASE_CHAOS_FOR=2m go test -race -run TestChaos -count=1 -v .
//
// Each check is shown to fail by a deliberately broken holder, chosen with
// RUNLEASE_CHAOS_BREAK (ignore-keeper, ckpt-unfenced, downstream-unfenced,
// slots-ignore-keeper): with it set, the test it targets passes only if its
// check reports violations. internal/chaos's own tests feed the checks
// hand-made violating histories on every run.

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/chaos"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
)

var roleChaosLease = proctest.Register("chaos-lease-driver", func() int {
	return chaos.RunChild(chaosOpener(clConns), clLease.Child)
})

const (
	clConns = 8 // per process: the drivers, renewals and the listener share them
	clTTL   = runlease.MinTTL
	// clInterval is the keeper's default renewal interval at clTTL.
	clInterval = clTTL / 3

	clDownFenced   = `UPDATE %s SET fence = $2, seq = $3 WHERE id = $1 AND fence <= $2`
	clDownUnfenced = `UPDATE %s SET fence = $2, seq = $3 WHERE id = $1` // BreakDownUnfenced
	clDownSchema   = `CREATE TABLE %s (id text PRIMARY KEY, fence bigint NOT NULL, seq bigint NOT NULL)`
)

// clLease is the shape of the test: 3 processes of 8 drivers on 4 runs
// (driver g drives run g mod 4). Bound is the takeover latency that 99% of
// takeovers must beat, counted from the fault: the lease expires at most a
// TTL after the last renewal before the fault, plus a renewal interval for
// a renewal that was late, plus a second of slack for a loaded machine.
var clLease = chaos.LeaseTest{Procs: 3, Drivers: 8, Runs: 4, TTL: clTTL, Bound: clTTL + clInterval + time.Second}

// chaosOpener opens a child's Postgres store on the shared table, with a
// pool of conns connections, and, when the child has a downstream table,
// its sink: the unfenced one for BreakDownUnfenced.
func chaosOpener(conns int32) chaos.Opener {
	return func(ctx context.Context, env chaos.Env) (chaos.Backend, error) {
		cfg, err := pgxpool.ParseConfig(os.Getenv(pgtest.EnvDSN))
		if err != nil {
			return chaos.Backend{}, err
		}
		cfg.MaxConns = conns
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return chaos.Backend{}, err
		}
		store, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(env.Table), runlease.WithCreateTable(false))
		if err != nil {
			pool.Close()
			return chaos.Backend{}, err
		}
		be := chaos.Backend{Store: store, Close: func() { store.Close(); pool.Close() }}
		if env.Down != "" {
			sql := clDownFenced
			if chaos.BreakMode() == chaos.BreakDownUnfenced {
				sql = clDownUnfenced
			}
			be.Down = &pgSink{pool: pool, sql: fmt.Sprintf(sql, pgx.Identifier{env.Down}.Sanitize())}
		}
		return be, nil
	}
}

// pgSink is the downstream of the Postgres test: a plain table, one row
// per run, whose UPDATE refuses a fence lower than the one it holds.
type pgSink struct {
	pool *pgxpool.Pool
	sql  string
}

func (s *pgSink) Put(ctx context.Context, run string, fence uint64, seq int) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.sql, run, int64(fence), seq)
	return err == nil && tag.RowsAffected() == 1, err
}

// chaosWindow returns how long to inject faults, and logs how to change it:
// 25 s by default, 60 s with `-tags chaos`, or RUNLEASE_CHAOS_FOR.
func chaosWindow(t *testing.T) time.Duration {
	t.Helper()
	window, err := chaos.Window()
	require.NoError(t, err)
	t.Logf("injecting faults for %v (-tags chaos: %v; %s overrides)", window, chaos.FullWindow, chaos.EnvFor)
	return window
}

// chaosStore returns a pool and a store on a fresh table for the parent.
func chaosStore(t *testing.T) (*pgxpool.Pool, *runlease.PostgresStore) {
	t.Helper()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	store, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	return pool, store
}

func TestChaosLeaseSafeUnderPausesAndKills(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	clLease.Run(t, func(t *testing.T) chaos.LeaseBackend {
		pool, store := chaosStore(t)
		down := pgtest.UniqueName("runlease_test_down_")
		pgtest.DropAtCleanup(t, pool, down)
		_, err := pool.Exec(t.Context(), fmt.Sprintf(clDownSchema, pgx.Identifier{down}.Sanitize()))
		require.NoError(t, err)
		for i := range clLease.Runs {
			_, err := pool.Exec(t.Context(), fmt.Sprintf(`INSERT INTO %s VALUES ($1, 0, 0)`, pgx.Identifier{down}.Sanitize()), chaos.RunName(i))
			require.NoError(t, err)
		}
		return chaos.LeaseBackend{Role: roleChaosLease, Env: chaos.Env{Table: store.Table(), Down: down}, Store: store,
			ReadDown: func(ctx context.Context) (map[string]chaos.FenceSeq, error) { return clReadDown(ctx, pool, down) }}
	})
}

// clReadDown reads the downstream table's final (fence, seq) of every run.
func clReadDown(ctx context.Context, pool *pgxpool.Pool, down string) (map[string]chaos.FenceSeq, error) {
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT id, fence, seq FROM %s`, pgx.Identifier{down}.Sanitize()))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]chaos.FenceSeq{}
	for rows.Next() {
		var id string
		var fence, seq int64
		if err := rows.Scan(&id, &fence, &seq); err != nil {
			return nil, err
		}
		out[id] = chaos.FenceSeq{Fence: uint64(fence), Seq: int(seq)}
	}
	return out, rows.Err()
}
