package runlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// The private cluster's settings for the durability test: the WAL writer
// flushes asynchronous commits only every ten seconds (its maximum), and
// autovacuum, whose commits would flush the WAL as a side effect, is off, so
// that a write committed asynchronously is lost by an immediate restart.
const pgLazyWAL = `ALTER SYSTEM SET wal_writer_delay = '10s'`
const pgNoAutovacuum = `ALTER SYSTEM SET autovacuum = off`

// TestPostgresWritesSurviveACrashWhateverTheDefaults proves that every kind
// of write the store acknowledges survives an immediate restart of the
// server even when the session's default is synchronous_commit = off, set
// for the role, the database or the connection.
func TestPostgresWritesSurviveACrashWhateverTheDefaults(t *testing.T) {
	t.Parallel()
	cluster := pgtest.StartCluster(t)
	admin := clusterPool(t, cluster.DSN())
	for _, sql := range []string{pgLazyWAL, pgNoAutovacuum, "SELECT pg_reload_conf()"} {
		_, err := admin.Exec(t.Context(), sql)
		require.NoError(t, err, sql)
	}
	cases := []struct {
		name       string
		set, reset string // statements run by the admin before and after
		dsnParams  string // appended to the DSN of the store
	}{
		{name: "a_role_with_synchronous_commit_off_loses_nothing",
			set: "ALTER ROLE runlease SET synchronous_commit = off", reset: "ALTER ROLE runlease RESET synchronous_commit"},
		{name: "a_database_with_synchronous_commit_off_loses_nothing",
			set: "ALTER DATABASE postgres SET synchronous_commit = off", reset: "ALTER DATABASE postgres RESET synchronous_commit"},
		{name: "a_connection_with_synchronous_commit_off_loses_nothing", dsnParams: "&synchronous_commit=off"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { // not parallel: each restarts the cluster
			if tc.set != "" {
				mustExecEventually(t, cluster.DSN(), tc.set)
				t.Cleanup(func() { mustExecEventually(t, cluster.DSN(), tc.reset) })
			}
			dsn := cluster.DSN() + tc.dsnParams
			requireSetting(t, dsn, "synchronous_commit", "off")
			s, err := runlease.OpenPostgres(t.Context(), dsn, runlease.WithTable(fmt.Sprintf("durable_%d", i)))
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			require.True(t, mustCAS(t, s, "doomed", nil, "x"))
			mustExecEventually(t, cluster.DSN(), "CHECKPOINT") // what follows is in the WAL only

			acknowledged := writeEveryKind(t, s)
			cluster.Restart()
			for key, want := range acknowledged {
				v, err := readUntilAnswered(t.Context(), s, key)
				require.NoError(t, err, key)
				assert.Equal(t, want, v, "key %q after the crash", key)
			}
		})
	}
}

// writeEveryKind makes one acknowledged write of each kind the store has,
// and returns what each key must hold afterwards ("" for absent).
func writeEveryKind(t *testing.T, s *runlease.PostgresStore) map[string]string {
	t.Helper()
	ctx := t.Context()
	for i := range 5 {
		var prev *string
		if i > 0 {
			prev = strptr(fmt.Sprint(i - 1))
		}
		require.True(t, mustCAS(t, s, "fence", prev, fmt.Sprint(i)))
	}
	ok, err := s.MetaDelete(ctx, "doomed", "x")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.MetaCASNotify(ctx, "notified", nil, "n")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.MetaBatch(ctx, []runlease.Cond{runlease.IfAbsent("batched")}, []runlease.Op{runlease.Put("batched", "b")})
	require.NoError(t, err)
	require.True(t, ok)
	swapped, err := s.MetaCASMany(ctx, []runlease.CASWrite{{Key: "many", Value: "m"}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, swapped)
	return map[string]string{"fence": "4", "doomed": "", "notified": "n", "batched": "b", "many": "m"}
}

// clusterPool opens a pool on dsn, closed when t ends.
func clusterPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// mustExecEventually runs sql on a connection of its own, retrying while a
// restarted server is still coming up.
func mustExecEventually(t *testing.T, dsn, sql string) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	var err error
	for range 100 {
		var pool *pgxpool.Pool
		if pool, err = pgxpool.New(ctx, dsn); err == nil {
			_, err = pool.Exec(ctx, sql)
			pool.Close()
		}
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond) // the server is still starting
	}
	t.Fatalf("%s: %v", sql, err)
}

// requireSetting checks that a new session on dsn has the setting, as the
// store's sessions will: the test's premise.
func requireSetting(t *testing.T, dsn, name, want string) {
	t.Helper()
	pool := clusterPool(t, dsn)
	var got string
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_setting($1)", name).Scan(&got))
	require.Equal(t, want, got, "the premise: new sessions default to %s = %s", name, want)
	pool.Close()
}
