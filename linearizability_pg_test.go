//go:build linux

package runlease_test

// The Postgres linearizability checks: several operating-system processes
// (proctest children) make random calls on one table, each streaming a JSON
// line per call, timed on CLOCK_MONOTONIC, to the parent, which merges the
// histories and checks them with porcupine. The main check runs on a
// private cluster (pgtest.StartCluster) reached through a fault proxy, so
// the test can reset every connection and crash-restart the server mid-run;
// the shared server on 5432 is never restarted.
//
// Sizes (linPGSize): by default a CI size, 2 processes × 8 goroutines ×
// 400 calls over 8 keys with 3 connection resets and 1 server restart; with
// -tags chaos or RUNLEASE_CHAOS=1, the full size, 2 processes × 16
// goroutines × 2,000 calls over 8 keys with 6 resets and 2 restarts.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/faultproxy"
	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/linearize"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
)

var roleLinPG = proctest.Register("lin-pg-client", linPGClient)

// The children's settings, passed in their environment.
const (
	envLinDSN        = "RUNLEASE_TEST_LIN_DSN"
	envLinTable      = "RUNLEASE_TEST_LIN_TABLE"
	envLinProc       = "RUNLEASE_TEST_LIN_PROC"
	envLinGoroutines = "RUNLEASE_TEST_LIN_GOROUTINES"
	envLinOps        = "RUNLEASE_TEST_LIN_OPS"
	envLinKeys       = "RUNLEASE_TEST_LIN_KEYS"
	envLinBroken     = "RUNLEASE_TEST_LIN_BROKEN" // "drop": wrap the store in droppingStore
	envFullFaults    = "RUNLEASE_CHAOS"

	// linPGConns is each child's pool size: two children stay under the
	// private cluster's 30 connections, with room for the parent.
	linPGConns = 12
	// linPGTimeout bounds each wait for a child.
	linPGTimeout = 3 * time.Minute
)

// linSize is how much a Postgres run does.
type linSize struct {
	procs, goroutines, ops, keys int
	resets, restarts             int
}

// linPGSize returns the CI size, or the full size under -tags chaos or
// RUNLEASE_CHAOS=1.
func linPGSize() linSize {
	if fullFaultSize || os.Getenv(envFullFaults) == "1" {
		return linSize{procs: 2, goroutines: 16, ops: 2000, keys: 8, resets: 6, restarts: 2}
	}
	return linSize{procs: 2, goroutines: 8, ops: 400, keys: 8, resets: 3, restarts: 1}
}

// linLine is one line a child prints per call: the record, and whether it
// was left out of the history because it failed without effect.
type linLine struct {
	linearize.Record
	Omit bool   `json:"omit,omitempty"`
	Err  string `json:"err,omitempty"`
}

// linPGClient is the body of a child: open the table, print "ready", wait
// for the parent's start (stdin closed), then run its goroutines, printing
// a line per call as it returns, and "done" at the end.
func linPGClient() int {
	env := func(name string) int { n, _ := strconv.Atoi(os.Getenv(name)); return n }
	proc, goroutines, ops := env(envLinProc), env(envLinGoroutines), env(envLinOps)
	ctx := context.Background()
	store, closeStore, err := linPGOpen(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer closeStore()
	w := &linearize.Workload{Keys: linKeys(env(envLinKeys)), Values: linValues, Now: history.Mono, Timeout: 20 * time.Second}
	fmt.Println("ready")
	proctest.WaitRelease()

	var out sync.Mutex // one line per write, whole
	emit := func(l linLine) {
		b, _ := json.Marshal(l)
		out.Lock()
		defer out.Unlock()
		os.Stdout.Write(append(b, '\n'))
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() { linPGDrive(ctx, w.NewClient(store, proc, g, rand.Uint64()), ops, emit) })
	}
	wg.Wait()
	fmt.Println("done")
	return 0
}

// linPGOpen opens the child's store on the table the parent created, with
// a pool of its own, wrapped in droppingStore when the parent asks for a
// broken store.
func linPGOpen(ctx context.Context) (runlease.Store, func(), error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv(envLinDSN))
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = linPGConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	pg, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(os.Getenv(envLinTable)), runlease.WithCreateTable(false))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	closeStore := func() { pg.Close(); pool.Close() }
	if os.Getenv(envLinBroken) == "drop" {
		return &droppingStore{Store: pg, every: 7}, closeStore, nil
	}
	return pg, closeStore, nil
}

// linPGDrive makes ops calls with c, emitting a line for each as it
// returns. After a fault it backs off, so that the calls are not used up
// while the server is down.
func linPGDrive(ctx context.Context, c *linearize.Client, ops int, emit func(linLine)) {
	backoff := time.Duration(0)
	for range ops {
		rec, keep, err := c.Step(ctx)
		l := linLine{Record: rec, Omit: !keep}
		if err != nil {
			l.Err = err.Error()
		}
		emit(l)
		if err == nil {
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, 10*time.Millisecond), 250*time.Millisecond)
		time.Sleep(backoff/2 + rand.N(backoff/2))
	}
}

// linOutcome is what the children of a run printed, gathered.
type linOutcome struct {
	recs    []linearize.Record // the calls kept for the check
	omitted int                // calls that failed without effect, left out
	errs    []string           // every fault, kept or not
	ran     time.Duration      // from the start signal to the last child's exit
}

// linChildren runs size.procs children on table through dsn, calls fault at
// the fractions of the total number of calls given by at, and gathers what
// the children printed.
func linChildren(t *testing.T, dsn, table string, size linSize, broken string, at []float64, fault func(i int)) (out linOutcome) {
	t.Helper()
	children := make([]*proctest.Child, size.procs)
	for i := range children {
		children[i] = proctest.Start(t, roleLinPG,
			envLinDSN+"="+dsn, envLinTable+"="+table, envLinProc+"="+strconv.Itoa(i),
			envLinGoroutines+"="+strconv.Itoa(size.goroutines), envLinOps+"="+strconv.Itoa(size.ops),
			envLinKeys+"="+strconv.Itoa(size.keys), envLinBroken+"="+broken)
	}
	for _, c := range children {
		require.NoError(t, c.WaitLine("ready", linPGTimeout))
	}
	start := time.Now()
	for _, c := range children {
		c.Release()
	}
	total := size.procs * size.goroutines * size.ops
	deadline := time.Now().Add(linPGTimeout)
	for i, frac := range at {
		for linProgress(children) < int(frac*float64(total)) {
			require.True(t, time.Now().Before(deadline), "the children stalled at %d of %d calls", linProgress(children), total)
			time.Sleep(5 * time.Millisecond)
		}
		fault(i)
	}
	for i, c := range children {
		code, err := c.Wait(linPGTimeout)
		require.NoError(t, err)
		require.Zero(t, code, "child %d failed; stderr:\n%s", i, c.Stderr())
		out.ran = time.Since(start)
		lines := c.Lines()
		require.Equal(t, "done", lines[len(lines)-1], "child %d did not finish", i)
		require.Len(t, lines, size.goroutines*size.ops+2, "child %d: a line per call, between ready and done", i)
		out.gather(t, i, lines[1:len(lines)-1])
	}
	return out
}

// gather adds the lines child i printed for its calls.
func (out *linOutcome) gather(t *testing.T, i int, lines []string) {
	t.Helper()
	for _, raw := range lines {
		var l linLine
		require.NoError(t, json.Unmarshal([]byte(raw), &l), "child %d printed %q", i, raw)
		if l.Err != "" {
			out.errs = append(out.errs, l.Err)
		}
		if l.Omit {
			out.omitted++
			continue
		}
		out.recs = append(out.recs, l.Record)
	}
}

// linProgress returns how many calls the children have reported.
func linProgress(children []*proctest.Child) int {
	n := 0
	for _, c := range children {
		n += max(len(c.Lines())-1, 0) // less "ready"
	}
	return n
}

// linFaultSchedule spreads resets and restarts over the run: the fractions
// of the calls made at which to inject fault i, and whether fault i is a
// restart (the rest are resets).
func linFaultSchedule(size linSize) (at []float64, restart []bool) {
	n := size.resets + size.restarts
	for i := range n {
		at = append(at, 0.1+0.8*float64(i)/float64(n))
		// Restarts sit in the middle of the list, between resets.
		restart = append(restart, i >= (n-size.restarts)/2 && i < (n-size.restarts)/2+size.restarts)
	}
	return at, restart
}

// TestPostgresIsLinearizableUnderFaults: processes race on a private
// cluster through a proxy while the test resets every connection and
// crash-restarts the server; the merged history must be linearizable.
func TestPostgresIsLinearizableUnderFaults(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	size := linPGSize()
	cluster := pgtest.StartCluster(t)
	u, err := url.Parse(cluster.DSN())
	require.NoError(t, err)
	proxy, err := faultproxy.Start(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	table := pgtest.UniqueName("runlease_lin_")
	setup, err := runlease.OpenPostgres(t.Context(), cluster.DSN(), runlease.WithTable(table))
	require.NoError(t, err)
	setup.Close()
	u.Host = proxy.Addr()

	at, restart := linFaultSchedule(size)
	var resets, restarts int
	out := linChildren(t, u.String(), table, size, "", at, func(i int) {
		if restart[i] {
			cluster.Restart()
			restarts++
			return
		}
		proxy.Reset()
		resets++
	})
	res := requireLinearizable(t, out.recs, linKeys(size.keys), true)
	assert.Positive(t, out.omitted+res.Uncertain, "no call failed: the faults were not felt")
	t.Logf("%d processes × %d goroutines × %d calls in %v: %d resets, %d restarts; "+
		"%d calls checked (%d with an unknown outcome), %d failed without effect and were left out",
		size.procs, size.goroutines, size.ops, out.ran, resets, restarts, res.Ops, res.Uncertain, out.omitted)
	if len(out.errs) > 0 {
		t.Logf("first fault: %s", out.errs[0])
	}
}

// TestPostgresLinearizabilityCheckRejectsABrokenStore runs the same
// multi-process pipeline with children whose store acknowledges writes it
// drops, and requires the merged history to be rejected.
func TestPostgresLinearizabilityCheckRejectsABrokenStore(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	setup, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	setup.Close()
	size := linSize{procs: 2, goroutines: 4, ops: 150, keys: 3}
	out := linChildren(t, pgtest.DSN(t), table, size, "drop", nil, nil)
	require.Zero(t, out.omitted, "calls failed: %q", out.errs)
	res := linearize.Check(out.recs, linKeys(size.keys), true, linCheckTimeout)
	require.Equal(t, porcupine.Illegal, res.Verdict, "the checker accepted %d calls of a store that drops writes", res.Ops)
}

// TestPostgresBatchesAreLinearizable mixes MetaBatch calls into a
// workload on the shared server, through a proxy that resets every
// connection a few times, and checks the history as one map.
func TestPostgresBatchesAreLinearizable(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	u, err := url.Parse(pgtest.DSN(t))
	require.NoError(t, err)
	proxy, err := faultproxy.Start(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()
	s, err := runlease.OpenPostgres(t.Context(), u.String(), runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })

	w := &linearize.Workload{Keys: linKeys(3), Values: linValues, BatchShare: 0.3, Now: history.Mono, Timeout: 20 * time.Second}
	stop := make(chan struct{})
	resets := make(chan int, 1)
	go func() {
		n := 0
		defer func() { resets <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(400 * time.Millisecond):
				proxy.Reset()
				n++
			}
		}
	}()
	recs := linRun(t, s, w, 6, 150, true)
	close(stop)
	res := requireLinearizable(t, recs, w.Keys, false)
	assert.Positive(t, linCount(recs).batchesApplied, "no batch was applied")
	t.Logf("%d resets; %d calls checked, %d with an unknown outcome", <-resets, res.Ops, res.Uncertain)
}

// TestPostgresIsLinearizableWhenCallsAreCancelled gives some calls a
// deadline of a few milliseconds, so that contexts end before, while and
// after statements reach the server (pgx then drops the connection), with
// batches in the mix; the history is checked as one map.
func TestPostgresIsLinearizableWhenCallsAreCancelled(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	pool := pgtest.Pool(t)
	s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(pgtest.NewTable(t, pool)))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	w := &linearize.Workload{Keys: linKeys(3), Values: linValues, BatchShare: 0.25, Now: history.Mono,
		Timeout: 20 * time.Second, CutShare: 0.15, CutWithin: 4 * time.Millisecond}
	recs := linRun(t, s, w, 6, 150, true)
	res := requireLinearizable(t, recs, w.Keys, false)
	assert.Positive(t, res.Uncertain, "no call was cut short while in flight")
}
