package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/systest"
)

// checkTimeline checks the key lines of a demo's output.
func checkTimeline(t *testing.T, out string) {
	t.Helper()
	for _, re := range []string{
		`(?m)^t\+0s\s+driver-a \(reports#node-a\) acquires run nightly-report: fence 1`,
		`(?m)^t\+5s\s+driver-b \(reports#node-b\) tries run nightly-report: refused$`,
		`(?m)^\s+RUN-E021: run "nightly-report" is held by another holder \(holder "reports#node-a", fence 1`,
		`(?m)^\s+takeover possible at t\+30s, in 25s$`,
		`(?m)^t\+41s\s+driver-b \(reports#node-b\) acquires run nightly-report: fence 2`,
		`(?m)^\s+a takeover: fence 2 is higher than driver-a's fence 1$`,
		`(?m)^t\+41s\s+driver-b resumes after "step 1 done by driver-a" and checkpoints step 2 at fence 2$`,
		`(?m)^t\+42s\s+driver-a wakes up and checkpoints step 2 at fence 1: refused$`,
		`(?m)^\s+RUN-E021: .*\(holder "reports#node-b", fence 2`,
		`(?m)^\s+nothing was written: the checkpoint is still "step 2 done by driver-b"$`,
		`(?m)^t\+42s\s+driver-a renews: refused \(RUN-E021\); it stops`,
		`(?m)^\s+RUN-E022: concurrency limit reached in scope "mem" \(limit 2, 2 held, 1 asked\)$`,
		`(?m)runlease\.Keep`,
		`(?m)^t\+1m20s\s+driver-d tries run weekly-audit: refused \(RUN-E021\)`,
		`(?m)^t\+1m50s\s+superstep done after 1m, twice the TTL; neither lease lapsed$`,
		`(?m)^nightly-report\s+reports#node-b\s+2\s+live\s`,
		`(?m)^cleanup-tmp\s+cleanup#node-e\s+1\s+expired\s`,
		`(?m)^adhoc-export\s+-\s+1\s+released\s`,
		`(?m)^mem\s+2/2\s+nightly-report \(slot 0, in 30s\), weekly-audit \(slot 1, in 30s\)$`,
	} {
		assert.Regexp(t, re, out)
	}
}

func TestDemoPlaysTheScenario(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "demo")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Empty(t, r.stderr)
	checkTimeline(t, r.stdout)
	m := regexp.MustCompile(`(?m)^store (\S+)$`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	_, err := os.Stat(filepath.Dir(m[1]))
	assert.ErrorIs(t, err, os.ErrNotExist, "the temporary folder is removed")
}

func TestDemoKeepsTheStoreGivenWithDB(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "demo.db")
	r := runCLI(t, "demo", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "The store is kept: runlease status --db "+path)

	r = runCLI(t, "status", "--db", path, "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	lease := decodeStatus(t, r.stdout).lease(t, "nightly-report")
	assert.Equal(t, stateLive, lease.State, "the simulated time ends about now")
	assert.Equal(t, uint64(2), lease.Fence)

	r = runCLI(t, "demo", "--db", path)
	assert.Equal(t, exitError, r.code)
	assert.Regexp(t, `^runlease: RUN-E001: demo: ".*demo.db" already holds \d+ rows`, r.stderr)
}

func TestDemoSaysOneRowNotOneRows(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "one.db")
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	_, err = s.MetaCAS(t.Context(), "k", nil, "v")
	require.NoError(t, err)
	require.NoError(t, s.Close())
	r := runCLI(t, "demo", "--db", path)
	assert.Equal(t, exitError, r.code)
	assert.Contains(t, r.stderr, "already holds 1 row; give a new file or none")
}

func TestDemoTimelineHoldsOnlySimulatedTime(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "demo")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.NotRegexp(t, `\d{4}-\d{2}-\d{2}T`, r.stdout, "no dates in a simulated timeline")
	assert.Regexp(t, `(?m)^\s+RUN-E021: run "nightly-report" is held by another holder \(holder "reports#node-a", fence 1, until t\+30s\)$`, r.stdout)
	assert.Regexp(t, `(?m)^store sqlite:\S+ at t\+1m50s$`, r.stdout)
	assert.Regexp(t, `(?m)^nightly-report\s+reports#node-b\s+2\s+live\s+in 30s\s+at t\+2m20s$`, r.stdout)
}

// TestBuiltBinary builds the command and runs it, so that the exit
// statuses and the demo are proven through main and os.Exit, not only
// through run.
func TestBuiltBinary(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not in PATH")
	}
	bin := filepath.Join(t.TempDir(), "runlease")
	build := exec.CommandContext(t.Context(), goTool, "build", "-o", bin, "github.com/areev/runlease/cmd/runlease")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	start := time.Now()
	demo := exec.CommandContext(t.Context(), bin, "demo")
	out, err = demo.Output()
	require.NoError(t, err, "runlease demo: %s", out)
	assert.Less(t, time.Since(start), 20*time.Second, "the demo takes seconds, not minutes")
	checkTimeline(t, string(out))

	path := newDB(t)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"peek", runLive, "--db", path}, exitHeld},
		{[]string{"peek", runExpired, "--db", path}, exitFree},
		{[]string{"peek", "never-acquired", "--db", path}, exitAbsent},
		{[]string{"peek", runCorrupt, "--db", path}, exitError},
		{[]string{"peek", "--db", path}, exitUsage},
		{[]string{"status", "--db", path}, exitCorrupt},
		{[]string{"status", "--db", path, "--state", "live"}, exitOK},
		{[]string{"--version"}, exitOK},
	} {
		err := exec.CommandContext(t.Context(), bin, tc.args...).Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		assert.Equal(t, tc.code, code, tc.args)
	}
}
