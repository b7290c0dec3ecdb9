package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/systest"
	"github.com/areev/runlease/storetest"
)

// pgStore returns a store on a fresh table of the shared test server, using
// pool, and closes it when t ends.
func pgStore(t *testing.T, pool *pgxpool.Pool, opts ...runlease.PostgresOption) *runlease.PostgresStore {
	t.Helper()
	opts = append([]runlease.PostgresOption{runlease.WithTable(pgtest.NewTable(t, pool))}, opts...)
	s, err := runlease.NewPostgres(t.Context(), pool, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func strptr(s string) *string { return &s }

func TestPostgresConformance(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	storetest.RunWith(t, pgHarness(t, pool))
}

func TestPostgresSchema(t *testing.T) {
	t.Parallel()
	t.Run("is_text_collate_C_with_the_name_quoted", func(t *testing.T) {
		ddl, err := runlease.PostgresSchema(runlease.DefaultPostgresTable)
		require.NoError(t, err)
		assert.Equal(t, `CREATE TABLE IF NOT EXISTS "runlease_meta" (key text COLLATE "C" PRIMARY KEY, value text NOT NULL)`, ddl)
		ddl, err = runlease.PostgresSchema(`app.x"; drop table y; --`)
		require.NoError(t, err)
		assert.Contains(t, ddl, ` "app"."x""; drop table y; --" (`)
	})
	bad := []struct{ name, table string }{
		{"empty", ""},
		{"three_parts", "a.b.c"},
		{"empty_schema", ".leases"},
		{"empty_table", "app."},
		{"part_over_63_bytes", strings.Repeat("t", 64)},
		{"nul", "a\x00b"},
		{"invalid_utf8", "a\xffb"},
	}
	for _, tc := range bad {
		t.Run("refuses_"+tc.name, func(t *testing.T) {
			_, err := runlease.PostgresSchema(tc.table)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			// The name is checked before any connection is made.
			_, err = runlease.OpenPostgres(t.Context(), "postgres://u@127.0.0.1:1/x?sslmode=disable", runlease.WithTable(tc.table))
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
		})
	}
	t.Run("accepts_63_bytes", func(t *testing.T) {
		_, err := runlease.PostgresSchema(strings.Repeat("t", 63) + "." + strings.Repeat("s", 63))
		require.NoError(t, err)
	})
}

// pgxpoolGoroutines counts the health-check goroutines of open pgx pools.
func pgxpoolGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "pgxpool.(*Pool).backgroundHealthCheck")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// Not parallel: it counts the pools of the whole process.
func TestPostgresOpenFailures(t *testing.T) {
	const password = "pw-Sekr1t-9f3c"
	t.Run("an_unreachable_server_is_a_storage_fault_that_changed_nothing", func(t *testing.T) {
		before := pgxpoolGoroutines()
		for range 3 {
			_, err := runlease.OpenPostgres(t.Context(), "postgres://runlease:"+password+"@127.0.0.1:1/test?sslmode=disable")
			require.ErrorIs(t, err, runlease.ErrStorage)
			var se *runlease.StorageError
			require.ErrorAs(t, err, &se)
			assert.False(t, se.Unknown, "no connection, so nothing was sent")
			assert.True(t, se.Retryable, "a refused connection may clear")
			assert.NotContains(t, err.Error(), password)
			assert.True(t, strings.HasPrefix(err.Error(), runlease.CodeStorage), err.Error())
		}
		// A failed open closes the pool it made: its goroutine ends.
		require.Eventually(t, func() bool { return pgxpoolGoroutines() <= before }, 5*time.Second, 10*time.Millisecond,
			"a failed OpenPostgres leaked its pool")
	})
	t.Run("a_password_quoted_in_a_driver_message_is_redacted", func(t *testing.T) {
		// pgx's connect error names the user; here the password is the same
		// text, so only the store's own redaction keeps it out.
		const same = "runlease-user-is-the-password"
		_, err := runlease.OpenPostgres(t.Context(), "postgres://"+same+":"+same+"@127.0.0.1:1/test?sslmode=disable")
		require.ErrorIs(t, err, runlease.ErrStorage)
		assert.NotContains(t, err.Error(), same)
		var connErr *pgconn.ConnectError
		assert.ErrorAs(t, err, &connErr, "pgx's error stays reachable")
	})
	for _, tc := range []struct{ name, dsn string }{
		{"url_with_a_bad_port", "postgres://runlease:" + password + "@127.0.0.1:notaport/test"},
		{"key_value_with_a_bad_port", "host=127.0.0.1 port=notaport password=" + password},
		{"url_with_a_bad_pool_setting", "postgres://runlease:" + password + "@127.0.0.1/test?pool_max_conns=many"},
		{"url_with_an_unterminated_host", "postgres://runlease:" + password + "@[::1/test"},
	} {
		t.Run("an_unparsable_dsn_is_an_invalid_argument_without_its_password/"+tc.name, func(t *testing.T) {
			_, err := runlease.OpenPostgres(t.Context(), tc.dsn)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			assert.NotContains(t, err.Error(), password)
			var pce *pgconn.ParseConfigError
			assert.ErrorAs(t, err, &pce, "pgx's error stays reachable")
		})
	}
}

func TestPostgresOpen(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	pool := pgtest.Pool(t)

	t.Run("creates_the_table_and_reopens_it", func(t *testing.T) {
		t.Parallel()
		table := pgtest.NewTable(t, pool)
		s, err := runlease.OpenPostgres(t.Context(), dsn, runlease.WithTable(table))
		require.NoError(t, err)
		assert.Equal(t, table, s.Table())
		require.True(t, mustCAS(t, s, "k", nil, "v"))
		require.NoError(t, s.Close())
		require.NoError(t, s.Close(), "Close is idempotent")
		_, _, err = s.MetaGet(t.Context(), "k")
		require.ErrorIs(t, err, runlease.ErrStoreClosed)

		s, err = runlease.OpenPostgres(t.Context(), dsn, runlease.WithTable(table), runlease.WithCreateTable(false))
		require.NoError(t, err)
		defer s.Close()
		v, found, err := s.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, "v", v)
	})

	t.Run("concurrent_opens_of_a_new_table_all_succeed", func(t *testing.T) {
		t.Parallel()
		for range 3 {
			table := pgtest.NewTable(t, pool)
			const openers = 8
			var wg sync.WaitGroup
			errs := make([]error, openers)
			for i := range openers {
				wg.Go(func() {
					s, err := runlease.OpenPostgres(t.Context(), dsn, runlease.WithTable(table))
					if err == nil {
						s.Close()
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
		}
	})

	t.Run("an_open_racing_another_creator_of_the_table_succeeds", func(t *testing.T) {
		t.Parallel()
		// Another node creates the table in a transaction that is still
		// open: the store's check does not see it, and its own CREATE TABLE
		// IF NOT EXISTS waits, then fails with unique_violation (23505) once
		// the other commits. The store must look again and use the table.
		table := pgtest.NewTable(t, pool)
		ddl, err := runlease.PostgresSchema(table)
		require.NoError(t, err)
		tx, err := pool.Begin(t.Context())
		require.NoError(t, err)
		defer tx.Rollback(context.WithoutCancel(t.Context()))
		_, err = tx.Exec(t.Context(), ddl)
		require.NoError(t, err)

		done := make(chan error, 1)
		go func() {
			s, err := runlease.OpenPostgres(t.Context(), dsn, runlease.WithTable(table))
			if err == nil {
				s.Close()
			}
			done <- err
		}()
		require.Eventually(t, func() bool {
			var n int
			err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE 'CREATE TABLE IF NOT EXISTS %' AND query LIKE $1`,
				"%"+table+"%").Scan(&n)
			return err == nil && n == 1
		}, 10*time.Second, 10*time.Millisecond, "the store's CREATE TABLE never waited for the other creator")
		require.NoError(t, tx.Commit(t.Context()))
		require.NoError(t, <-done)
	})

	t.Run("without_create_a_missing_table_is_a_schema_mismatch", func(t *testing.T) {
		t.Parallel()
		_, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(pgtest.NewTable(t, pool)), runlease.WithCreateTable(false))
		require.ErrorIs(t, err, runlease.ErrSchemaMismatch)
		assert.ErrorContains(t, err, "does not exist")
	})

	t.Run("a_schema_qualified_name_uses_that_schema", func(t *testing.T) {
		t.Parallel()
		schema := pgtest.NewSchema(t, pool)
		s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(schema+".leases"))
		require.NoError(t, err)
		require.True(t, mustCAS(t, s, "k", nil, "v"))
		var n int
		require.NoError(t, pool.QueryRow(t.Context(),
			"SELECT count(*) FROM "+pgtest.Ident(schema+".leases")+" WHERE key = 'k'").Scan(&n))
		assert.Equal(t, 1, n)
	})

	t.Run("new_postgres_never_closes_the_callers_pool", func(t *testing.T) {
		t.Parallel()
		s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(pgtest.NewTable(t, pool)))
		require.NoError(t, err)
		require.NoError(t, s.Close())
		require.NoError(t, pool.Ping(t.Context()), "the caller's pool must stay open")
		_, err = s.MetaCAS(t.Context(), "k", nil, "v")
		require.ErrorIs(t, err, runlease.ErrStoreClosed)
		_, err = runlease.NewPostgres(t.Context(), nil)
		require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	})
}

func mustCAS(t *testing.T, s runlease.Store, key string, expected *string, value string) bool {
	t.Helper()
	ok, err := s.MetaCAS(t.Context(), key, expected, value)
	require.NoError(t, err)
	return ok
}

func TestPostgresRefusesAMismatchedTable(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	cases := []struct {
		name    string
		ddl     string // %s is the table
		problem string // "" when the table fits
	}{
		{"value_jsonb", `CREATE TABLE %s (key text COLLATE "C" PRIMARY KEY, value jsonb NOT NULL)`,
			"column value has type jsonb, want text"},
		{"key_without_collate_C", `CREATE TABLE %s (key text PRIMARY KEY, value text NOT NULL)`,
			`column key has collation "default", want "C"`},
		{"key_varchar", `CREATE TABLE %s (key varchar(200) COLLATE "C" PRIMARY KEY, value text NOT NULL)`,
			"column key has type character varying(200), want text"},
		{"extra_column", `CREATE TABLE %s (key text COLLATE "C" PRIMARY KEY, value text NOT NULL, note text)`,
			`unexpected column "note"`},
		{"missing_value", `CREATE TABLE %s (key text COLLATE "C" PRIMARY KEY)`,
			"column value is missing"},
		{"nullable_value", `CREATE TABLE %s (key text COLLATE "C" PRIMARY KEY, value text)`,
			"column value is not NOT NULL"},
		{"key_not_primary", `CREATE TABLE %s (key text COLLATE "C" NOT NULL UNIQUE, value text NOT NULL)`,
			"column key is not the primary key"},
		{"composite_primary_key", `CREATE TABLE %s (key text COLLATE "C", value text NOT NULL, PRIMARY KEY (key, value))`,
			"column key is not the primary key"},
		{"accepts_POSIX_collation", `CREATE TABLE %s (key text COLLATE "POSIX" PRIMARY KEY, value text NOT NULL)`, ""},
		{"accepts_the_published_schema", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			table := pgtest.NewTable(t, pool)
			ddl := tc.ddl
			if ddl == "" {
				var err error
				ddl, err = runlease.PostgresSchema(table)
				require.NoError(t, err)
			} else {
				ddl = fmt.Sprintf(ddl, pgtest.Ident(table))
			}
			_, err := pool.Exec(t.Context(), ddl)
			require.NoError(t, err)
			s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
			if tc.problem == "" {
				require.NoError(t, err)
				require.True(t, mustCAS(t, s, "k", nil, "v"))
				return
			}
			require.ErrorIs(t, err, runlease.ErrSchemaMismatch)
			var se *runlease.SchemaError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, table, se.Table)
			assert.Contains(t, se.Problem, tc.problem)
			assert.True(t, strings.HasPrefix(err.Error(), runlease.CodeSchemaMismatch), err.Error())
		})
	}
	t.Run("a_view", func(t *testing.T) {
		t.Parallel()
		view := pgtest.NewTable(t, pool) + "_view"
		_, err := pool.Exec(t.Context(), `CREATE VIEW `+pgtest.Ident(view)+` AS SELECT 'k'::text COLLATE "C" AS key, 'v'::text AS value`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = pool.Exec(context.WithoutCancel(t.Context()), "DROP VIEW IF EXISTS "+pgtest.Ident(view))
		})
		_, err = runlease.NewPostgres(t.Context(), pool, runlease.WithTable(view))
		require.ErrorIs(t, err, runlease.ErrSchemaMismatch)
		assert.ErrorContains(t, err, "not a table")
	})
}

func TestPostgresHostileTableNamesAreUsedExactly(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	decoy := pgtest.UniqueName("d")
	pgtest.DropAtCleanup(t, pool, decoy)
	_, err := pool.Exec(t.Context(), "CREATE TABLE "+pgtest.Ident(decoy)+" (x int)")
	require.NoError(t, err)
	for _, hostile := range []string{`a"b`, `x; drop table ` + decoy + `; --`, `Mixed Case`, `ünï'cödé`, `--`, `%s`} {
		t.Run(hostile, func(t *testing.T) {
			t.Parallel()
			name := pgtest.UniqueName(hostile + " ")
			pgtest.DropAtCleanup(t, pool, name)
			s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(name))
			require.NoError(t, err)
			require.True(t, mustCAS(t, s, "k", nil, "v"))
			var n int
			require.NoError(t, pool.QueryRow(t.Context(),
				"SELECT count(*) FROM pg_class WHERE relname = $1 AND relkind = 'r'", name).Scan(&n))
			assert.Equal(t, 1, n, "the table must exist with exactly the given name")
		})
	}
	t.Cleanup(func() {
		var n int
		err := pool.QueryRow(context.WithoutCancel(t.Context()), "SELECT count(*) FROM "+pgtest.Ident(decoy)).Scan(&n)
		assert.NoError(t, err, "the decoy table must survive")
	})
}

func TestPostgresHostileKeys(t *testing.T) {
	t.Parallel()
	s := pgStore(t, pgtest.Pool(t))
	mem, err := runlease.OpenSQLite(":memory:")
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })

	t.Run("round_trip_and_scan_literally", func(t *testing.T) {
		keys := []string{"%", "%%", "_", "a_b", "axb", `\`, `a\b`, `a\\b`, "'", `"`, "'; DROP TABLE x; --",
			strings.Repeat("k", runlease.MaxKeyLen), strings.Repeat("é", runlease.MaxKeyLen/2)}
		for _, k := range keys {
			require.True(t, mustCAS(t, s, k, nil, "v:"+k), "key %q", k)
		}
		for _, k := range keys {
			v, found, err := s.MetaGet(t.Context(), k)
			require.NoError(t, err)
			require.True(t, found, "key %q", k)
			assert.Equal(t, "v:"+k, v)
		}
		for prefix, want := range map[string][]string{
			"%": {"%", "%%"}, "a_": {"a_b"}, `a\`: {`a\\b`, `a\b`}, "_": {"_"}, "'": {"'", "'; DROP TABLE x; --"},
		} {
			rows, err := s.MetaScan(t.Context(), prefix)
			require.NoError(t, err)
			var got []string
			for _, r := range rows {
				got = append(got, r.Key)
			}
			assert.Equal(t, want, got, "MetaScan(%q)", prefix)
		}
	})

	t.Run("bad_keys_are_refused_exactly_as_on_sqlite", func(t *testing.T) {
		for _, k := range []string{strings.Repeat("k", 4096), strings.Repeat("k", runlease.MaxKeyLen+1), "", "a\x00b", "a\xffb"} {
			_, pgErr := s.MetaCAS(t.Context(), k, nil, "v")
			require.ErrorIs(t, pgErr, runlease.ErrInvalidArgument)
			_, liteErr := mem.MetaCAS(t.Context(), k, nil, "v")
			assert.Equal(t, liteErr.Error(), pgErr.Error())
			_, _, pgErr = s.MetaGet(t.Context(), k)
			_, _, liteErr = mem.MetaGet(t.Context(), k)
			assert.Equal(t, liteErr.Error(), pgErr.Error())
		}
	})
}

func TestPostgresContextErrors(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)

	t.Run("a_context_ended_before_the_call_changes_nothing", func(t *testing.T) {
		t.Parallel()
		s := pgStore(t, pool)
		require.True(t, mustCAS(t, s, "k", nil, "v1"))
		cancelled, cancel := context.WithCancel(t.Context())
		cancel()
		expired, cancel2 := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
		defer cancel2()
		for _, c := range []struct {
			ctx  context.Context
			want error
		}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
			calls := map[string]func() error{
				"MetaGet":    func() error { _, _, err := s.MetaGet(c.ctx, "k"); return err },
				"MetaCAS":    func() error { _, err := s.MetaCAS(c.ctx, "k", strptr("v1"), "v2"); return err },
				"MetaCASNew": func() error { _, err := s.MetaCAS(c.ctx, "new", nil, "v"); return err },
				"MetaDelete": func() error { _, err := s.MetaDelete(c.ctx, "k", "v1"); return err },
				"MetaScan":   func() error { _, err := s.MetaScan(c.ctx, ""); return err },
			}
			for name, call := range calls {
				err := call()
				require.ErrorIs(t, err, c.want, name)
				var se *runlease.StorageError
				require.ErrorAs(t, err, &se, name)
				assert.False(t, se.Unknown, "%s: nothing was sent", name)
				assert.False(t, se.Retryable, "%s: the caller gave up", name)
			}
		}
		rows, err := s.MetaScan(t.Context(), "")
		require.NoError(t, err)
		assert.Equal(t, []runlease.Row{{Key: "k", Value: "v1"}}, rows)
	})

	t.Run("a_write_cancelled_in_flight_has_an_unknown_outcome", func(t *testing.T) {
		t.Parallel()
		s, table := pgStoreAndTable(t, pool)
		require.True(t, mustCAS(t, s, "k", nil, "v1"))
		tx := lockRow(t, pool, table, "k")

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := s.MetaCAS(ctx, "k", strptr("v1"), "v2")
			done <- err
		}()
		waitForLockWait(t, pool, table)
		cancel()
		err := <-done
		require.ErrorIs(t, err, context.Canceled)
		require.True(t, runlease.IsOutcomeUnknown(err), "the statement was sent: %v", err)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, "MetaCAS", se.Op)

		// The server did not notice the client leave: once the lock is
		// free, the UPDATE may still commit. Reading the row resolves it.
		require.NoError(t, tx.Rollback(t.Context()))
		v, _, err := s.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.Contains(t, []string{"v1", "v2"}, v)
	})
}

func TestPostgresServerErrors(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)

	t.Run("an_ERROR_from_the_server_rolled_the_write_back", func(t *testing.T) {
		t.Parallel()
		table := pgtest.NewTable(t, pool)
		cfg := pool.Config()
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = "50ms"
		impatient, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(impatient.Close)
		s, err := runlease.NewPostgres(t.Context(), impatient, runlease.WithTable(table))
		require.NoError(t, err)
		require.True(t, mustCAS(t, s, "k", nil, "v1"))
		tx := lockRow(t, pool, table, "k")

		_, err = s.MetaCAS(t.Context(), "k", strptr("v1"), "v2")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		assert.Equal(t, "55P03", pgErr.Code, "lock_not_available")
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.False(t, se.Unknown, "an ERROR aborts the autocommit statement")
		assert.True(t, se.Retryable)
		require.NoError(t, tx.Rollback(t.Context()))
		v, _, err := s.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, "v1", v)
	})

	t.Run("a_FATAL_from_the_server_is_an_unknown_outcome", func(t *testing.T) {
		t.Parallel()
		s, table := pgStoreAndTable(t, pool)
		require.True(t, mustCAS(t, s, "k", nil, "v1"))
		tx := lockRow(t, pool, table, "k")
		done := make(chan error, 1)
		go func() {
			_, err := s.MetaCAS(t.Context(), "k", strptr("v1"), "v2")
			done <- err
		}()
		pid := waitForLockWait(t, pool, table)
		_, err := pool.Exec(t.Context(), "SELECT pg_terminate_backend($1)", pid)
		require.NoError(t, err)
		err = <-done
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		assert.Equal(t, "57P01", pgErr.Code, "admin_shutdown")
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.True(t, se.Unknown, "a FATAL ends the session; the write's fate is not reported")
		assert.True(t, se.Retryable)
		require.NoError(t, tx.Rollback(t.Context()))
		require.True(t, mustCAS(t, s, "k", strptr("v1"), "v3"), "the pool replaces the dead connection")
	})
}

// pgStoreAndTable is pgStore that also returns the table's name.
func pgStoreAndTable(t *testing.T, pool *pgxpool.Pool) (*runlease.PostgresStore, string) {
	t.Helper()
	table := pgtest.NewTable(t, pool)
	s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, table
}

// lockRow locks key's row in a transaction that is rolled back when t ends,
// so that a write of the row waits on the server.
func lockRow(t *testing.T, pool *pgxpool.Pool, table, key string) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) })
	_, err = tx.Exec(t.Context(), "SELECT 1 FROM "+pgtest.Ident(table)+" WHERE key = $1 FOR UPDATE", key)
	require.NoError(t, err)
	return tx
}

// waitForLockWait waits until a statement on table waits for a lock, and
// returns its backend's pid.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE $1`, "%"+table+"%").Scan(&pid)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "no statement on %s waited for the lock", table)
	return pid
}

// countingConn counts the writes on a connection. pgx writes each batch of
// frontend messages in one Write, and reads the whole reply before it sends
// again, so writes count round trips.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

func TestPostgresEachCallIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	var writes atomic.Int64
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes}, nil
	}
	cfg.MaxConns = 1
	// The pool's ping of idle connections is a round trip of its own; turn it
	// off so that only the store's statements are counted.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := pgStore(t, pool)

	big := strings.Repeat("v", runlease.MaxValueLen)
	calls := []struct {
		name string
		call func() error
	}{
		{"MetaCAS_insert", func() error { _, err := s.MetaCAS(t.Context(), "k", nil, "v1"); return err }},
		{"MetaCAS_update", func() error { _, err := s.MetaCAS(t.Context(), "k", strptr("v1"), big); return err }},
		{"MetaGet", func() error { _, _, err := s.MetaGet(t.Context(), "k"); return err }},
		{"MetaGet_absent", func() error { _, _, err := s.MetaGet(t.Context(), "nope"); return err }},
		{"MetaScan", func() error { _, err := s.MetaScan(t.Context(), "k"); return err }},
		{"MetaScan_all", func() error { _, err := s.MetaScan(t.Context(), ""); return err }},
		{"MetaDelete", func() error { _, err := s.MetaDelete(t.Context(), "k", big); return err }},
		{"MetaCASNotify", func() error { _, err := s.MetaCASNotify(t.Context(), "n", nil, "v"); return err }},
		{"MetaBatch", func() error {
			_, err := s.MetaBatch(t.Context(), []runlease.Cond{runlease.IfAbsent("b")}, []runlease.Op{runlease.Put("b", "v")})
			return err
		}},
		{"MetaCASMany", func() error {
			_, err := s.MetaCASMany(t.Context(), []runlease.CASWrite{{Key: "n", Expected: strptr("v"), Value: "w"}, {Key: "m", Value: "v"}})
			return err
		}},
	}
	// The first round prepares each statement in the call's own round trip;
	// the second runs them prepared.
	for round := range 2 {
		for _, c := range calls {
			before := writes.Load()
			require.NoError(t, c.call(), c.name)
			assert.Equal(t, int64(1), writes.Load()-before, "%s, round %d: round trips", c.name, round)
		}
	}
	var names []string
	rows, err := pool.Query(t.Context(), "SELECT name FROM pg_prepared_statements", pgx.QueryExecModeExec)
	require.NoError(t, err)
	names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.NotEmpty(t, names, "the statements stay prepared on the connection")
	for _, n := range names {
		assert.True(t, strings.HasPrefix(n, "runlease_"), "prepared statement %q", n)
	}
}

func TestPostgresServerRestart(t *testing.T) {
	systest.Mark(t) // a private server, restarted
	t.Parallel()
	cluster := pgtest.StartCluster(t)
	s, err := runlease.OpenPostgres(t.Context(), cluster.DSN())
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.True(t, mustCAS(t, s, "before", nil, "committed"))

	t.Run("calls_while_the_server_is_down_fail_classified", func(t *testing.T) {
		cluster.Stop()
		// The first call may meet a connection the crash cut, after sending
		// (unknown outcome); the server is gone, so one soon fails to connect.
		var notApplied bool
		for i := 0; i < 20 && !notApplied; i++ {
			_, err := s.MetaCAS(t.Context(), "during", nil, "x")
			var se *runlease.StorageError
			require.ErrorAs(t, err, &se)
			notApplied = !se.Unknown
		}
		assert.True(t, notApplied, "a refused connection must be reported as not applied")
		cluster.Start()
		waitForRecovery(t, s)
		_, found, err := s.MetaGet(t.Context(), "during")
		require.NoError(t, err)
		assert.False(t, found)
	})

	t.Run("a_crash_restart_mid_run_loses_no_committed_write", func(t *testing.T) {
		var commits atomic.Int64
		stop := make(chan struct{})
		done := make(chan counterResult, 1)
		go func() { done <- runCounter(t.Context(), s, stop, &commits) }()

		waitForCommits(t, &commits, 20)
		cluster.Restart()
		restarted := time.Now()
		waitForCommits(t, &commits, commits.Load()+20)
		t.Logf("writes resumed %v after the server accepted connections again", time.Since(restarted))
		close(stop)
		res := <-done
		require.NoError(t, res.err)
		t.Logf("%d commits, %d faults (%d with an unknown outcome)", res.value, res.faults, res.unknown)

		v, _, err := s.MetaGet(t.Context(), "counter")
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint(res.value), v)
		v, _, err = s.MetaGet(t.Context(), "before")
		require.NoError(t, err)
		assert.Equal(t, "committed", v)
	})
}

// waitForRecovery polls until the store answers again, and fails t when it
// does not within 30 seconds.
func waitForRecovery(t *testing.T, s runlease.Store) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, _, err := s.MetaGet(t.Context(), "before")
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "the pool did not recover")
}

func waitForCommits(t *testing.T, commits *atomic.Int64, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return commits.Load() >= n }, 30*time.Second, 10*time.Millisecond,
		"the writer did not reach %d commits", n)
}

type counterResult struct {
	value, faults, unknown int
	err                    error
}

// runCounter counts up in one row by CAS until stop closes, as the only
// writer. A fault must be a classified StorageError; an unknown outcome is
// resolved by reading the row, as the policy layer does; a fault reported as
// not applied that was applied would make the next CAS fail, which is an
// error.
func runCounter(ctx context.Context, s runlease.Store, stop <-chan struct{}, commits *atomic.Int64) counterResult {
	var r counterResult
	if ok, err := s.MetaCAS(ctx, "counter", nil, "0"); err != nil || !ok {
		r.err = fmt.Errorf("create the counter: %v %v", ok, err)
		return r
	}
	for {
		select {
		case <-stop:
			return r
		default:
		}
		cur, next := fmt.Sprint(r.value), fmt.Sprint(r.value+1)
		ok, err := s.MetaCAS(ctx, "counter", &cur, next)
		var se *runlease.StorageError
		switch {
		case err == nil && ok:
		case err == nil:
			r.err = fmt.Errorf("the CAS %s→%s lost with no other writer", cur, next)
			return r
		case !errors.As(err, &se):
			r.err = fmt.Errorf("an unclassified fault: %w", err)
			return r
		case se.Unknown:
			r.faults++
			r.unknown++
			v, err := readUntilAnswered(ctx, s, "counter")
			if err != nil {
				r.err = err
				return r
			}
			if v != next && v != cur {
				r.err = fmt.Errorf("after an unknown outcome the row holds %q, want %q or %q", v, cur, next)
				return r
			}
			ok = v == next
		default:
			r.faults++
			time.Sleep(10 * time.Millisecond) // the server is down: do not spin
		}
		if ok {
			r.value++
			commits.Add(1)
		}
	}
}

func readUntilAnswered(ctx context.Context, s runlease.Store, key string) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, _, err := s.MetaGet(ctx, key)
		if err == nil || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Code sharing the pool may drop the store's prepared statements (DEALLOCATE,
// DISCARD ALL). A call that finds one missing was rolled back by the server,
// so it goes out again and lands once; a connection where that keeps
// happening stops preparing.
func TestPostgresStatementsDroppedByOtherCode(t *testing.T) {
	t.Parallel()
	pool := oneConnPool(t)
	s := pgStore(t, pool)
	prepared := func(like string) []string {
		rows, err := pool.Query(t.Context(), "SELECT name FROM pg_prepared_statements WHERE statement LIKE $1", pgx.QueryExecModeExec, like)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}

	require.True(t, mustCAS(t, s, "k", nil, "v1"))
	require.True(t, mustCAS(t, s, "k", strptr("v1"), "v2"))
	// Drop only the update: the isolation pin before it runs, then the
	// update's Bind fails, and the whole call is rolled back.
	updates := prepared("UPDATE %")
	require.NotEmpty(t, updates)
	for _, n := range updates {
		_, err := pool.Exec(t.Context(), "DEALLOCATE "+pgx.Identifier{n}.Sanitize(), pgx.QueryExecModeExec)
		require.NoError(t, err)
	}
	require.True(t, mustCAS(t, s, "k", strptr("v2"), "v3"), "the update went out again")
	require.False(t, mustCAS(t, s, "k", strptr("v2"), "v4"), "and landed once")
	got, _, err := s.MetaGet(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "v3", got)

	// Everything dropped twice more: the third fault on the connection,
	// which then stops preparing.
	for i := range 2 {
		require.NotEmpty(t, prepared("UPDATE %"), "prepared afresh after fault %d", i+1)
		_, err = pool.Exec(t.Context(), "DEALLOCATE ALL", pgx.QueryExecModeExec)
		require.NoError(t, err)
		require.True(t, mustCAS(t, s, "k", strptr(fmt.Sprint("v", 3+i)), fmt.Sprint("v", 4+i)))
	}
	_, err = pool.Exec(t.Context(), "DEALLOCATE ALL", pgx.QueryExecModeExec)
	require.NoError(t, err)
	require.True(t, mustCAS(t, s, "k", strptr("v5"), "v6"))
	assert.Empty(t, prepared("%"), "the connection prepares nothing any more")
	got, _, err = s.MetaGet(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "v6", got)
}

// A table altered within the documented shape while a store runs on it (here
// value's collation) changes the row type of the statements the store has
// prepared; the server then refuses them as stale plans. The store prepares
// them afresh, so the calls on the connections that prepared them keep
// working.
func TestPostgresStatementsPreparedBeforeATableChange(t *testing.T) {
	t.Parallel()
	pool := oneConnPool(t)
	s, table := pgStoreAndTable(t, pool)
	ctx := t.Context()

	l, err := runlease.Acquire(ctx, s, "run1", "A", runlease.WithTTL(5*time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	_, _, err = s.MetaGet(ctx, runlease.LeasePrefix+"run1")
	require.NoError(t, err)
	_, err = s.MetaScan(ctx, runlease.LeasePrefix)
	require.NoError(t, err)

	_, err = pool.Exec(ctx, "ALTER TABLE "+pgtest.Ident(table)+` ALTER COLUMN value TYPE text COLLATE "C"`, pgx.QueryExecModeExec)
	require.NoError(t, err)
	other, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(table), runlease.WithCreateTable(false))
	require.NoError(t, err, "the altered table still fits the store")
	other.Close()

	_, found, err := s.MetaGet(ctx, runlease.LeasePrefix+"run1")
	require.NoError(t, err)
	assert.True(t, found)
	rows, err := s.MetaScan(ctx, runlease.LeasePrefix)
	require.NoError(t, err)
	assert.Len(t, rows, 1)
	l2, err := runlease.Acquire(ctx, s, "run1", "B", runlease.WithTTL(5*time.Second))
	require.NoError(t, err, "acquiring the released run reads its row")
	assert.Equal(t, l.Fence()+1, l2.Fence())
	require.NoError(t, l2.Release(ctx))
}

// oneConnPool returns a pool of one connection, so that every call of a
// store on it uses the connection the one before used; closed when t ends.
func oneConnPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestPostgresLaterUsesOfAStatementStoreValuesExactly: a statement's first
// use on a connection sends its arguments as text; later uses send them in
// the binary form of the types the server gave its parameters (text
// arrays, above all). Values that the text form of an array must quote or
// escape go through MetaCASMany, MetaBatch and MetaCAS on one connection,
// each statement many times, and are read back byte for byte.
func TestPostgresLaterUsesOfAStatementStoreValuesExactly(t *testing.T) {
	t.Parallel()
	s := pgStore(t, oneConnPool(t))
	hostile := []string{
		"", "NULL", "null", `"`, `\`, `\\"`, "{", "}", "{a,b}", "a,b", " lead", "trail ", "\t\n\r",
		`{"holder":"x","fence":1,"until_ms":2}`, "ü日本🙂", "e\u0301", "'; DROP TABLE x; --", "\x01\x1f",
		strings.Repeat("x", runlease.MaxValueLen),
	}
	keys := []string{"bin:a", "bin:{b}", `bin:"c"`, "bin:d,e", `bin:\f`}
	cur := make(map[string]*string)
	// fit cuts a value tagged with a suffix back to the longest allowed.
	fit := func(v string) string { return v[:min(len(v), runlease.MaxValueLen)] }
	// One round already uses each statement once with text arguments and
	// many times more with binary ones; more rounds are for confidence.
	rounds := 3
	if testing.Short() {
		rounds = 1
	}
	for round := range rounds {
		for i, v := range hostile {
			next := fmt.Sprintf("%d.%d|%s", round, i, v)
			// MetaCASMany: every key at once.
			var writes []runlease.CASWrite
			for _, k := range keys {
				writes = append(writes, runlease.CASWrite{Key: k, Expected: cur[k], Value: fit(k + next)})
			}
			swapped, err := s.MetaCASMany(t.Context(), writes)
			require.NoError(t, err)
			for j, k := range keys {
				require.True(t, swapped[j], "round %d value %d key %s", round, i, k)
				cur[k] = strptr(fit(k + next))
			}
			// MetaBatch: one condition, puts of the others.
			ops := []runlease.Op{runlease.Put(keys[0], fit("#0"+v))}
			for _, k := range keys[1:] {
				ops = append(ops, runlease.Put(k, v))
			}
			ok, err := s.MetaBatch(t.Context(), []runlease.Cond{runlease.IfEquals(keys[0], *cur[keys[0]])}, ops)
			require.NoError(t, err)
			require.True(t, ok, "round %d value %d", round, i)
			cur[keys[0]] = strptr(fit("#0" + v))
			for _, k := range keys[1:] {
				cur[k] = strptr(v)
			}
			// MetaCAS of one key.
			require.True(t, mustCAS(t, s, keys[1], cur[keys[1]], fit("#1"+v)))
			cur[keys[1]] = strptr(fit("#1" + v))
			for _, k := range keys {
				got, found, err := s.MetaGet(t.Context(), k)
				require.NoError(t, err)
				require.True(t, found)
				require.Equal(t, *cur[k], got, "round %d value %d key %s", round, i, k)
			}
		}
	}
}
