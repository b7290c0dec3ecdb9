package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/systest"
	"github.com/areev/runlease/internal/testkit"
)

const testPassword = "Sup3rSecretPw"

func TestADSNThatDoesNotParseSaysWhichPartIsWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, dsn, says string }{
		{"a_port_out_of_range", "postgres://u:" + testPassword + "@h:99999/db", "invalid port"},
		{"a_port_that_is_no_number", "host=h port=abc password=" + testPassword, "invalid port"},
		{"a_bad_escape_in_the_password", "postgres://u:" + testPassword + "%zz@h/db", "invalid percent-encoded token in password"},
		{"a_word_without_a_value", "host=h " + testPassword + " dbname=d", "failed to parse as keyword/value"},
		{"no_DSN_at_all", "not a dsn", "neither a SQLite path nor a Postgres DSN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, "status", "--postgres", tc.dsn)
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Regexp(t, `^runlease: RUN-E001: `, r.stderr)
			assert.Contains(t, r.stderr, tc.says)
			assert.NotContains(t, r.stderr, testPassword[3:10])
			assert.NotContains(t, r.stderr, "withheld")
		})
	}
}

func TestASilentServerTimesOutNamingItsHostAndPort(t *testing.T) {
	t.Parallel()
	addr := testkit.SilentServer(t)
	start := time.Now()
	r := runCLI(t, "status", "--timeout", "300ms", "--postgres", "postgres://u:"+testPassword+"@"+addr+"/db?sslmode=disable")
	assert.Less(t, time.Since(start), 5*time.Second, "--timeout bounds the wait")
	assert.Equal(t, exitError, r.code, r.stderr)
	assert.Regexp(t, `^runlease: RUN-E011: no answer in time from Postgres at postgres://u@`+addr+`/db: `, r.stderr)
	assert.Contains(t, r.stderr, "runlease: hint: nothing answered within --timeout 300ms")
	assert.NotContains(t, r.stderr, testPassword)
}

func TestTheTimeoutMustBePositive(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "peek", "r1", "--timeout", "0s", "--db", newDB(t))
	assert.Equal(t, exitUsage, r.code, r.stderr)
	assert.Contains(t, r.stderr, "--timeout 0s: give a positive duration")
}

func TestARefusedConnectionIsToldOnce(t *testing.T) {
	t.Parallel()
	addr := testkit.RefusedAddr(t)
	// sslmode defaults to prefer, so pgx dials twice: with and without TLS.
	r := runCLI(t, "peek", "r1", "--postgres", "postgres://u:"+testPassword+"@"+addr+"/db")
	assert.Equal(t, exitError, r.code, r.stderr)
	assert.Regexp(t, `^runlease: RUN-E011: cannot open Postgres at postgres://u@`+addr+`/db: `, r.stderr)
	assert.Equal(t, 1, strings.Count(r.stderr, "connection refused"), r.stderr)
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"), r.stderr)
}

func TestAFileThatIsNotADatabaseIsToldSo(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "notes.txt")
	require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("not a database\n", 100)), 0o600))
	for _, args := range [][]string{
		{"status", "--db", path},
		{"release", "r1", "--force", "--yes", "--db", path},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, exitError, r.code, r.stderr)
		assert.Contains(t, r.stderr, "is not a SQLite database, so not a runlease store", args[0])
		assert.NotContains(t, r.stderr, "not applied", args[0])
	}
}

func TestPostgresFlagsThatContradictEachOtherAreUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"an_embedded_target_for_postgres", []string{"status", "--postgres", "sqlite:runs.db"}, "--postgres wants a postgres:// URL"},
		{"two_tables", []string{"status", "--postgres", "postgres://u@h/db?table=a", "--table", "b"}, "name two tables"},
		{"a_bad_table_in_the_DSN", []string{"status", "--postgres", "postgres://u@h/db?table=a.b.c"}, "3 dot-separated parts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, tc.args...)
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Contains(t, r.stderr, tc.says)
		})
	}
}

func TestTheTimeoutDoesNotBoundTheOperatorsAnswer(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	path := newDB(t)
	pr, pw := io.Pipe()
	go func() {
		// Longer than --timeout, which is long enough that a loaded
		// machine's sync to disk never takes it.
		time.Sleep(3 * time.Second)
		pw.Write([]byte("y\n"))
		pw.Close()
	}()
	r := session{stdin: pr, tty: true}.run(t, "release", runExpired, "--force", "--timeout", "1500ms", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "released run "+runExpired)
	assert.True(t, peekRow(t, openDB(t, path), runExpired).Released)
}
