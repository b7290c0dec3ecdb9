package cli

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/proctest"
)

func TestReleaseForceKeepsTheFence(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "release", runLive, "--force", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	shown := strings.Index(r.stdout, "holder    alice#node-1")
	done := strings.Index(r.stdout, "released run live-run: fence 1 kept")
	assert.True(t, shown >= 0 && done > shown, "the row is shown before it is released:\n%s", r.stdout)
	assert.Contains(t, r.stdout, "warning: alice#node-1 may still be running")

	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	defer s.Close()
	info := peekRow(t, s, runLive)
	assert.True(t, info.Released)
	assert.Equal(t, uint64(1), info.Fence)
	next, err := runlease.Acquire(t.Context(), s, runLive, "dave#node-4")
	require.NoError(t, err, "free at once")
	assert.Equal(t, uint64(2), next.Fence(), "the next holder continues above the fence")
}

func TestReleaseAsksOnATerminal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		answer   string
		args     []string
		released bool
	}{
		{"yes", "y\n", nil, true},
		{"YES", "YES\n", nil, true},
		{"no", "n\n", nil, false},
		{"enter", "\n", nil, false},
		{"end_of_input", "", nil, false},
		{"--yes_skips_the_question", "", []string{"--yes"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := newDB(t)
			args := append([]string{"release", runLive, "--force", "--db", path}, tc.args...)
			r := session{stdin: strings.NewReader(tc.answer), tty: true}.run(t, args...)
			asked := strings.Contains(r.stdout, "release run live-run held by alice#node-1 at fence 1? [y/N] ")
			assert.Equal(t, tc.args == nil, asked, r.stdout)
			info := peekRow(t, openDB(t, path), runLive)
			assert.Equal(t, tc.released, info.Released)
			if tc.released {
				assert.Equal(t, exitOK, r.code, r.stderr)
				return
			}
			assert.Equal(t, exitError, r.code)
			assert.Equal(t, "runlease: aborted at the prompt; nothing was changed\n", r.stderr)
		})
	}
}

func TestReleaseRefusals(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	before := peekRow(t, openDB(t, path), runLive).Row

	r := runCLI(t, "release", runLive, "--db", path)
	assert.Equal(t, exitUsage, r.code)
	assert.Regexp(t, `^runlease: RUN-E001: release: refusing without --force`, r.stderr)
	assert.Equal(t, before, peekRow(t, openDB(t, path), runLive).Row, "nothing written")

	r = runCLI(t, "release", "--force", "--db", path)
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, "want one RUN argument, got 0")

	r = runCLI(t, "release", "never-acquired", "--force", "--db", path)
	assert.Equal(t, exitUsage, r.code, "RUN-E001 is a usage error")
	assert.Regexp(t, `^runlease: RUN-E001: invalid argument: run "never-acquired" has no lease row`, r.stderr)

	r = runCLI(t, "release", runCorrupt, "--force", "--db", path)
	assert.Equal(t, exitError, r.code)
	assert.Regexp(t, `^runlease: RUN-E002: `, r.stderr)

	r = runCLI(t, "release", runReleased, "--force", "--db", path)
	assert.Equal(t, exitOK, r.code, "releasing a released lease is a no-op: %s", r.stderr)
	assert.Contains(t, r.stdout, "run released-run is already released (fence 2); nothing to do")
}

func TestAnInterruptAtThePromptChangesNothing(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	stdin, _ := io.Pipe() // nobody answers
	ctx, interrupt := context.WithCancel(t.Context())
	out := &proctest.SyncBuffer{}
	done := make(chan result, 1)
	go func() {
		done <- session{ctx: ctx, stdin: stdin, tty: true, stdout: out}.run(t, "release", runLive, "--force", "--db", path)
	}()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "[y/N] ") },
		10*time.Second, 10*time.Millisecond)
	interrupt()
	r := <-done
	assert.Equal(t, exitError, r.code)
	assert.Contains(t, r.stderr, "aborted at the prompt")
	assert.False(t, peekRow(t, openDB(t, path), runLive).Released)
}
