//go:build linux

package runlease_test

// Crash tests: a child process opens a store and writes in a loop (compare-
// and-swap increments of a few counters, fresh inserts, and real lease rows
// through Acquire and Renew), printing each write once the store has
// acknowledged it. The parent SIGKILLs it after a random short delay, then
// checks the store; the next child carries on from what is stored.
//
// What must hold after each kill. The child makes one write at a time, so at
// most one write was in flight when it died, and that one may or may not
// have landed. Hence, with A the last acknowledged value of each thing:
//
//   - a counter holds A, or A+1 (the write in flight);
//   - every acknowledged insert is present with its value, and at most one
//     other insert exists: this child's next one (in flight);
//   - a lease row decodes (runlease.Peek, no ErrCorruptRow), names the
//     writer, and holds the acknowledged fence and expiry, or one write
//     more: fence+1 (an Acquire in flight) or the same fence with a later
//     expiry (a Renew in flight);
//   - of all these, at most one is a write ahead of the acknowledgements;
//   - every row is one the writer writes (no stray or torn keys);
//   - SQLite only: the writer lock is free the moment the child has been
//     reaped (OpenSQLite succeeds at once, with no retry), and PRAGMA
//     integrity_check says "ok".
//
// Sizes: by default 100 kills on SQLite and 20 on Postgres (the shared
// server; killing a client never touches it); with -tags chaos or
// RUNLEASE_CHAOS=1, 100 on each. crash_check_test.go holds the check and
// the store broken on purpose that proves it can fail.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
)

var roleCrashWriter = proctest.Register("crash-writer", crashWriter)

const (
	envCrashSQLite = "RUNLEASE_TEST_CRASH_SQLITE" // the store file, for SQLite
	envCrashDSN    = "RUNLEASE_TEST_CRASH_DSN"    // the DSN, for Postgres
	envCrashTable  = "RUNLEASE_TEST_CRASH_TABLE"
	envCrashInc    = "RUNLEASE_TEST_CRASH_INC"    // the child's incarnation, from 0
	envCrashBroken = "RUNLEASE_TEST_CRASH_BROKEN" // "lazy": acknowledge before writing

	crashCounters = 3
	crashRuns     = 2
	// crashMaxDelay bounds the random time a child writes before it is
	// killed: long enough for dozens of writes, short enough that a
	// hundred kills take seconds.
	crashMaxDelay = 80 * time.Millisecond
	crashTimeout  = time.Minute
)

var crashHolder = runlease.HolderFor("crash", "writer")

func crashCounterKey(i int) string     { return fmt.Sprintf("ctr:%d", i) }
func crashRunID(i int) string          { return fmt.Sprintf("run-%d", i) }
func crashInsertKey(inc, j int) string { return fmt.Sprintf("ins:%04d:%06d", inc, j) }
func crashInsertValue(inc, j int) string {
	return fmt.Sprintf("v%d.%d", inc, j)
}

// crashKills returns how many times each store's writer is killed.
func crashKills(sqlite bool) int {
	if sqlite || fullFaultSize || os.Getenv(envFullFaults) == "1" {
		return 100
	}
	return 20
}

// crashOpen opens the store the environment names.
func crashOpen(ctx context.Context) (runlease.Store, error) {
	if path := os.Getenv(envCrashSQLite); path != "" {
		return runlease.OpenSQLite(path)
	}
	return runlease.OpenPostgres(ctx, os.Getenv(envCrashDSN),
		runlease.WithTable(os.Getenv(envCrashTable)), runlease.WithCreateTable(false))
}

// crashWriter is the body of a child: it writes until it is killed,
// printing every acknowledged write as a line:
//
//	c <counter key> <value>
//	i <insert key> <value>
//	l <run id> <fence> <until_ms>
//
// A conditional write that loses, which no other writer could cause,
// prints "conflict …"; any error ends the child with status 1.
func crashWriter() int {
	ctx := context.Background()
	inc, _ := strconv.Atoi(os.Getenv(envCrashInc))
	store, err := crashOpen(ctx)
	if err != nil {
		return crashFail(err)
	}
	if os.Getenv(envCrashBroken) == "lazy" {
		store = newLazyStore(store)
	}
	counters := make([]uint64, crashCounters)
	for i := range counters {
		if counters[i], err = crashReadCounter(ctx, store, i); err != nil {
			return crashFail(err)
		}
	}
	leases := make([]*runlease.Lease, crashRuns)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(inc)))
	fmt.Println("ready")
	for j := 0; ; {
		switch r := rng.IntN(8); {
		case r < 4:
			i := rng.IntN(crashCounters)
			if err := crashIncrement(ctx, store, i, &counters[i]); err != nil {
				return crashFail(err)
			}
		case r < 6:
			key, v := crashInsertKey(inc, j), crashInsertValue(inc, j)
			ok, err := store.MetaCAS(ctx, key, nil, v)
			if err != nil {
				return crashFail(err)
			}
			if !ok {
				fmt.Printf("conflict %s\n", key)
				continue
			}
			fmt.Printf("i %s %s\n", key, v)
			j++
		default:
			i := rng.IntN(crashRuns)
			if err := crashLease(ctx, store, rng, &leases[i], crashRunID(i)); err != nil {
				return crashFail(err)
			}
		}
	}
}

func crashFail(err error) int {
	fmt.Fprintln(os.Stderr, err)
	return 1
}

func crashReadCounter(ctx context.Context, store runlease.Store, i int) (uint64, error) {
	v, found, err := store.MetaGet(ctx, crashCounterKey(i))
	if err != nil || !found {
		return 0, err
	}
	return strconv.ParseUint(v, 10, 64)
}

// crashIncrement moves counter i from *cur to *cur+1 by compare-and-swap.
func crashIncrement(ctx context.Context, store runlease.Store, i int, cur *uint64) error {
	key := crashCounterKey(i)
	var expected *string
	if *cur > 0 {
		s := strconv.FormatUint(*cur, 10)
		expected = &s
	}
	next := strconv.FormatUint(*cur+1, 10)
	ok, err := store.MetaCAS(ctx, key, expected, next)
	if err != nil {
		return err
	}
	if !ok {
		fmt.Printf("conflict %s at %d\n", key, *cur)
		*cur, err = crashReadCounter(ctx, store, i)
		return err
	}
	*cur++
	fmt.Printf("c %s %s\n", key, next)
	return nil
}

// crashLease acquires the run (which raises its fence), or renews the lease
// already held (which moves its expiry).
func crashLease(ctx context.Context, store runlease.Store, rng *rand.Rand, lease **runlease.Lease, run string) error {
	if *lease == nil || rng.IntN(3) == 0 {
		l, err := runlease.Acquire(ctx, store, run, crashHolder, runlease.WithTTL(runlease.MinTTL))
		if err != nil {
			return err
		}
		*lease = l
	} else if err := (*lease).Renew(ctx); err != nil {
		return err
	}
	fmt.Printf("l %s %d %d\n", run, (*lease).Fence(), (*lease).Expiry().UnixMilli())
	return nil
}

// crashTarget is a store under test: how to start its writer and how to
// look at it once the writer is dead.
type crashTarget struct {
	env []string // for the child
	// inspect reads every row of the store right after a kill, and returns
	// problems that are the store's own (a lock still held, a damaged
	// file) along with the rows and a way to Peek leases.
	inspect func(t *testing.T) (rows []runlease.Row, store runlease.Store, done func(), problems []string)
}

// crashRun kills the writer kills times and checks the store after each.
// It returns every problem found, each prefixed with the kill it followed.
func crashRun(t *testing.T, target crashTarget, kills int, broken string, minDelay time.Duration) (problems []string, st *crashState) {
	t.Helper()
	st = newCrashState()
	for inc := range kills {
		env := append([]string{envCrashInc + "=" + strconv.Itoa(inc), envCrashBroken + "=" + broken}, target.env...)
		child := proctest.Start(t, roleCrashWriter, env...)
		require.NoError(t, child.WaitLine("ready", crashTimeout))
		time.Sleep(minDelay + rand.N(crashMaxDelay))
		child.Kill()
		code, err := child.Wait(crashTimeout)
		require.NoError(t, err)
		require.Equal(t, -1, code, "kill %d: the writer exited by itself; stderr:\n%s", inc, child.Stderr())

		rows, store, done, own := target.inspect(t)
		found := append(own, st.check(t.Context(), store, inc, child.Lines()[1:], rows)...)
		done()
		for _, p := range found {
			problems = append(problems, fmt.Sprintf("kill %d: %s", inc, p))
		}
	}
	return problems, st
}

// crashSQLite is the SQLite target: a store file in t's directory.
func crashSQLite(t *testing.T) crashTarget {
	path := filepath.Join(t.TempDir(), "crash.db")
	return crashTarget{
		env: []string{envCrashSQLite + "=" + path},
		inspect: func(t *testing.T) ([]runlease.Row, runlease.Store, func(), []string) {
			// At once, with no retry: the dead writer's lock must be gone.
			s, err := runlease.OpenSQLite(path)
			if errors.Is(err, runlease.ErrStoreLocked) {
				return nil, nil, func() {}, []string{"the writer lock is still held after the writer died: " + err.Error()}
			}
			require.NoError(t, err)
			rows, err := s.MetaScan(t.Context(), "")
			require.NoError(t, err)
			return rows, s, func() {
				require.NoError(t, s.Close())
				if res := crashIntegrity(t, path); res != "ok" {
					t.Errorf("PRAGMA integrity_check: %s", res)
				}
			}, nil
		},
	}
}

// crashIntegrity runs PRAGMA integrity_check on the file through a handle
// of its own, opened read-only once the store is closed (closing a second
// handle of a file that a store has open would drop the store's locks).
func crashIntegrity(t *testing.T, path string) string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var res string
	require.NoError(t, db.QueryRowContext(t.Context(), "PRAGMA integrity_check").Scan(&res))
	return res
}

// crashPostgres is the Postgres target: a fresh table on the shared
// server. Each child connects with an application_name of its own, and the
// parent waits for the dead child's server sessions to end before it
// reads, so that a statement still running for the dead child cannot land
// after the check.
func crashPostgres(t *testing.T) crashTarget {
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	app := pgtest.UniqueName("runlease_crash_")
	u, err := url.Parse(pgtest.DSN(t))
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return crashTarget{
		env: []string{envCrashDSN + "=" + u.String(), envCrashTable + "=" + table},
		inspect: func(t *testing.T) ([]runlease.Row, runlease.Store, func(), []string) {
			require.Eventually(t, func() bool {
				var n int
				err := pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
				return err == nil && n == 0
			}, 30*time.Second, 5*time.Millisecond, "the dead writer's sessions did not end")
			rows, err := s.MetaScan(t.Context(), "")
			require.NoError(t, err)
			return rows, s, func() {}, nil
		},
	}
}

func TestSQLiteSurvivesSIGKILLMidWrite(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	kills := crashKills(true)
	start := time.Now()
	problems, st := crashRun(t, crashSQLite(t), kills, "", 0)
	assert.Empty(t, problems)
	t.Logf("%d kills in %v: %s", kills, time.Since(start), st)
	st.requireProgress(t, kills)
}

func TestPostgresSurvivesSIGKILLMidWrite(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	target := crashPostgres(t)
	kills := crashKills(false)
	start := time.Now()
	problems, st := crashRun(t, target, kills, "", 0)
	assert.Empty(t, problems)
	t.Logf("%d kills in %v: %s", kills, time.Since(start), st)
	st.requireProgress(t, kills)
}
