package cli

import (
	"net/url"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// trickyDSNs spell passwords in ways a pattern over the DSN's text misses:
// pgx reads an unquoted key=value password up to the next space, decodes
// percent-encoded query keys and values, and reads quoted values with
// escapes and spaces around '='.
var trickyDSNs = []struct{ name, dsn, password string }{
	{"an_unquoted_password_with_an_ampersand", "host=127.0.0.1 port=1 user=root password=abc&Tail1secret dbname=test", "abc&Tail1secret"},
	{"a_percent_encoded_query_key", "postgres://root@127.0.0.1:1/test?pass%77ord=Tail4secret", "Tail4secret"},
	{"a_percent_encoded_query_value", "postgres://root@127.0.0.1:1/test?password=Tail%35secret", "Tail5secret"},
	{"a_quoted_password_with_spaces_and_a_quote", `host=127.0.0.1 port=1 user=root password = 'a b\' Tail6secret' dbname=test`, `a b' Tail6secret`},
	{"a_userinfo_password_with_an_encoded_at", "postgres://root:Tail7%40secret@127.0.0.1:1/test", "Tail7@secret"},
	{"a_userinfo_password_with_a_slash", "postgres://root:Tail8/secret@127.0.0.1:1/test", "Tail8/secret"},
	{"a_password_in_two_places", "postgres://root:Tail9secret@127.0.0.1:1/test?password=Tail9secret", "Tail9secret"},
	{"a_password_that_is_also_the_user", "host=127.0.0.1 port=1 user=Tail10secret password=Tail10secret dbname=test", "Tail10secret"},
}

func TestPostgresNameComesFromTheParsedDSN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, dsn, table, want string }{
		{"a_URL", "postgres://root:pw@db.example:5433/runs?sslmode=disable", runlease.DefaultPostgresTable, "postgres://root@db.example:5433/runs"},
		{"key_value_pairs", "host=db.example port=5433 user=root password=pw dbname=runs sslmode=disable", "ops.leases", "postgres://root@db.example:5433/runs table ops.leases"},
		{"several_hosts", "host=a.example,b.example port=1,2 user=u dbname=d sslmode=disable", runlease.DefaultPostgresTable, "postgres://u@a.example:1,b.example:2/d"},
		{"a_socket_directory", "host=/var/run/postgresql port=5432 user=u dbname=d", runlease.DefaultPostgresTable, "postgres://u@%2Fvar%2Frun%2Fpostgresql:5432/d"},
		{"an_IPv6_host", "postgres://u@[::1]:5432/d?sslmode=disable", runlease.DefaultPostgresTable, "postgres://u@[::1]:5432/d"},
		{"a_user_that_needs_escaping", "host=h port=1 user=a@b dbname=d sslmode=disable", runlease.DefaultPostgresTable, "postgres://a%40b@h:1/d"},
		{"a_DSN_pgx_cannot_parse", "not a dsn", runlease.DefaultPostgresTable, "postgres (the DSN does not parse)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, postgresName(tc.dsn, tc.table))
		})
	}
	for _, tc := range trickyDSNs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := postgresName(tc.dsn, runlease.DefaultPostgresTable)
			assert.NotContains(t, name, tc.password)
			assert.NotContains(t, name, "Tail")
		})
	}
}

func TestTrickyDSNPasswordsAreNeverPrinted(t *testing.T) {
	t.Parallel()
	commands := [][]string{
		{"status"},
		{"status", "--json"},
		{"peek", "r1"},
		{"release", "r1", "--force", "--yes"},
		{"prune", "--older-than", "1h", "--yes"},
	}
	for _, tc := range trickyDSNs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, args := range commands {
				r := runCLI(t, append(args, "--postgres", tc.dsn)...)
				assert.NotEqual(t, exitOK, r.code, args)
				assert.NotContains(t, r.stdout+r.stderr, tc.password, args)
				assert.NotContains(t, r.stdout+r.stderr, "secret", args)

				r = runCLI(t, append(args, tc.dsn)...) // a usage error quotes the DSN
				assert.Equal(t, exitUsage, r.code, args)
				assert.NotContains(t, r.stdout+r.stderr, tc.password, "in the wrong place: %v", args)
				assert.NotContains(t, r.stdout+r.stderr, "secret", "in the wrong place: %v", args)

				r = session{env: map[string]string{envPostgres: tc.dsn}}.run(t, args...)
				assert.NotContains(t, r.stdout+r.stderr, tc.password, "from $RUNLEASE_POSTGRES: %v", args)
				assert.NotContains(t, r.stdout+r.stderr, "secret", "from $RUNLEASE_POSTGRES: %v", args)
			}
		})
	}
}

// TestPostgresStoreNamesNeverHoldThePassword opens a real store through
// DSNs that spell a password in tricky ways (the test server trusts its
// clients and ignores it) and reads every name the commands print.
func TestPostgresStoreNamesNeverHoldThePassword(t *testing.T) {
	t.Parallel()
	base, table, s := newPGStore(t)
	seed(t, s)
	cfg, err := pgconn.ParseConfig(base)
	require.NoError(t, err)
	want := postgresName(base, table)
	u := url.URL{Scheme: "postgres", User: url.User(cfg.User), Host: cfg.Host + ":" + strconv.Itoa(int(cfg.Port)), Path: "/" + cfg.Database}
	kv := "host=" + cfg.Host + " port=" + strconv.Itoa(int(cfg.Port)) + " user=" + cfg.User + " dbname=" + cfg.Database + " sslmode=disable"
	for _, tc := range []struct{ name, dsn, password string }{
		{"an_unquoted_password_with_an_ampersand", kv + " password=abc&Tail1secret", "Tail1secret"},
		{"a_percent_encoded_query_key", u.String() + "?sslmode=disable&pass%77ord=Tail4secret", "Tail4secret"},
		{"a_quoted_password", kv + ` password = 'a b\' Tail6secret'`, "Tail6secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pg := []string{"--postgres", tc.dsn, "--table", table}
			r := runCLI(t, append([]string{"status", "--json"}, pg...)...)
			require.Equal(t, exitCorrupt, r.code, r.stderr)
			assert.Equal(t, want, decodeStatus(t, r.stdout).Store)
			for _, args := range [][]string{
				{"status"},
				{"release", "never-acquired", "--force", "--yes"},
				{"prune", "--older-than", "100d", "--dry-run"},
			} {
				r := runCLI(t, append(args, pg...)...)
				assert.NotContains(t, r.stdout+r.stderr, tc.password, args)
				assert.NotContains(t, r.stdout+r.stderr, "secret", args)
			}
			r = session{env: map[string]string{envPostgres: tc.dsn}}.run(t, "prune", "--older-than", "100d", "--dry-run", "--table", table)
			assert.Contains(t, r.stdout, "nothing in "+want+" ended", r.stderr)
			assert.NotContains(t, r.stdout+r.stderr, tc.password)
		})
	}
}
