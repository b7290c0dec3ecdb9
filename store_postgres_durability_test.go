package runlease_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/systest"
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
	systest.Mark(t) // a private server, crashed
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

// writeEveryKind makes one acknowledged write of each kind the store has —
// each statement form that writes: MetaCAS's insert and update, MetaDelete,
// MetaCASNotify's insert and update, MetaBatch's fenced forms (no other key,
// one, several) and its general form (with an absent key, and with a
// delete), and MetaCASMany — and returns what each key must hold afterwards
// ("" for absent). A crash test can only tell that the last commit's flush
// was waited for (a flush takes every commit before it along), so
// TestPostgresEveryWriteCommitsWithItsPinsWhateverTheDefaults checks each
// kind at its own commit.
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
	require.True(t, mustCAS(t, s, "rung", nil, "r"))
	ok, err = s.MetaDeleteNotify(ctx, "rung", "r", "bell")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.MetaCASNotify(ctx, "notified", nil, "n")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.MetaCASNotify(ctx, "notified", strptr("n"), "n2")
	require.NoError(t, err)
	require.True(t, ok)
	batch := func(conds []runlease.Cond, ops ...runlease.Op) {
		t.Helper()
		ok, err := s.MetaBatch(ctx, conds, ops)
		require.NoError(t, err)
		require.True(t, ok, "%v %v", conds, ops)
	}
	batch([]runlease.Cond{runlease.IfAbsent("batched")}, runlease.Put("batched", "b"))
	batch([]runlease.Cond{runlease.IfEquals("batched", "b")}, runlease.Put("batched", "b2"), runlease.Delete("fence"))
	for _, key := range []string{"fenced0", "fenced1", "fenced2"} {
		require.True(t, mustCAS(t, s, key, nil, "1"))
	}
	batch([]runlease.Cond{runlease.IfEquals("fenced0", "1")}, runlease.Put("fenced0", "2"))
	batch([]runlease.Cond{runlease.IfEquals("fenced1", "1")}, runlease.Put("fenced1", "2"), runlease.Put("fenced1/a", "a"))
	batch([]runlease.Cond{runlease.IfEquals("fenced2", "1")}, runlease.Put("fenced2", "2"),
		runlease.Put("fenced2/a", "a"), runlease.Put("fenced2/b", "b"))
	swapped, err := s.MetaCASMany(ctx, []runlease.CASWrite{{Key: "many", Value: "m"}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, swapped)
	swapped, err = s.MetaCASMany(ctx, []runlease.CASWrite{{Key: "many", Expected: strptr("m"), Value: "m2"}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, swapped)
	return map[string]string{
		"fence": "", "doomed": "", "rung": "", "notified": "n2", "batched": "b2",
		"fenced0": "2", "fenced1": "2", "fenced1/a": "a", "fenced2": "2", "fenced2/a": "a", "fenced2/b": "b",
		"many": "m2",
	}
}

// TestPostgresEveryWriteCommitsWithItsPinsWhateverTheDefaults proves that
// each kind of write commits with the settings the store pins, whatever
// the session's defaults: a deferred trigger on the table, which the server
// runs at the commit of every transaction that wrote a row, just before it
// reads synchronous_commit to commit, records the settings it sees. Every
// write must see synchronous_commit waiting for the flush (on, or a
// stricter setting left as it was) and READ COMMITTED.
func TestPostgresEveryWriteCommitsWithItsPinsWhateverTheDefaults(t *testing.T) {
	t.Parallel()
	admin := pgtest.Pool(t)
	cases := []struct {
		name      string
		role      map[string]string // the role's defaults
		dsnParams string            // appended to the DSN of the store
		sync      string            // the session's default, and what a write must commit with
		want      string
	}{
		{name: "a_role_with_synchronous_commit_off_and_serializable_commits_flushed_at_read_committed",
			role: map[string]string{"synchronous_commit": "off", "default_transaction_isolation": "serializable"},
			sync: "off", want: "on"},
		{name: "a_role_with_synchronous_commit_local_commits_flushed_to_standbys_too",
			role: map[string]string{"synchronous_commit": "local"}, sync: "local", want: "on"},
		{name: "a_connection_with_synchronous_commit_off_and_repeatable_read_commits_flushed_at_read_committed",
			dsnParams: "&synchronous_commit=off&default_transaction_isolation=repeatable%20read", sync: "off", want: "on"},
		{name: "a_role_with_synchronous_commit_remote_apply_keeps_it",
			role: map[string]string{"synchronous_commit": "remote_apply"}, sync: "remote_apply", want: "remote_apply"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn, table := pgRoleTable(t, admin, tc.role)
			dsn += tc.dsnParams
			requireSetting(t, dsn, "synchronous_commit", tc.sync)
			log := pgCommitLog(t, admin, dsn, table)
			s := openPG(t, dsn, table)
			require.True(t, mustCAS(t, s, "doomed", nil, "x"))
			acknowledged := writeEveryKind(t, s)

			seen := map[string]bool{}
			rows, err := admin.Query(t.Context(), "SELECT key, sync, isolation FROM "+log+" ORDER BY n")
			require.NoError(t, err)
			for rows.Next() {
				var key, sync, isolation string
				require.NoError(t, rows.Scan(&key, &sync, &isolation))
				seen[key] = true
				assert.Equal(t, tc.want, sync, "synchronous_commit at the commit of a write of %q", key)
				assert.Equal(t, "read committed", isolation, "isolation of a write of %q", key)
			}
			require.NoError(t, rows.Err())
			for key := range acknowledged {
				assert.True(t, seen[key], "the premise: the trigger saw the commit of %q", key)
			}
		})
	}
}

// pgCommitLog creates, on table, a deferred constraint trigger that logs,
// at the commit of every transaction that writes a row, the row's key and
// the settings synchronous_commit and transaction_isolation as the commit
// sees them, into a new table that the role of dsn may write. It returns
// the log table; everything is dropped when t ends.
func pgCommitLog(t *testing.T, admin *pgxpool.Pool, dsn, table string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	role := pgx.Identifier{u.User.Username()}.Sanitize()
	log := pgtest.Ident(pgtest.NewTable(t, admin))
	fn := pgx.Identifier{pgtest.UniqueName("runlease_commit_log_")}.Sanitize()
	run := func(sql string) {
		t.Helper()
		_, err := admin.Exec(context.WithoutCancel(t.Context()), sql)
		require.NoError(t, err, sql)
	}
	run("CREATE TABLE " + log + " (n bigserial, key text, sync text, isolation text)")
	run("GRANT INSERT ON " + log + " TO " + role)
	run("GRANT USAGE ON SEQUENCE " + pgx.Identifier{strings.Trim(log, `"`) + "_n_seq"}.Sanitize() + " TO " + role)
	run(`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ` + log + ` (key, sync, isolation) VALUES (CASE WHEN TG_OP = 'DELETE' THEN OLD.key ELSE NEW.key END,
		current_setting('synchronous_commit'), current_setting('transaction_isolation'));
	RETURN NULL;
END $$`)
	t.Cleanup(func() { run("DROP FUNCTION " + fn + " CASCADE") })
	run("CREATE CONSTRAINT TRIGGER commit_log AFTER INSERT OR UPDATE OR DELETE ON " + pgtest.Ident(table) +
		" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + fn + "()")
	return log
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

// The shapes of table that a crash or the end of a session empties.
const (
	pgUnloggedTable = `CREATE UNLOGGED TABLE %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL)`
	pgPartitioned   = `CREATE TABLE %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL) PARTITION BY RANGE (key)`
	pgLoggedPart    = `CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (MINVALUE) TO ('m')`
	pgUnloggedPart  = `CREATE UNLOGGED TABLE %s PARTITION OF %s FOR VALUES FROM ('m') TO (MAXVALUE)`
	pgTempTable     = `CREATE TEMPORARY TABLE %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL)`
)
