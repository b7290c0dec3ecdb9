package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/proctest"
)

func TestStatusListsEveryLeaseAndScopeForPeople(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "status", "--db", path, "--limit", "mem=4")
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	for _, re := range []string{
		`(?m)^store sqlite:` + regexp.QuoteMeta(path) + ` at \d{4}-`,
		`(?m)^RUN\s+HOLDER\s+FENCE\s+STATE\s+EXPIRES\s+TAKEOVER$`,
		`(?m)^` + runLive + `\s+alice#node-1\s+1\s+live\s+in [0-9ms]+\s+at \d{4}-\S+Z$`,
		`(?m)^` + runExpired + `\s+bob#node-2\s+1\s+expired\s+1h59m(\d+s)? ago\s+possible now$`,
		`(?m)^` + runReleased + `\s+-\s+2\s+released\s+released 3h(\d+s)? ago\s+possible now$`,
		`(?m)^` + runCorrupt + `\s+-\s+-\s+corrupt\s+-\s+never: inspect the row$`,
		`(?m)^SCOPE\s+USED\s+HOLDERS$`,
		`(?m)^mem\s+1/4\s+live-run \(slot 0, in [0-9ms]+\)$`,
		`(?m)^principal:alice\s+1\s+live-run \(slot 0, in [0-9ms]+\)$`,
	} {
		assert.Regexp(t, re, r.stdout)
	}
	assert.Equal(t, "runlease: warning: 1 corrupt row (lease of \"corrupt-run\"): a row that does not parse "+
		"blocks its run or its one slot (the scope's other slots are claimed as usual) until it is repaired; "+
		"see \"runlease repair --help\"\n", r.stderr)
}

func TestStatusPrintsJSONForScripts(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	r := runCLI(t, "status", "--json", "--db", path, "--limit", "mem=4", "--limit", "principal:bob=2")
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	doc := decodeStatus(t, r.stdout)
	assert.Equal(t, "sqlite:"+path, doc.Store)
	assert.WithinDuration(t, time.Now(), doc.Now, time.Minute)
	require.Len(t, doc.Leases, 4)

	live := doc.lease(t, runLive)
	assert.Equal(t, stateLive, live.State)
	assert.Equal(t, liveHolder, live.Holder)
	assert.Equal(t, uint64(1), live.Fence)
	require.NotNil(t, live.Until)
	assert.Positive(t, *live.ExpiresInMS)
	assert.False(t, live.TakeoverPossible)
	assert.Equal(t, *live.Until, *live.TakeoverAt)
	assert.Contains(t, live.Row, `"holder":"alice#node-1"`)

	expired := doc.lease(t, runExpired)
	assert.Equal(t, stateExpired, expired.State)
	assert.Less(t, *expired.ExpiresInMS, -int64(time.Hour/time.Millisecond))
	assert.True(t, expired.TakeoverPossible)

	released := doc.lease(t, runReleased)
	assert.Equal(t, stateReleased, released.State)
	assert.Empty(t, released.Holder)
	assert.Equal(t, uint64(2), released.Fence, "a released row keeps its fence")
	assert.True(t, released.TakeoverPossible)

	corrupt := doc.lease(t, runCorrupt)
	assert.Equal(t, stateCorrupt, corrupt.State)
	assert.Nil(t, corrupt.Until)
	assert.Nil(t, corrupt.TakeoverAt)
	assert.False(t, corrupt.TakeoverPossible)
	assert.Equal(t, "{not json", corrupt.Row)

	mem := doc.scope(t, "mem")
	assert.Equal(t, 1, mem.Used, "the expired slot is free")
	require.NotNil(t, mem.Limit)
	assert.Equal(t, 4, *mem.Limit)
	require.Len(t, mem.Slots, 1)
	assert.Equal(t, runLive, mem.Slots[0].RunID)
	assert.Equal(t, "runslot:mem:0", mem.Slots[0].Key)
	assert.Positive(t, *mem.Slots[0].ExpiresInMS)
	assert.Nil(t, doc.scope(t, "principal:alice").Limit, "no --limit for it")
	assert.Equal(t, 0, doc.scope(t, "principal:bob").Used)
}

func TestStatusJSONFieldNamesAreStable(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "status", "--json", "--db", newDB(t))
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	var doc struct {
		Leases []map[string]any
		Scopes []map[string]any
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	assert.Equal(t, []string{"expires_in_ms", "fence", "holder", "row", "run_id", "state",
		"takeover_at", "takeover_possible", "until", "until_ms"}, keys(doc.Leases[0]))
	assert.Equal(t, []string{"limit", "queue", "scope", "slots", "used"}, keys(doc.Scopes[0]))
	slot := doc.Scopes[0]["slots"].([]any)[0].(map[string]any)
	assert.Equal(t, []string{"corrupt", "expires_in_ms", "key", "run_id", "slot", "until", "until_ms"}, keys(slot))
}

func TestStatusShowsCorruptSlotRows(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	ok, err := s.MetaCAS(t.Context(), "runslot:mem:3", nil, "garbage")
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, s.Close())

	r := runCLI(t, "status", "--db", path, "--limit", "mem=4")
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	assert.Regexp(t, `(?m)^mem\s+1/4\s+corrupt row "runslot:mem:3"$`, r.stdout, "it blocks its slot")

	r = runCLI(t, "status", "--db", path, "--json")
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	slot := decodeStatus(t, r.stdout).scope(t, "mem").Slots[0]
	assert.True(t, slot.Corrupt)
	assert.Equal(t, 3, slot.Slot)
	assert.Nil(t, slot.Until)
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestStatusOfAnEmptyStore(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "empty.db")
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	r := runCLI(t, "status", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "no leases")
	assert.Contains(t, r.stdout, "no slots held")

	r = runCLI(t, "status", "--db", path, "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"leases": []`, "an empty list, not null")
	assert.Contains(t, r.stdout, `"scopes": []`)
}

func TestReadsOfAMissingStoreFailAndCreateNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "missing.db")
	for _, args := range [][]string{
		{"status", "--db", path},
		{"status", "--db", path, "--json"},
		{"peek", "r1", "--db", path},
		{"release", "r1", "--force", "--yes", "--db", path},
		{"prune", "--older-than", "1h", "--yes", "--db", path},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, exitError, r.code, args)
		assert.Regexp(t, `^runlease: RUN-E011: no embedded store at ".*missing.db"`, r.stderr)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line")
		assert.Empty(t, r.stdout)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "no store, WAL or lock file was created")
}

func TestStatusWatchRefreshesUntilInterrupted(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, tc := range []struct {
		name string
		args []string
		mark string
	}{
		{"text", nil, "refreshing every 100ms"},
		{"json_lines", []string{"--json"}, `"store":`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, interrupt := context.WithCancel(t.Context())
			out := &proctest.SyncBuffer{}
			done := make(chan result, 1)
			go func() {
				args := append([]string{"status", "--db", path, "--watch", "100ms"}, tc.args...)
				done <- session{ctx: ctx, stdout: out}.run(t, args...)
			}()
			require.Eventually(t, func() bool { return strings.Count(out.String(), tc.mark) >= 2 },
				10*time.Second, 10*time.Millisecond, "two refreshes")
			interrupt()
			r := <-done
			assert.Equal(t, exitOK, r.code, r.stderr)
			if tc.name == "json_lines" {
				for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
					doc := decodeStatus(t, line)
					assert.Len(t, doc.Leases, 4)
				}
			}
		})
	}
}

func TestStatusUsageErrors(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"argument", []string{"status", "--db", path, "extra"}, `unexpected argument "extra"`},
		{"watch_too_fast", []string{"status", "--db", path, "--watch", "1ms"}, "--watch 1ms: give at least 100ms"},
		{"watch_zero", []string{"status", "--db", path, "--watch", "0s"}, "--watch 0s: give at least 100ms"},
		{"watch_zero_json", []string{"status", "--db", path, "--watch=0", "--json"}, "--watch 0s: give at least 100ms"},
		{"watch_negative", []string{"status", "--db", path, "--watch", "-1s"}, "--watch -1s: give at least 100ms"},
		{"bad_limit", []string{"status", "--db", path, "--limit", "mem"}, "want SCOPE=N"},
		{"zero_limit", []string{"status", "--db", path, "--limit", "mem=0"}, "want SCOPE=N"},
		{"two_stores", []string{"status", "--db", path, "--postgres", "postgres://x@127.0.0.1:1/x"}, "two stores"},
		{"table_without_postgres", []string{"status", "--db", path, "--table", "t"}, "--table applies"},
		{"unknown_flag", []string{"status", "--nope"}, "flag provided but not defined: -nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, tc.args...)
			assert.Equal(t, exitUsage, r.code)
			assert.Regexp(t, `^runlease: RUN-E001: status: `, r.stderr)
			assert.Contains(t, r.stderr, tc.want)
			assert.Contains(t, r.stderr, "(see runlease status --help)")
			assert.Empty(t, r.stdout)
		})
	}
}

func TestADirectoryGivenAsTheStoreIsNamedAsOne(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "runlease.db")
	for _, args := range [][]string{
		{"status"}, {"peek", "r1"}, {"explain", "r1", "--limit", "mem=1"}, {"release", "r1", "--force", "--yes"},
		{"repair", "r1", "--fence", "2", "--yes"}, {"prune", "--older-than", "1h", "--yes"}, {"demo"},
	} {
		r := runCLI(t, append(args, "--db", dir)...)
		assert.Equal(t, exitUsage, r.code, args)
		assert.Equal(t, fmt.Sprintf("runlease: RUN-E001: %s: --db %q is a directory; --db names the store's file, "+
			"such as %q (see runlease %[1]s --help)\n", args[0], dir, file), r.stderr, args)
		assert.Empty(t, r.stdout, args)
	}
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	r := runCLI(t, "status", "--db", dir)
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, fmt.Sprintf("such as %q, which exists", file))
}
