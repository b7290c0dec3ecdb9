package cli

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPeekExitStatusTellsHeldFreeOrAbsent(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, tc := range []struct {
		run   string
		code  int
		state string
	}{
		{runLive, exitHeld, stateLive},
		{runExpired, exitFree, stateExpired},
		{runReleased, exitFree, stateReleased},
		{"never-acquired", exitAbsent, stateAbsent},
	} {
		t.Run(tc.state, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, "peek", tc.run, "--db", path)
			assert.Equal(t, tc.code, r.code, r.stderr)
			assert.Regexp(t, `(?m)^run\s+`+tc.run+`$`, r.stdout)
			assert.Regexp(t, `(?m)^state\s+`+tc.state+`$`, r.stdout)
			assert.Empty(t, r.stderr)

			r = runCLI(t, "peek", "--json", "--db", path, tc.run)
			assert.Equal(t, tc.code, r.code, r.stderr)
			var doc peekJSON
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
			assert.Equal(t, tc.run, doc.RunID)
			assert.Equal(t, tc.state, doc.State)
			assert.WithinDuration(t, time.Now(), doc.Now, time.Minute)
		})
	}
}

func TestPeekShowsTheLeaseInDetail(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "peek", runLive, "--db", path)
	require.Equal(t, exitHeld, r.code, r.stderr)
	for _, re := range []string{
		`(?m)^holder\s+alice#node-1$`,
		`(?m)^fence\s+1$`,
		`(?m)^until\s+\d{4}-\S+Z \(in [0-9ms]+\)$`,
		`(?m)^takeover\s+at \d{4}-\S+Z$`,
		`(?m)^row\s+\{"holder":"alice#node-1","fence":1,"until_ms":\d+\}$`,
	} {
		assert.Regexp(t, re, r.stdout)
	}

	r = runCLI(t, "peek", runLive, "--db", path, "--json")
	require.Equal(t, exitHeld, r.code, r.stderr)
	var doc peekJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	assert.Equal(t, liveHolder, doc.Holder)
	assert.Equal(t, uint64(1), doc.Fence)
	require.NotNil(t, doc.Until)
	assert.Equal(t, *doc.Until, *doc.TakeoverAt)
	assert.False(t, doc.TakeoverPossible)

	r = runCLI(t, "peek", runReleased, "--db", path)
	require.Equal(t, exitFree, r.code, r.stderr)
	assert.Regexp(t, `(?m)^takeover\s+possible now$`, r.stdout)
	assert.Regexp(t, `(?m)^fence\s+2$`, r.stdout)
}

func TestPeekFailures(t *testing.T) {
	t.Parallel()
	path := newDB(t)

	r := runCLI(t, "peek", runCorrupt, "--db", path)
	assert.Equal(t, exitError, r.code)
	assert.Regexp(t, `^runlease: RUN-E002: corrupt row at "runlease:corrupt-run"`, r.stderr)

	for _, args := range [][]string{
		{"peek", "--db", path},
		{"peek", "a", "b", "--db", path},
		{"peek", "--json=maybe", "a"},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, exitUsage, r.code, args)
		assert.Regexp(t, `^runlease: RUN-E001: peek: .*\(see runlease peek --help\)\n$`, r.stderr)
	}

	r = runCLI(t, "peek", "--db", path, "--", "--json")
	assert.Equal(t, exitAbsent, r.code, "after --, a run id that looks like a flag: %s", r.stderr)
	assert.Regexp(t, `(?m)^run\s+--json$`, r.stdout)
}
