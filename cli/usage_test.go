package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEveryInvalidArgumentExitsWithTheUsageStatus(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"an_empty_run_id", []string{"peek", "", "--db", path}},
		{"an_empty_run_id_in_json", []string{"peek", "--json", "", "--db", path}},
		{"a_run_id_with_NUL", []string{"peek", "a\x00b", "--db", path}},
		{"a_DSN_pgx_cannot_parse_for_status", []string{"status", "--postgres", "not a dsn"}},
		{"a_DSN_pgx_cannot_parse_for_peek", []string{"peek", "r1", "--postgres", "not a dsn"}},
		{"a_DSN_pgx_cannot_parse_for_release", []string{"release", "r1", "--force", "--yes", "--postgres", "not a dsn"}},
		{"a_DSN_pgx_cannot_parse_for_prune", []string{"prune", "--older-than", "1h", "--postgres", "not a dsn"}},
		{"a_table_of_three_parts", []string{"schema", "--table", "a.b.c"}},
		{"a_bad_table_for_a_store", []string{"status", "--postgres", "postgres://u@127.0.0.1:1/d", "--table", "a.b.c"}},
		{"releasing_a_run_without_a_row", []string{"release", "nosuch", "--force", "--db", path}},
		{"a_scope_with_an_underscore", []string{"status", "--db", path, "--limit", "bad_scope=2"}},
		{"a_scope_with_a_colon", []string{"status", "--db", path, "--limit", "a:b=2"}},
		{"a_scope_with_a_percent", []string{"status", "--db", path, "--limit", "a%=2"}},
		{"an_empty_principal", []string{"status", "--db", path, "--limit", "principal:=2"}},
		{"a_scope_name_too_long", []string{"status", "--db", path, "--limit", strings.Repeat("a", 129) + "=2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, tc.args...)
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Regexp(t, `^runlease: RUN-E001: `, r.stderr)
		})
	}
}

func TestLimitsAcceptEveryScopeDriversCanClaim(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "status", "--db", path, "--json", "--limit", "mem=4", "--limit", "a/b.c-D9=2",
		"--limit", "principal:al:ice é=1", "--limit", "principal:alice=3")
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	doc := decodeStatus(t, r.stdout)
	assert.Equal(t, 2, *doc.scope(t, "a/b.c-D9").Limit)
	assert.Equal(t, 1, *doc.scope(t, "principal:al:ice é").Limit)
	assert.Equal(t, 3, *doc.scope(t, "principal:alice").Limit)
}

func TestPeekOfAnAbsentRunSaysTakeoverIsPossibleNow(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "peek", "never-acquired", "--db", path)
	require.Equal(t, exitAbsent, r.code, r.stderr)
	assert.Regexp(t, `(?m)^takeover\s+now: no lease$`, r.stdout)

	r = runCLI(t, "peek", "never-acquired", "--db", path, "--json")
	require.Equal(t, exitAbsent, r.code, r.stderr)
	var doc peekJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
	assert.Equal(t, stateAbsent, doc.State)
	assert.True(t, doc.TakeoverPossible, "as the text says: takeover now")
	assert.Nil(t, doc.TakeoverAt, "no lease to take over from")
}
