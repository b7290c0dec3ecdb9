package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// result is what one command line did.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs a command line in-process through run, as main does, with
// empty stdin.
func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, strings.NewReader(""), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// session is a command line with the seams run fixes replaced: stdin, a
// terminal or not, the environment, and the context.
type session struct {
	ctx    context.Context
	stdin  io.Reader
	tty    bool
	env    map[string]string
	stdout io.Writer
	kinds  []StoreKind // stores added as a binary built with cli.Main would
}

func (s session) run(t *testing.T, args ...string) result {
	t.Helper()
	ctx := s.ctx
	if ctx == nil {
		ctx = t.Context()
	}
	stdin := s.stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var out, errb bytes.Buffer
	var stdout io.Writer = &out
	if s.stdout != nil {
		stdout = s.stdout
	}
	c := newCLI(ctx, stdin, stdout, &errb)
	c.getenv = func(k string) string { return s.env[k] }
	c.isTerminal = func(any) bool { return s.tty }
	if err := c.addKinds(s.kinds); err != nil {
		return result{code: c.exit(err), stdout: out.String(), stderr: errb.String()}
	}
	code := c.main(args)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// The runs seeded by seed, one per state.
const (
	runLive     = "live-run"
	runExpired  = "expired-run"
	runReleased = "released-run"
	runCorrupt  = "corrupt-run"
	liveHolder  = "alice#node-1"
)

// seed writes one lease of every state and some slots into s, by the
// store's own clock, so that the command judges them as written:
// runLive is held for a minute with slots in mem and principal:alice;
// runExpired expired two hours ago, and so did its mem slot; runReleased
// was released at fence 2 three hours ago; runCorrupt does not parse.
func seed(t *testing.T, s runlease.Store) {
	t.Helper()
	ctx := t.Context()
	now := time.Now()
	if c, ok := s.(runlease.Clock); ok {
		now, _ = c.ClockNow()
	}
	ago := func(d time.Duration) []runlease.Option {
		return []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(func() time.Time { return now.Add(-d) })}
	}
	_, err := runlease.Acquire(ctx, s, runLive, liveHolder, ago(0)...)
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(ctx, s, runLive, []runlease.Scope{runlease.MemScope(4), runlease.PrincipalScope("alice", 1)}, ago(0)...)
	require.NoError(t, err)
	_, err = runlease.Acquire(ctx, s, runExpired, "bob#node-2", ago(2*time.Hour)...)
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(ctx, s, runExpired, []runlease.Scope{runlease.MemScope(4)}, ago(2*time.Hour)...)
	require.NoError(t, err)
	for range 2 {
		l, err := runlease.Acquire(ctx, s, runReleased, "carol#node-3", ago(3*time.Hour)...)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	ok, err := s.MetaCAS(ctx, runlease.LeasePrefix+runCorrupt, nil, "{not json")
	require.NoError(t, err)
	require.True(t, ok)
}

// newDB returns the path of a new SQLite store seeded by seed, closed so
// that the command under test can take its writer lock.
func newDB(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	seed(t, s)
	require.NoError(t, s.Close())
	return path
}

// openDB opens the SQLite store at path for the test's own checks, and
// closes it when the test ends.
func openDB(t *testing.T, path string) *runlease.SQLiteStore {
	t.Helper()
	s, err := runlease.OpenSQLiteReadOnly(path)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// peekRow reads the lease of runID in s.
func peekRow(t *testing.T, s runlease.Store, runID string) runlease.LeaseInfo {
	t.Helper()
	info, err := runlease.Peek(t.Context(), s, runID)
	require.NoError(t, err)
	return info
}

// statusDoc is status --json, decoded.
type statusDoc struct {
	Store   string      `json:"store"`
	Table   *string     `json:"table"`
	Now     time.Time   `json:"now"`
	Leases  []leaseJSON `json:"leases"`
	Omitted int         `json:"omitted"`
	Scopes  []scopeJSON `json:"scopes"`
}

func (d statusDoc) lease(t *testing.T, runID string) leaseJSON {
	t.Helper()
	for _, l := range d.Leases {
		if l.RunID == runID {
			return l
		}
	}
	t.Fatalf("no lease %q in %+v", runID, d.Leases)
	return leaseJSON{}
}

func (d statusDoc) scope(t *testing.T, name string) scopeJSON {
	t.Helper()
	for _, s := range d.Scopes {
		if s.Scope == name {
			return s
		}
	}
	t.Fatalf("no scope %q in %+v", name, d.Scopes)
	return scopeJSON{}
}

func decodeStatus(t *testing.T, out string) statusDoc {
	t.Helper()
	var doc statusDoc
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&doc), out)
	return doc
}
