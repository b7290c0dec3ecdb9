package cli

import (
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// newPGStore returns the test server's DSN, a fresh table (dropped when t
// ends) and a store on it; it skips t without RUNLEASE_TEST_POSTGRES.
func newPGStore(t *testing.T) (dsn, table string, s *runlease.PostgresStore) {
	t.Helper()
	pool := pgtest.Pool(t)
	table = pgtest.NewTable(t, pool)
	s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return pgtest.DSN(t), table, s
}

func TestPostgresStatusAndPeek(t *testing.T) {
	t.Parallel()
	dsn, table, s := newPGStore(t)
	seed(t, s)
	pg := []string{"--postgres", dsn, "--table", table}

	r := runCLI(t, append([]string{"status", "--limit", "mem=4"}, pg...)...)
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	assert.Regexp(t, `(?m)^live-run\s+alice#node-1\s+1\s+live\s`, r.stdout)
	assert.Regexp(t, `(?m)^corrupt-run\s+-\s+-\s+corrupt\s`, r.stdout)
	assert.Regexp(t, `(?m)^mem\s+1/4\s`, r.stdout)

	r = runCLI(t, append([]string{"status", "--json"}, pg...)...)
	require.Equal(t, exitCorrupt, r.code, r.stderr)
	doc := decodeStatus(t, r.stdout)
	assert.True(t, strings.HasSuffix(doc.Store, " table "+table), doc.Store)
	assert.Len(t, doc.Leases, 4)
	assert.Equal(t, stateExpired, doc.lease(t, runExpired).State)

	for run, code := range map[string]int{runLive: exitHeld, runReleased: exitFree, "never": exitAbsent, runCorrupt: exitError} {
		r = runCLI(t, append([]string{"peek", run}, pg...)...)
		assert.Equal(t, code, r.code, "%s: %s", run, r.stderr)
	}

	r = session{env: map[string]string{envPostgres: dsn}}.run(t, "peek", runLive, "--table", table)
	assert.Equal(t, exitHeld, r.code, "the store from $RUNLEASE_POSTGRES: %s", r.stderr)
}

func TestPostgresReleaseAndPrune(t *testing.T) {
	t.Parallel()
	dsn, table, s := newPGStore(t)
	seed(t, s)
	pg := []string{"--postgres", dsn, "--table", table}

	r := runCLI(t, append([]string{"release", runLive, "--force", "--yes"}, pg...)...)
	require.Equal(t, exitOK, r.code, r.stderr)
	info := peekRow(t, s, runLive)
	assert.True(t, info.Released)
	assert.Equal(t, uint64(1), info.Fence)

	r = runCLI(t, append([]string{"prune", "--older-than", "1h", "--yes"}, pg...)...)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "removed 2 lease rows and 1 slot row")
	leases, err := runlease.Leases(t.Context(), s)
	require.NoError(t, err)
	assert.Len(t, leases, 2, "the just-released and the corrupt rows stay")
}

// renewingStdin answers a confirmation, but first lets the holder renew,
// as a live driver does while the operator reads the question.
type renewingStdin struct {
	once   sync.Once
	renew  func()
	answer io.Reader
}

func (r *renewingStdin) Read(p []byte) (int, error) {
	r.once.Do(r.renew)
	return r.answer.Read(p)
}

func TestPostgresReleaseIsConditionalOnTheRowShown(t *testing.T) {
	t.Parallel()
	dsn, table, s := newPGStore(t)
	now := time.Now()
	clock := func() time.Time { return now }
	lease, err := runlease.Acquire(t.Context(), s, "r1", "alice#n1", runlease.WithClock(clock))
	require.NoError(t, err)
	stdin := &renewingStdin{answer: strings.NewReader("y\n"), renew: func() {
		now = now.Add(time.Second)
		require.NoError(t, lease.Renew(t.Context()))
	}}

	r := session{stdin: stdin, tty: true}.run(t, "release", "r1", "--force", "--postgres", dsn, "--table", table)
	assert.Equal(t, exitError, r.code)
	assert.Regexp(t, `^runlease: RUN-E021: lease on run "r1" lost: lease row changed`, r.stderr)
	assert.Contains(t, r.stderr, "runlease: hint: the row changed since it was shown; nothing was written")
	require.NoError(t, lease.Renew(t.Context()), "the holder keeps its lease")
}

func TestPostgresReleaseOfALeaseReleasedMeanwhileSucceeds(t *testing.T) {
	t.Parallel()
	dsn, table, s := newPGStore(t)
	lease, err := runlease.Acquire(t.Context(), s, "r1", "alice#n1")
	require.NoError(t, err)
	stdin := &renewingStdin{answer: strings.NewReader("y\n"), renew: func() {
		require.NoError(t, lease.Release(t.Context()), "the holder finishes while the operator reads")
	}}
	shown := peekRow(t, s, "r1")

	r := session{stdin: stdin, tty: true}.run(t, "release", "r1", "--force", "--postgres", dsn, "--table", table)
	assert.Equal(t, exitOK, r.code, r.stderr)
	assert.Empty(t, r.stderr)
	assert.Contains(t, r.stdout, "run r1 was already released meanwhile (fence 1 or above); nothing to do")
	after := peekRow(t, s, "r1")
	assert.True(t, after.Released)
	assert.NotEqual(t, shown.Row, after.Row, "the holder's own tombstone is in place")
}

func TestPostgresMissingTableIsNotCreated(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	r := runCLI(t, "status", "--postgres", pgtest.DSN(t), "--table", table)
	assert.Equal(t, exitError, r.code)
	assert.Regexp(t, `^runlease: RUN-E012: table ".*" does not fit the store: table does not exist`, r.stderr)
	assert.Contains(t, r.stderr, "runlease: hint: runlease never creates or changes the table")

	var exists bool
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", pgtest.Ident(table)).Scan(&exists))
	assert.False(t, exists)
}

func TestPostgresStatusNamesTheTableInItsOwnField(t *testing.T) {
	t.Parallel()
	dsn, table, s := newPGStore(t)
	seed(t, s)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	for _, args := range [][]string{
		{"--postgres", dsn, "--table", table},
		{"--postgres", dsn + sep + "table=" + table},
		{"--postgres", dsn + sep + "table=" + table, "--table", table},
	} {
		r := runCLI(t, append([]string{"status", "--json", "--state", "live"}, args...)...)
		require.Equal(t, exitOK, r.code, r.stderr)
		doc := decodeStatus(t, r.stdout)
		require.NotNil(t, doc.Table, args)
		assert.Equal(t, table, *doc.Table)
		assert.True(t, strings.HasSuffix(doc.Store, " table "+table), "kept for scripts that read it: %s", doc.Store)
		assert.Equal(t, []string{runLive}, runIDs(doc))
	}
}
