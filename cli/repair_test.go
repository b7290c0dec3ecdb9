package cli

import (
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/proctest"
)

// corruptDB returns the path of a new SQLite store holding, for each run
// of rows, a lease row with that text, and a corrupt slot row at
// runslot:mem:3.
func corruptDB(t *testing.T, rows map[string]string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	for run, text := range rows {
		ok, err := s.MetaCAS(t.Context(), runlease.LeasePrefix+run, nil, text)
		require.NoError(t, err)
		require.True(t, ok)
	}
	ok, err := s.MetaCAS(t.Context(), "runslot:mem:3", nil, "garbage")
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, s.Close())
	return path
}

// storedRow returns the text at key in the SQLite store at path.
func storedRow(t *testing.T, path, key string) string {
	t.Helper()
	v, found, err := openDB(t, path).MetaGet(t.Context(), key)
	require.NoError(t, err)
	require.True(t, found, key)
	return v
}

func TestFenceBoundReadsWhatTheRowStillShows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, row string
		bound     uint64
		known     bool
	}{
		{"a_cut_off_row", `{"holder":"a#n","fence":17,"until_ms":12`, 17, true},
		{"the_highest_of_two", `{"fence":3,"x":{"fence":40}}`, 40, true},
		{"digits_cut_off_at_the_end", `{"holder":"a#n","fence":1`, 0, false},
		{"no_fence", `{not json`, 0, false},
		{"a_quoted_number", `{"fence":"12"}`, 12, true},
		{"more_digits_than_a_fence", `{"fence":99999999999999999999999}`, math.MaxUint64, true},
		{"an_empty_row", ``, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bound, known := fenceBound(tc.row)
			assert.Equal(t, tc.bound, bound)
			assert.Equal(t, tc.known, known)
		})
	}
}

func TestRepairWritesATombstoneAtTheGivenFence(t *testing.T) {
	t.Parallel()
	path := corruptDB(t, map[string]string{"r1": `{"holder":"a#n","fence":17,"until_ms":12`})
	r := runCLI(t, "repair", "r1", "--fence", "17", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, `(?m)^row\s+"\{\\"holder\\":\\"a#n\\",\\"fence\\":17,\\"until_ms\\":12"$`, r.stdout, "the row is shown")
	assert.Regexp(t, `(?m)^fence\s+the row shows fence 17$`, r.stdout)
	assert.Contains(t, r.stdout, "repaired run r1: released at fence 17; the next holder gets fence 18\n")
	assert.Regexp(t, `^\{"holder":"","fence":17,"until_ms":\d+\}$`, storedRow(t, path, runlease.LeasePrefix+"r1"))

	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	defer s.Close()
	l, err := runlease.Acquire(t.Context(), s, "r1", "b#n")
	require.NoError(t, err, "a released row is taken over")
	assert.Equal(t, uint64(18), l.Fence())
}

func TestRepairRefusesAFenceBelowWhatTheRowShows(t *testing.T) {
	t.Parallel()
	const row = `{"holder":"a#n","fence":17,"until_ms":12`
	path := corruptDB(t, map[string]string{"r1": row})
	for _, args := range [][]string{{"--fence", "16"}, {"--fence", "16", "--fence-unknown", "--yes"}} {
		r := runCLI(t, append([]string{"repair", "r1", "--db", path}, args...)...)
		assert.Equal(t, exitUsage, r.code, r.stderr)
		assert.Contains(t, r.stderr, "--fence 16 is lower than fence 17, which the row shows; give --fence 17 or higher")
		assert.Regexp(t, `(?m)^fence\s+the row shows fence 17$`, r.stdout)
		assert.NotContains(t, r.stdout, "tombstone", "no row it will not write")
		assert.Equal(t, row, storedRow(t, path, runlease.LeasePrefix+"r1"), "nothing was written")
	}
}

func TestRepairWithoutAKnownFenceNeedsTheOperatorsWord(t *testing.T) {
	t.Parallel()
	rows := map[string]string{"none": "{not json", "cut": `{"holder":"a#n","fence":1`}
	path := corruptDB(t, rows)
	for run, row := range rows {
		r := runCLI(t, "repair", run, "--fence", "30", "--yes", "--db", path)
		assert.Equal(t, exitUsage, r.code, r.stderr)
		assert.Regexp(t, `(?m)^fence\s+unknown: the row shows no whole fence$`, r.stdout)
		assert.Contains(t, r.stderr, "the row shows no whole fence, so repair cannot check --fence 30")
		assert.Contains(t, r.stderr, "--fence-unknown")
		assert.NotContains(t, r.stdout, "tombstone", "no row it will not write")
		assert.Equal(t, row, storedRow(t, path, runlease.LeasePrefix+run), "nothing was written")

		r = runCLI(t, "repair", run, "--fence", "30", "--fence-unknown", "--db", path)
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.Regexp(t, `(?m)^tombstone\s+\{"holder":"","fence":30,"until_ms":\d+\}$`, r.stdout)
		assert.Regexp(t, `^\{"holder":"","fence":30,"until_ms":\d+\}$`, storedRow(t, path, runlease.LeasePrefix+run))
	}
}

func TestRepairAsksOnATerminal(t *testing.T) {
	t.Parallel()
	const row = `{"fence":4,"holder":`
	path := corruptDB(t, map[string]string{"r1": row})
	r := session{stdin: strings.NewReader("n\n"), tty: true}.run(t, "repair", "r1", "--fence", "4", "--db", path)
	assert.Equal(t, exitError, r.code)
	assert.Contains(t, r.stdout, "replace the corrupt row of run r1 by a released tombstone at fence 4? [y/N]")
	assert.Contains(t, r.stderr, "aborted at the prompt; nothing was changed")
	assert.Equal(t, row, storedRow(t, path, runlease.LeasePrefix+"r1"))

	r = session{stdin: strings.NewReader("y\n"), tty: true}.run(t, "repair", "r1", "--fence", "4", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.NotEqual(t, row, storedRow(t, path, runlease.LeasePrefix+"r1"))
}

func TestRepairRefusesWhatIsNotCorrupt(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"a_live_lease", []string{runLive, "--fence", "9"}, `the lease row of run "live-run" parses (live, fence 1)`},
		{"a_released_lease", []string{runReleased, "--fence", "9"}, "parses (released, fence 2)"},
		{"no_row", []string{"nosuch", "--fence", "9"}, `run "nosuch" has no lease row`},
		{"a_live_slot", []string{"--slot", "runslot:mem:0"}, "is not a corrupt slot row"},
		{"no_slot", []string{"--slot", "runslot:mem:7"}, `no slot row at "runslot:mem:7"`},
		{"without_fence", []string{runCorrupt}, "--fence N is required"},
		{"fence_zero", []string{runCorrupt, "--fence", "0"}, "--fence 0: give a fence from 1"},
		{"fence_at_the_end", []string{runCorrupt, "--fence", strconv.FormatUint(math.MaxUint64, 10)}, "give a fence from 1"},
		{"run_and_slot", []string{runCorrupt, "--slot", "runslot:mem:0"}, "not both"},
		{"slot_with_fence", []string{"--slot", "runslot:mem:0", "--fence", "3"}, "--slot takes no --fence"},
		{"no_run", nil, "want one RUN argument"},
	} {
		// One after another: each takes the store's writer lock.
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, append([]string{"repair", "--yes", "--db", path}, tc.args...)...)
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Regexp(t, `^runlease: RUN-E001: `, r.stderr)
			assert.Contains(t, r.stderr, tc.says)
		})
	}
}

func TestRepairDeletesACorruptSlotRow(t *testing.T) {
	t.Parallel()
	path := corruptDB(t, nil)
	r := runCLI(t, "status", "--db", path)
	require.Equal(t, exitCorrupt, r.code, r.stderr)

	r = runCLI(t, "repair", "--slot", "runslot:mem:3", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, `(?m)^row\s+"garbage"$`, r.stdout)
	assert.Contains(t, r.stdout, "repaired slot runslot:mem:3: the corrupt row is deleted and the slot is free\n")
	assert.Empty(t, storedKeys(t, path))

	r = runCLI(t, "status", "--db", path)
	assert.Equal(t, exitOK, r.code, "nothing corrupt is left: %s", r.stderr)
}

// TestRepairWritesNothingOverARowThatChangedMeanwhile changes the corrupt
// row while the operator is being asked: the tombstone is conditional on
// the row shown, so it is not written. A shared store lets the test write
// beside the command, which holds an embedded store's writer lock.
func TestRepairWritesNothingOverARowThatChangedMeanwhile(t *testing.T) {
	t.Parallel()
	dsn, table, s := newPGStore(t)
	key := runlease.LeasePrefix + "r1"
	shown, changed := `{"fence":5,`, `{"fence":6,`
	ok, err := s.MetaCAS(t.Context(), key, nil, shown)
	require.NoError(t, err)
	require.True(t, ok)

	stdin, answer := io.Pipe()
	out := &proctest.SyncBuffer{}
	done := make(chan result, 1)
	go func() {
		done <- session{stdin: stdin, tty: true, stdout: out}.run(t, "repair", "r1", "--fence", "5",
			"--postgres", dsn, "--table", table)
	}()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "[y/N]") },
		10*time.Second, 10*time.Millisecond, "the question is asked")
	ok, err = s.MetaCAS(t.Context(), key, &shown, changed)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = answer.Write([]byte("y\n"))
	require.NoError(t, err)

	r := <-done
	assert.Equal(t, exitError, r.code)
	assert.Regexp(t, `^runlease: RUN-E021: `, r.stderr)
	assert.Contains(t, r.stderr, "runlease: hint: the row changed since it was shown; nothing was written")
	v, _, err := s.MetaGet(t.Context(), key)
	require.NoError(t, err)
	assert.Equal(t, changed, v)
}
