package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// storedKeys returns every key of the SQLite store at path.
func storedKeys(t *testing.T, path string) []string {
	t.Helper()
	rows, err := openDB(t, path).MetaScan(t.Context(), "")
	require.NoError(t, err)
	var out []string
	for _, r := range rows {
		out = append(out, r.Key)
	}
	return out
}

func TestPruneDryRunListsAndRemovesNothing(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	before := storedKeys(t, path)
	r := runCLI(t, "prune", "--older-than", "1h", "--dry-run", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "restarts at fence 1")
	for _, re := range []string{
		`(?m)^KIND\s+NAME\s+FENCE\s+ENDED$`,
		`(?m)^lease\s+expired-run\s+1\s+1h59m(\d+s)? ago$`,
		`(?m)^lease\s+released-run\s+2\s+released 3h(\d+s)? ago$`,
		`(?m)^slot\s+runslot:mem:1\s+-\s+-$`,
	} {
		assert.Regexp(t, re, r.stdout)
	}
	assert.NotContains(t, r.stdout, runLive)
	assert.NotContains(t, r.stdout, runCorrupt)
	assert.True(t, strings.HasSuffix(r.stdout, "\nDry run: 2 lease rows and 1 slot row would be removed; nothing was changed.\n"),
		"the last line is a sentence:\n%s", r.stdout)
	assert.Equal(t, before, storedKeys(t, path))
}

func TestPruneRemovesOldFreeRows(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "prune", "--older-than", "90m", "--yes", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	warn := strings.Index(r.stdout, "Pruning forgets fences")
	list := strings.Index(r.stdout, "lease  expired-run")
	assert.True(t, warn >= 0 && list > warn, "the fence warning comes first:\n%s", r.stdout)
	assert.Contains(t, r.stdout, "removed 2 lease rows and 1 slot row")
	assert.Equal(t, []string{
		runlease.LeasePrefix + runCorrupt,
		runlease.LeasePrefix + runLive,
		"runslot:mem:0",
		"runslot:principal:alice:0",
	}, storedKeys(t, path), "live and corrupt rows stay")

	r = runCLI(t, "prune", "--older-than", "7d", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "nothing to prune")
}

func TestPruneAsksOnATerminal(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	before := storedKeys(t, path)
	r := session{stdin: strings.NewReader("no\n"), tty: true}.run(t, "prune", "--older-than", "1h", "--db", path)
	assert.Equal(t, exitError, r.code)
	assert.Contains(t, r.stdout, "remove 2 lease rows and 1 slot row? [y/N] ")
	assert.Contains(t, r.stderr, "aborted at the prompt")
	assert.Equal(t, before, storedKeys(t, path))

	r = session{stdin: strings.NewReader("y\n"), tty: true}.run(t, "prune", "--older-than", "1h", "--db", path)
	assert.Equal(t, exitOK, r.code, r.stderr)
	assert.Len(t, storedKeys(t, path), len(before)-3)
}

func TestPruneUsageErrors(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, args := range [][]string{
		{"prune", "--db", path},
		{"prune", "--older-than", "soon", "--db", path},
		{"prune", "--older-than", "-1h", "--db", path},
		{"prune", "--older-than", "1h", "--db", path, "extra"},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, exitUsage, r.code, args)
		assert.Regexp(t, `^runlease: RUN-E001: prune: `, r.stderr)
	}
}

func TestPruneRemovesQueueEntriesOfGoneWaiters(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	gone := `{"run":"gone","waiter":"w","fence":0,"seq":1,"principal":"","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["mem"]}`
	_, err = s.MetaCAS(t.Context(), "runqueue:3:mem:gone", nil, gone)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	r := runCLI(t, "prune", "--older-than", "90m", "--dry-run", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "queue  runqueue:3:mem:gone")
	assert.Contains(t, r.stdout, "2 lease rows, 1 slot row and 1 queue row would be removed")

	r = runCLI(t, "prune", "--older-than", "90m", "--yes", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "removed 2 lease rows, 1 slot row and 1 queue row")
	assert.NotContains(t, storedKeys(t, path), "runqueue:3:mem:gone")
}

func TestPruneCallsFairShareMarksMarks(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	for key, value := range map[string]string{
		"runqueue:3:mem:gone":  `{"run":"gone","waiter":"w","fence":0,"seq":1,"principal":"","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["mem"]}`,
		"runfair:3:mem:alice":  `{"finish":0,"until_ms":2}`,
		"runfair:3:mem:bob":    `{"finish":0,"until_ms":2}`,
		"runfair:3:gpu:carol":  `{"finish":0,"until_ms":2}`,
		"runfair:3:gpu:nobody": `{"finish":0,"until_ms":2}`,
	} {
		_, err = s.MetaCAS(t.Context(), key, nil, value)
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())

	help := runCLI(t, "prune", "--help")
	assert.Contains(t, help.stdout, "fair-share marks that expired")
	assert.Regexp(t, `(?m)^  --older-than DURATION\s+required: remove rows and marks that ended`, help.stdout)

	r := runCLI(t, "prune", "--older-than", "90m", "--dry-run", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, `(?m)^fair-share mark\s+runfair:3:mem:alice\s+-\s+-$`, r.stdout)
	assert.Regexp(t, `(?m)^queue\s+runqueue:3:mem:gone\s+-\s+-$`, r.stdout)
	assert.True(t, strings.HasSuffix(r.stdout, "\nDry run: 2 lease rows, 1 slot row, 1 queue row and 4 fair-share marks "+
		"would be removed; nothing was changed.\n"), r.stdout)

	r = runCLI(t, "prune", "--older-than", "90m", "--yes", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "removed 2 lease rows, 1 slot row, 1 queue row and 4 fair-share marks\n")
	for _, key := range storedKeys(t, path) {
		assert.NotContains(t, key, "runfair:")
	}
}
