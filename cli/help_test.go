package cli

import (
	"flag"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

func TestEveryCommandHasHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range commands {
		for _, args := range [][]string{{cmd.name, "--help"}, {cmd.name, "-h"}, {"help", cmd.name}} {
			r := runCLI(t, args...)
			assert.Equal(t, exitOK, r.code, args)
			assert.Regexp(t, `^Usage: runlease `+cmd.name+`( .*)?\n\n`, r.stdout)
			assert.Regexp(t, `(?m)^  --help\s+show this help$`, r.stdout)
			assert.Empty(t, r.stderr)
		}
	}
}

func TestHelpDocumentsExitCodesAndJSONFields(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "peek", "--help")
	for _, re := range []string{`(?m)^  0  held`, `(?m)^  3  free`, `(?m)^  4  absent`, `(?m)^  1  error`, `(?m)^  2  usage`} {
		assert.Regexp(t, re, r.stdout)
	}
	r = runCLI(t, "status", "--help")
	for _, field := range []string{"run_id", "state", "holder", "fence", "until", "expires_in_ms",
		"takeover_possible", "takeover_at", "row", "scope", "used", "limit", "slots[]", "corrupt", "key"} {
		assert.Contains(t, r.stdout, field)
	}
	for _, flag := range []string{"--db PATH", "--postgres DSN", "--table NAME", "--json", "--watch DURATION", "--limit SCOPE=N", "-o, --output FORMAT"} {
		assert.Contains(t, r.stdout, flag)
	}
}

func TestTopLevelUsage(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "help")
	require.Equal(t, exitOK, r.code)
	for _, cmd := range commands {
		assert.Regexp(t, `(?m)^  `+cmd.name+`\s+\S`, r.stdout)
	}
	assert.Contains(t, r.stdout, "3 peek: free")

	r = runCLI(t)
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, "Commands:")

	r = runCLI(t, "frobnicate")
	assert.Equal(t, exitUsage, r.code)
	assert.Equal(t, "runlease: RUN-E001: unknown command \"frobnicate\" (see runlease help)\n", r.stderr)
}

func TestSchemaPrintsTheDDL(t *testing.T) {
	t.Parallel()
	want, err := runlease.PostgresSchema(runlease.DefaultPostgresTable)
	require.NoError(t, err)
	r := runCLI(t, "schema")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Equal(t, want+";\n", r.stdout)

	r = runCLI(t, "schema", "--table", "ops.Leases")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Equal(t, `CREATE TABLE IF NOT EXISTS "ops"."Leases" (key text COLLATE "C" PRIMARY KEY, value text NOT NULL);`+"\n", r.stdout)

	r = runCLI(t, "schema", "--table", "a.b.c")
	assert.Equal(t, exitUsage, r.code)
	assert.Regexp(t, `^runlease: RUN-E001: invalid table`, r.stderr)

	r = runCLI(t, "schema", "extra")
	assert.Equal(t, exitUsage, r.code)
}

func TestTopLevelUsageNamesTheStoreFlags(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "help")
	assert.Contains(t, r.stdout, "\nThe store (status, peek, explain, release, repair, prune, serve):\n")
	for _, flag := range []string{"--db PATH", "--postgres DSN", "--table NAME", "--timeout DURATION"} {
		assert.Contains(t, r.stdout, flag)
	}
	r = runCLI(t, "status", "--help")
	assert.Regexp(t, `(?m)^  --timeout DURATION\s+give up on the store after DURATION .*\(default 10s\)$`, r.stdout)
}

func TestStatusHelpDocumentsFiltersAndTheCorruptStatus(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "status", "--help")
	for _, s := range []string{"--state STATE", "--run PREFIX", "--max N", "exits with status 5", "  table ", "  omitted "} {
		assert.Contains(t, r.stdout, s)
	}
	r = runCLI(t, "help")
	assert.Contains(t, r.stdout, "5 status: it shows a\ncorrupt row")
}

// placeholder is how a flag's help names its value: upper case, as
// RUN, SCOPE=N, HOST:PORT.
var placeholder = regexp.MustCompile(`^[A-Z][A-Z0-9]*(?:[:=][A-Z][A-Z0-9]*)?$`)

func TestHelpNamesValuesInUpperCaseAndAlikeAcrossCommands(t *testing.T) {
	t.Parallel()
	c := newCLI(t.Context(), strings.NewReader(""), io.Discard, io.Discard)
	byFlag := map[string]string{}
	for _, cmd := range commands {
		fs := c.flagSets()[cmd.name]
		for _, word := range strings.Fields(fs.usage) {
			if !strings.HasPrefix(strings.TrimLeft(word, "["), "-") && word != "[flags]" && word != "|" {
				assert.Regexp(t, placeholder, strings.Trim(word, "[]"), "the usage line of %s", cmd.name)
			}
		}
		fs.VisitAll(func(f *flag.Flag) {
			name, _ := flag.UnquoteUsage(f)
			if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool || fs.Lookup("output") != nil && f.Name == "o" {
				return
			}
			assert.Regexp(t, placeholder, name, "%s --%s", cmd.name, f.Name)
			if prev, ok := byFlag[f.Name]; ok {
				assert.Equal(t, prev, name, "%s --%s names its value as other commands do", cmd.name, f.Name)
			}
			byFlag[f.Name] = name
		})
	}
	assert.Equal(t, "SCOPE=N", byFlag["limit"])
}

func TestHelpShowsNoDefaultForARequiredFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ cmd, flag string }{
		{"repair", "--fence N"}, {"prune", "--older-than DURATION"}, {"release", "--force"},
	} {
		r := runCLI(t, tc.cmd, "--help")
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.Regexp(t, `(?m)^  `+tc.flag+`\s+required\b.*[^)]$`, r.stdout, tc.cmd)
	}
	// Nor a zero value that means "not given".
	r := runCLI(t, "status", "--help")
	assert.Regexp(t, `(?m)^  --max N\s+.*\(0: all\)$`, r.stdout)
	r = runCLI(t, "explain", "--help")
	assert.Regexp(t, `(?m)^  --priority N\s+.*WithPriority$`, r.stdout)
	assert.Regexp(t, `(?m)^  --weight N\s+.*\(default 1\)$`, r.stdout)
}
