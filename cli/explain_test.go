package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// queuedDB returns a store where run "holder" holds 3 of gpu's 4 units and
// "heavy" (team-a, priority 1) waits for 2 of them, as a waiter in another
// process leaves its entry.
func queuedDB(t *testing.T) string {
	t.Helper()
	return queuedDBOf(t, 2)
}

// queuedDBOf is queuedDB with "heavy" waiting for units of gpu.
func queuedDBOf(t *testing.T, units int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	ctx := t.Context()
	_, err = runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{runlease.NamedScope("gpu", 4).Take(3)})
	require.NoError(t, err)
	now := time.Now().UnixMilli()
	entry := `{"run":"heavy","waiter":"w1","fence":0,"seq":1,"principal":"team-a","weight":2,"priority":1,"units":` + strconv.Itoa(units) + `,"tag":0,"enq_ms":` +
		strconv.FormatInt(now-5000, 10) + `,"until_ms":` + strconv.FormatInt(now+600_000, 10) + `,"scopes":["gpu"]}`
	key := fmt.Sprintf("%s3:gpu:%07d.%019d.%016d:heavy", runlease.QueuePrefix, runlease.MaxPriority-1, 0, now-5000)
	ok, err := s.MetaCAS(ctx, key, nil, entry)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, s.Close())
	return path
}

func TestExplainTellsWhyARunWaits(t *testing.T) {
	t.Parallel()
	path := queuedDB(t)
	r := runCLI(t, "explain", "--db", path, "--limit", "gpu=4", "mine")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^run mine waits: held back in gpu \(order\)$`, r.stdout)
	assert.Regexp(t, `(?m)^gpu\s+3/4\s+1\s+1\s+1 ahead \(not queued\)\s+2\s+order$`, r.stdout)
	assert.Regexp(t, `(?m)^  ahead    heavy \(principal team-a, priority 1, 2 units, waiting since \S+\)$`, r.stdout)
	assert.Regexp(t, `(?m)^  holding  holder slot 0 until \S+$`, r.stdout)

	r = runCLI(t, "explain", "--db", path, "--limit", "gpu=4", "--units", "gpu=2", "--json", "heavy")
	require.Equal(t, 0, r.code, r.stderr)
	var doc explainJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
	assert.False(t, doc.Admissible)
	require.Len(t, doc.Scopes, 1)
	g := doc.Scopes[0]
	assert.Equal(t, "capacity", g.BlockedBy)
	assert.True(t, g.Queued)
	assert.Equal(t, 0, g.Position)
	assert.Equal(t, 3, g.Used)
	assert.Len(t, g.Holders, 3)
	assert.Empty(t, g.Ahead)

	r = runCLI(t, "explain", "--db", path, "--limit", "gpu=4", "--priority", "2", "urgent")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^run urgent would be admitted now$`, r.stdout)

	for _, bad := range [][]string{
		{"explain", "--db", path, "mine"},
		{"explain", "--db", path, "--limit", "gpu=4"},
		{"explain", "--db", path, "--limit", "gpu=4", "--units", "mem=1", "mine"},
		{"explain", "--db", path, "--limit", "gpu=4", "--units", "gpu=5", "mine"},
		{"explain", "--db", path, "--limit", "gpu=4", "--weight", "0", "mine"},
	} {
		r := runCLI(t, bad...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", bad, r.stderr)
	}
}

func TestExplainCountsUnitsInProperPlural(t *testing.T) {
	t.Parallel()
	for units, want := range map[int]string{1: "1 unit", 2: "2 units", 3: "3 units"} {
		r := runCLI(t, "explain", "--db", queuedDBOf(t, units), "--limit", "gpu=4", "mine")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `(?m)^  ahead    heavy \(principal team-a, priority 1, `+want+`, waiting since \S+\)$`, r.stdout)
	}
}

func TestStatusShowsTheQueues(t *testing.T) {
	t.Parallel()
	path := queuedDB(t)
	r := runCLI(t, "status", "--db", path)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^QUEUE\s+POS\s+RUN\s+PRINCIPAL\s+PRIORITY\s+UNITS\s+WAITING SINCE$`, r.stdout)
	assert.Regexp(t, `(?m)^gpu\s+0\s+heavy\s+team-a\s+1\s+2\s+\S+$`, r.stdout)

	r = runCLI(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	doc := decodeStatus(t, r.stdout)
	q := doc.scope(t, "gpu").Queue
	require.Len(t, q, 1)
	assert.Equal(t, "heavy", q[0].RunID)
	assert.Equal(t, "team-a", q[0].Principal)
	assert.Equal(t, 2, q[0].Weight)
	assert.Equal(t, 2, q[0].Units)
	assert.Positive(t, q[0].ExpiresInMS)
}
