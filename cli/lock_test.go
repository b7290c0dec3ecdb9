package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/proctest"
)

func TestHelperProcess(t *testing.T) { proctest.Dispatch(t) }

// roleDriver is a run driver in another process: it opens the embedded
// store at $STORE_PATH with its writer lock, holds a lease and a slot, and
// blocks until the test lets it go.
var roleDriver = proctest.Register("cli-driver", func() int {
	ctx := context.Background()
	s, err := runlease.OpenSQLite(os.Getenv("STORE_PATH"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	if _, err := runlease.Acquire(ctx, s, "held-run", "driver#child"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := runlease.ClaimSlots(ctx, s, "held-run", []runlease.Scope{runlease.MemScope(2)}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	proctest.WaitRelease()
	return 0
})

func TestReadsWorkBesideADriverInAnotherProcessButWritesAreRefused(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "runs.db")
	child := proctest.Start(t, roleDriver, "STORE_PATH="+path)
	require.NoError(t, child.WaitLine("ready", 30*time.Second))

	r := runCLI(t, "status", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, `(?m)^held-run\s+driver#child\s+1\s+live\s`, r.stdout)
	assert.Regexp(t, `(?m)^mem\s+1\s+held-run \(slot 0,`, r.stdout)

	r = runCLI(t, "status", "--db", path, "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Equal(t, "driver#child", decodeStatus(t, r.stdout).lease(t, "held-run").Holder)

	r = runCLI(t, "peek", "held-run", "--db", path)
	assert.Equal(t, exitHeld, r.code, r.stderr)

	r = runCLI(t, "prune", "--older-than", "0s", "--dry-run", "--db", path)
	assert.Equal(t, exitOK, r.code, "a dry run only reads: %s", r.stderr)

	for _, args := range [][]string{
		{"release", "held-run", "--force", "--yes", "--db", path},
		{"prune", "--older-than", "0s", "--yes", "--db", path},
	} {
		r = runCLI(t, args...)
		assert.Equal(t, exitError, r.code, args)
		assert.Regexp(t, `^runlease: RUN-E010: store ".*runs.db" is open in another process`, r.stderr)
		assert.Contains(t, r.stderr, "\nrunlease: hint: stop the driver or use a shared Postgres store\n")
	}

	child.Release()
	code, err := child.Wait(30 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code, child.Stderr())
	r = runCLI(t, "release", "held-run", "--force", "--yes", "--db", path)
	assert.Equal(t, exitOK, r.code, "once the driver stopped: %s", r.stderr)
}
