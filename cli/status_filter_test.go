package cli

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runIDs returns the run ids of doc's leases, in order.
func runIDs(doc statusDoc) []string {
	var out []string
	for _, l := range doc.Leases {
		out = append(out, l.RunID)
	}
	return out
}

func TestStatusFiltersLeasesByStateRunPrefixAndCount(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string
		omitted int
		code    int
	}{
		{"every_lease", nil, []string{runCorrupt, runExpired, runLive, runReleased}, 0, exitCorrupt},
		{"one_state", []string{"--state", "live"}, []string{runLive}, 0, exitOK},
		{"states_by_comma", []string{"--state", "expired,released"}, []string{runExpired, runReleased}, 0, exitOK},
		{"states_repeated", []string{"--state", "expired", "--state", "corrupt"}, []string{runCorrupt, runExpired}, 0, exitCorrupt},
		{"run_prefix", []string{"--run", "re"}, []string{runReleased}, 0, exitOK},
		{"run_prefix_and_state", []string{"--run", "l", "--state", "expired"}, nil, 0, exitOK},
		{"max", []string{"--max", "2"}, []string{runCorrupt, runExpired}, 2, exitCorrupt},
		{"max_after_filters", []string{"--max", "1", "--state", "live,released"}, []string{runLive}, 1, exitOK},
		{"max_above_the_count", []string{"--max", "9", "--state", "live"}, []string{runLive}, 0, exitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, append([]string{"status", "--json", "--db", path}, tc.args...)...)
			require.Equal(t, tc.code, r.code, r.stderr)
			doc := decodeStatus(t, r.stdout)
			assert.Equal(t, tc.want, runIDs(doc))
			assert.Equal(t, tc.omitted, doc.Omitted)
			assert.Len(t, doc.Scopes, 2, "filters choose leases; scopes are shown whole")
		})
	}
}

func TestStatusTextSaysWhatTheFiltersLeftOut(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "status", "--db", path, "--max", "1", "--state", "live,released")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, `(?m)^`+runLive+`\s`, r.stdout)
	assert.NotContains(t, r.stdout, runReleased)
	assert.Contains(t, r.stdout, "… and 1 more lease, beyond --max\n")

	r = runCLI(t, "status", "--db", path, "--run", "nosuch")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "no leases match --state and --run\n")
}

func TestStatusFilterUsageErrors(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"unknown_state", []string{"--state", "held"}, `got "held"`},
		{"empty_state", []string{"--state", "live,"}, `got ""`},
		{"negative_max", []string{"--max", "-1"}, "--max -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, append([]string{"status", "--db", path}, tc.args...)...)
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Contains(t, r.stderr, tc.says)
		})
	}
}

func TestStatusExitsWithItsOwnStatusWhenItShowsACorruptRow(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "status", "--db", path, "--json")
	assert.Equal(t, exitCorrupt, r.code)
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"), r.stderr)
	assert.Contains(t, r.stderr, `runlease: warning: 1 corrupt row (lease of "corrupt-run"): `)
	decodeStatus(t, r.stdout) // the report is printed in full

	r = runCLI(t, "status", "--db", path, "--state", "live")
	assert.Equal(t, exitOK, r.code, "no corrupt row is shown: %s", r.stderr)
	assert.Empty(t, r.stderr)
}

func TestStatusJSONNamesTheTableInItsOwnField(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "status", "--json", "--db", newDB(t))
	doc := decodeStatus(t, r.stdout)
	assert.Nil(t, doc.Table, "the embedded store has no table name")
	assert.Contains(t, r.stdout, `"table": null`)
}

func TestPruneDryRunWithNothingToPruneIsOneLine(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "prune", "--older-than", "300d", "--dry-run", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Equal(t, "nothing in sqlite:"+path+" ended more than 7200h0m0s ago; nothing to prune\n", r.stdout)
}

func TestVersionPrintsTheModuleVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{"a_released_module", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"}}, true, "v1.4.0 go1.26.0"},
		{"a_work_tree", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}, true, "(devel) go1.26.0"},
		{"no_version", &debug.BuildInfo{GoVersion: "go1.26.0"}, true, "(devel) go1.26.0"},
		{"no_build_info", nil, false, "(devel)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, moduleVersion(func() (*debug.BuildInfo, bool) { return tc.info, tc.ok }))
		})
	}
	for _, arg := range []string{"--version", "-version", "version"} {
		r := runCLI(t, arg)
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.Regexp(t, `^runlease \S+ go\S+\n$`, r.stdout)
	}
	r := runCLI(t, "--version", "extra")
	assert.Equal(t, exitUsage, r.code)
}
