package runlease_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/testkit"
)

func TestParseTargetReadsEveryForm(t *testing.T) {
	t.Parallel()
	pg := func(dsn, table string, create bool) runlease.Target {
		return runlease.Target{Kind: runlease.TargetPostgres, DSN: dsn, Table: table, CreateTable: create}
	}
	def := runlease.DefaultPostgresTable
	for _, tc := range []struct {
		name, target string
		want         runlease.Target
	}{
		{"sqlite_path", "sqlite:runs.db", runlease.Target{Kind: runlease.TargetSQLite, Path: "runs.db"}},
		{"sqlite_absolute_path", "sqlite:/var/lib/r u n s.db", runlease.Target{Kind: runlease.TargetSQLite, Path: "/var/lib/r u n s.db"}},
		{"sqlite_path_is_not_decoded", "sqlite:a%20b.db", runlease.Target{Kind: runlease.TargetSQLite, Path: "a%20b.db"}},
		{"sqlite_memory", "sqlite::memory:", runlease.Target{Kind: runlease.TargetSQLite, Path: ":memory:"}},
		{"sqlite_read_only", "sqlite:runs.db?mode=ro", runlease.Target{Kind: runlease.TargetSQLite, Path: "runs.db", ReadOnly: true}},
		{"sqlite_read_write", "sqlite:runs.db?mode=rwc", runlease.Target{Kind: runlease.TargetSQLite, Path: "runs.db"}},
		{"file_uri_is_decoded", "file:a%20b.db?mode=ro", runlease.Target{Kind: runlease.TargetSQLite, Path: "a b.db", ReadOnly: true}},
		{"file_uri_with_empty_authority", "file:///var/runs.db", runlease.Target{Kind: runlease.TargetSQLite, Path: "/var/runs.db"}},
		{"file_uri_on_localhost", "file://localhost/var/runs.db", runlease.Target{Kind: runlease.TargetSQLite, Path: "/var/runs.db"}},
		{"postgres_url", "postgres://u:pw@h:5433/db", pg("postgres://u:pw@h:5433/db", def, true)},
		{"postgresql_url", "postgresql://u@h/db?sslmode=disable", pg("postgresql://u@h/db?sslmode=disable", def, true)},
		{"url_table_taken_out", "postgres://u@h/db?sslmode=disable&table=ops.leases&application_name=x",
			pg("postgres://u@h/db?sslmode=disable&application_name=x", "ops.leases", true)},
		{"url_table_escaped", "postgres://u@h/db?table=My%20Leases", pg("postgres://u@h/db", "My Leases", true)},
		{"url_create_table_false", "postgres://u@h/db?create_table=false&table=t", pg("postgres://u@h/db", "t", false)},
		{"key_value", "host=h dbname=d", pg("host=h dbname=d", def, true)},
		{"key_value_table_taken_out", "host=h table=leases dbname=d", pg("host=h dbname=d", "leases", true)},
		{"key_value_quoted_table", `host=h  table = 'my \'t\'' password='a b' create_table=0`,
			pg(`host=h password='a b'`, "my 't'", false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := runlease.ParseTarget(tc.target)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestParseTargetRefusesWhatItCannotOpen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, target, says string
	}{
		{"empty", "", "empty"},
		{"plain_text", "not a dsn", "neither a SQLite path nor a Postgres DSN"},
		{"a_bare_path", "runs.db", "neither a SQLite path nor a Postgres DSN"},
		{"another_scheme", "mysql://u@h/d", `scheme "mysql" is not a built-in store`},
		{"sqlite_without_path", "sqlite:", "no PATH"},
		{"sqlite_unknown_parameter", "sqlite:r.db?cache=shared", `unknown parameter "cache"`},
		{"sqlite_mode_rw", "sqlite:r.db?mode=rw", `mode="rw"`},
		{"sqlite_mode_twice", "sqlite:r.db?mode=ro&mode=ro", "mode given 2 times"},
		{"file_on_a_remote_host", "file://db.example/r.db", `names host "db.example"`},
		{"bad_table", "postgres://u@h/db?table=a.b.c", `"a.b.c" has 3 dot-separated parts`},
		{"table_twice", "host=h table=a table=b", "table given twice"},
		{"bad_create_table", "postgres://u@h/db?create_table=maybe", `create_table="maybe"`},
		{"bad_port", "postgres://u@h:99999/db", "does not parse: invalid port"},
		{"bad_port_key_value", "host=h port=abc", "does not parse: invalid port"},
		{"missing_equals", "host=h oops dbname=d", "failed to parse as keyword/value"},
		{"bad_pool_setting", "postgres://u@h/db?pool_max_conns=many", "cannot parse pool_max_conns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := runlease.ParseTarget(tc.target)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			assert.Equal(t, runlease.CodeInvalidArgument, runlease.Code(err))
			assert.Contains(t, err.Error(), tc.says)
			assert.True(t, strings.HasPrefix(err.Error(), "RUN-E001: "), err.Error())
		})
	}
}

func TestADSNThatDoesNotParseIsToldWithoutItsPassword(t *testing.T) {
	t.Parallel()
	const pw = "Sup3rSecretPw"
	for _, tc := range []struct{ name, dsn string }{
		{"url_bad_port", "postgres://u:" + pw + "@h:99999/db"},
		{"url_port_after_a_colon_in_the_password", "postgres://u:" + pw + ":x@h:5432:1/db"},
		{"url_bad_escape_in_the_password", "postgres://u:" + pw + "%zz@h/db"},
		{"url_password_parameter", "postgres://u@h/db?password=" + pw + "&pool_max_conns=x"},
		{"key_value_bad_port", "host=h port=abc password=" + pw},
		{"key_value_quoted", "host=h port=abc password='" + pw + " x'"},
		{"key_value_password_without_key", "host=h " + pw + " dbname=d"},
		{"key_value_unterminated_quote", "host=h password='" + pw},
		{"url_sslmode", "postgres://u:" + pw + "@h/db?sslmode=" + pw},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := runlease.ParseTarget(tc.dsn)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			assert.NotContains(t, err.Error(), pw[3:10])
			assert.Contains(t, err.Error(), "the Postgres DSN does not parse: ")
			var pe *pgconn.ParseConfigError
			assert.ErrorAs(t, err, &pe, "pgx's error stays reachable")

			_, err = runlease.OpenPostgres(t.Context(), tc.dsn)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument, "OpenPostgres reads DSNs as Open does")
			assert.NotContains(t, err.Error(), pw[3:10])
			assert.Contains(t, err.Error(), "pgx cannot parse it: ")
			assert.NotContains(t, err.Error(), "withheld", "it says which part is wrong")
			assert.ErrorAs(t, err, &pe)
		})
	}
}

func TestTargetStringNamesTheStoreWithoutAPassword(t *testing.T) {
	t.Parallel()
	tg, err := runlease.ParseTarget("postgres://ann:s3cr3tpw@db1:5433,db2/app?table=ops.leases&sslmode=disable")
	require.NoError(t, err)
	assert.Equal(t, "postgres://ann@db1:5433,db2:5432/app?table=ops.leases", tg.String())
	tg, err = runlease.ParseTarget("sqlite:runs.db?mode=ro")
	require.NoError(t, err)
	assert.Equal(t, "sqlite:runs.db", tg.String())
}

func TestOpenOpensAnEmbeddedStoreThatCloses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := runlease.Open(t.Context(), "sqlite:"+path)
	require.NoError(t, err)
	ok, err := s.MetaCAS(t.Context(), "k", nil, "v")
	require.NoError(t, err)
	require.True(t, ok)

	_, err = runlease.Open(t.Context(), "sqlite:"+path)
	require.ErrorIs(t, err, runlease.ErrStoreLocked, "the writer holds the file until Close")
	ro, err := runlease.Open(t.Context(), "file:"+path+"?mode=ro")
	require.NoError(t, err, "a read-only open needs no writer lock")
	v, found, err := ro.MetaGet(t.Context(), "k")
	require.NoError(t, err)
	assert.True(t, found)
	assert.Equal(t, "v", v)
	_, err = ro.MetaCAS(t.Context(), "k2", nil, "v")
	assert.ErrorIs(t, err, runlease.ErrInvalidArgument, "read-only refuses writes")
	require.NoError(t, ro.Close())

	require.NoError(t, s.Close())
	_, _, err = s.MetaGet(t.Context(), "k")
	assert.ErrorIs(t, err, runlease.ErrStoreClosed)
	s, err = runlease.Open(t.Context(), "sqlite:"+path)
	require.NoError(t, err, "Close gave the writer lock back")
	require.NoError(t, s.Close())
}

func TestOpenOfAnEndedContextOpensNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	path := filepath.Join(t.TempDir(), "runs.db")
	_, err := runlease.Open(ctx, "sqlite:"+path)
	require.ErrorIs(t, err, context.Canceled)
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestOpenSaysAFileIsNotADatabase(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "notes.txt")
	require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("not a database\n", 100)), 0o600))
	for _, target := range []string{"sqlite:" + path, "sqlite:" + path + "?mode=ro"} {
		_, err := runlease.Open(t.Context(), target)
		require.ErrorIs(t, err, runlease.ErrStorage)
		assert.Equal(t, runlease.CodeStorage, runlease.Code(err))
		assert.Contains(t, err.Error(), "is not a SQLite database, so not a runlease store")
		assert.NotContains(t, err.Error(), "not applied")
	}
}

func TestOpenReadOnlySaysASQLiteFileIsNotARunleaseStore(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "other.db")
	// SQLite reads an empty file as a database without tables.
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, err := runlease.Open(t.Context(), "sqlite:"+path+"?mode=ro")
	require.ErrorIs(t, err, runlease.ErrStorage)
	assert.Contains(t, err.Error(), "is a SQLite database but not a runlease store")
}

func TestOpenOfASilentServerNamesItsHostAndPort(t *testing.T) {
	t.Parallel()
	addr := testkit.SilentServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := runlease.Open(ctx, "postgres://u:pw123456@"+addr+"/db?sslmode=disable")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, runlease.ErrStorage)
	assert.Contains(t, err.Error(), "no answer in time from Postgres at postgres://u@"+addr+"/db")
	assert.NotContains(t, err.Error(), "pw123456")
}

func TestOpenOfARefusedPortSaysSoOnce(t *testing.T) {
	t.Parallel()
	addr := testkit.RefusedAddr(t)
	// sslmode defaults to prefer: pgx dials twice, with and without TLS.
	_, err := runlease.Open(t.Context(), "postgres://u:pw123456@"+addr+"/db")
	require.ErrorIs(t, err, runlease.ErrStorage)
	msg := err.Error()
	assert.Contains(t, msg, "cannot open Postgres at postgres://u@"+addr+"/db")
	assert.Equal(t, 1, strings.Count(msg, "connection refused"), msg)
	assert.NotContains(t, msg, "\n")
	assert.NotContains(t, msg, "pw123456")
}

func TestOpenOpensAPostgresStoreOnTheTargetsTable(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	dsn := pgtest.DSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	_, err := runlease.Open(t.Context(), dsn+sep+"table="+table+"&create_table=false")
	require.ErrorIs(t, err, runlease.ErrSchemaMismatch, "create_table=false leaves a missing table missing")

	s, err := runlease.Open(t.Context(), dsn+sep+"table="+table)
	require.NoError(t, err)
	pg, ok := s.(*runlease.PostgresStore)
	require.True(t, ok)
	assert.Equal(t, table, pg.Table())
	ok, err = s.MetaCAS(t.Context(), "k", nil, "v")
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, s.Close())
	_, _, err = s.MetaGet(t.Context(), "k")
	assert.ErrorIs(t, err, runlease.ErrStoreClosed)

	s, err = runlease.Open(t.Context(), dsn+sep+"table="+table+"&create_table=false")
	require.NoError(t, err, "the table now exists")
	v, found, err := s.MetaGet(t.Context(), "k")
	require.NoError(t, err)
	assert.True(t, found)
	assert.Equal(t, "v", v)
	require.NoError(t, s.Close())
}

// ExampleOpen opens the store a configuration string names; the same code
// opens "postgres://app@db/app?table=leases" in production.
func ExampleOpen() {
	ctx := context.Background()
	store, err := runlease.Open(ctx, "sqlite::memory:")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	lease, err := runlease.Acquire(ctx, store, "nightly-report", "reports#node-a")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("fence", lease.Fence())

	_, err = runlease.Open(ctx, "postgres://app:hunter2secret@db:99999/app")
	fmt.Println(err)
	// Output:
	// fence 1
	// RUN-E001: invalid target: the Postgres DSN does not parse: invalid port; want sqlite:PATH, file:PATH[?mode=ro], postgres://USER@HOST:PORT/DATABASE[?table=NAME], or key=value pairs such as "host=H dbname=D table=NAME"
}
