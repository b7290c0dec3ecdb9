package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// timeless decodes a JSON document and drops what depends on the instant
// it was printed at, so that two printings of the same rows compare equal.
func timeless(t *testing.T, out string) any {
	t.Helper()
	var doc any
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	var strip func(v any)
	strip = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			delete(v, "now")
			delete(v, "expires_in_ms")
			for _, e := range v {
				strip(e)
			}
		case []any:
			for _, e := range v {
				strip(e)
			}
		}
	}
	strip(doc)
	return doc
}

func TestOutputFlagChoosesTextOrJSONOnEveryCommandWithJSON(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"status", []string{"status", "--db", path, "--limit", "mem=4"}, exitCorrupt},
		{"peek", []string{"peek", runLive, "--db", path}, exitHeld},
		{"explain", []string{"explain", "r9", "--db", path, "--limit", "mem=4"}, exitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want := runCLI(t, append(tc.args, "--json")...)
			require.Equal(t, tc.code, want.code, want.stderr)
			for _, flags := range [][]string{{"-o", "json"}, {"--output", "json"}, {"-o=json"}, {"--output=json"},
				{"-o", "text", "--json"}, {"--json", "-o", "json"}} {
				r := runCLI(t, append(tc.args, flags...)...)
				require.Equal(t, tc.code, r.code, flags, r.stderr)
				assert.Equal(t, timeless(t, want.stdout), timeless(t, r.stdout), flags)
			}
			text := runCLI(t, tc.args...)
			require.Equal(t, tc.code, text.code, text.stderr)
			require.False(t, json.Valid([]byte(text.stdout)), text.stdout)
			for _, flags := range [][]string{{"-o", "text"}, {"--output", "text"}, {"--json", "-o", "text"}} {
				r := runCLI(t, append(tc.args, flags...)...)
				require.Equal(t, tc.code, r.code, flags, r.stderr)
				assert.Equal(t, firstLine(text.stdout), firstLine(r.stdout), flags)
				assert.False(t, json.Valid([]byte(r.stdout)), flags)
			}
		})
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func TestOutputFlagRefusesAnyOtherFormat(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, args := range [][]string{
		{"status", "--db", path, "-o", "yaml"},
		{"peek", runLive, "--db", path, "--output", "JSON"},
		{"explain", "r9", "--db", path, "--limit", "mem=4", "-o", ""},
		{"status", "--db", path, "-o"},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, exitUsage, r.code, args)
		assert.Regexp(t, `^runlease: RUN-E001: `+args[0]+`: .*flag.* -o`, r.stderr, args)
		assert.Empty(t, r.stdout, args)
	}
	r := runCLI(t, "status", "--db", path, "--output", "yaml")
	assert.Equal(t, "runlease: RUN-E001: status: invalid value \"yaml\" for flag -output: want text or json "+
		"(see runlease status --help)\n", r.stderr)
}

func TestOutputFlagIsInTheHelpOfEveryCommandWithJSON(t *testing.T) {
	t.Parallel()
	for _, cmd := range commands {
		r := runCLI(t, cmd.name, "--help")
		require.Equal(t, exitOK, r.code, r.stderr)
		hasJSON := strings.Contains(r.stdout, "\n  --json ")
		hasOutput := strings.Contains(r.stdout, "\n  -o, --output FORMAT ")
		assert.Equal(t, hasJSON, hasOutput, cmd.name)
		if hasOutput {
			assert.Regexp(t, `(?m)^  -o, --output FORMAT\s+print the output as FORMAT: text or json \(default text\)$`, r.stdout)
			assert.NotContains(t, r.stdout, "  --o ", cmd.name)
		}
	}
}
