//go:build linux

package runlease_test

// Multi-process tests on the shared Postgres store: real operating-system
// processes, re-executing this test binary in roles (internal/proctest),
// race for the same leases and slots on one fresh table per test. Each
// child records what its holders believed, as intervals on the machine's
// CLOCK_MONOTONIC (internal/history), which every process reads alike, and
// the parent checks them. internal/history explains why the recorded
// intervals make the checks sound: an interval starts after the claim
// returned and ends before the release was called, so it lies inside the
// store's own tenure, and two overlapping intervals prove two holders at
// once. These tests need Linux: CLOCK_MONOTONIC across processes, SIGSTOP
// and /proc.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
)

var (
	roleMPLeaseRacer = proctest.Register("mp-lease-racer", func() int { return mpRace(mpLeaseRacer) })
	roleMPSlotRacer  = proctest.Register("mp-slot-racer", func() int { return mpRace(mpSlotRacer) })
	roleMPStalled    = proctest.Register("mp-stalled-holder", mpStalledHolder)
)

const (
	envMPTable = "RUNLEASE_TEST_MP_TABLE" // the table every process shares
	envMPProc  = "RUNLEASE_TEST_MP_PROC"  // the child's number, from 0
	envMPOrder = "RUNLEASE_TEST_MP_ORDER" // the stalled holder's calls, such as "renew,release"

	mpProcs      = 3
	mpGoroutines = 8
	mpRuns       = 4               // run ids the lease racers share
	mpSlotLimit  = 3               // the slot racers' MemScope limit
	mpRaceFor    = 3 * time.Second // how long the racers race
	// mpTTL is far longer than any tenure of the racers, so no lease or
	// slot is ever taken over by expiry: any overlap is a broken
	// compare-and-swap, not a slow holder.
	mpTTL = time.Minute
	// mpTimeout bounds each wait for a child; starting a race-enabled
	// binary on a loaded machine can take seconds.
	mpTimeout = 60 * time.Second

	mpStalledRun = "stalled-run"
)

var (
	mpStalledHolderID = runlease.HolderFor("p", "stalled-child")
	mpReplacementID   = runlease.HolderFor("p", "replacement")
)

// mpLine is one line a racing child prints: a tenure ("held"), an error
// other than an expected refusal ("error"), or a goroutine's count of
// refusals ("refused").
type mpLine struct {
	Kind string `json:"kind"`
	history.Interval
	Err string `json:"err,omitempty"`
	N   int    `json:"n,omitempty"`
}

// mpRacer is the state one racing child shares among its goroutines.
type mpRacer struct {
	store runlease.Store
	proc  int
	until time.Time

	mu    sync.Mutex
	lines []mpLine
}

func (r *mpRacer) add(l mpLine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, l)
}

func (r *mpRacer) held(iv history.Interval) { r.add(mpLine{Kind: "held", Interval: iv}) }
func (r *mpRacer) fail(err error)           { r.add(mpLine{Kind: "error", Err: err.Error()}) }

// mpPause holds or backs off for up to a millisecond.
func mpPause() { time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond) }

// mpOpen opens the shared table from a child, with a connection for each
// racing goroutine so that they race at the server, not for the pool.
func mpOpen(ctx context.Context) (*runlease.PostgresStore, func(), error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv(pgtest.EnvDSN))
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = mpGoroutines
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	s, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(os.Getenv(envMPTable)), runlease.WithCreateTable(false))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return s, func() { s.Close(); pool.Close() }, nil
}

// mpRace is the body of a racing child: open the store, print "ready", wait
// for the parent's start signal, run race in each goroutine until the time
// is up, then print every line recorded as JSON.
func mpRace(race func(ctx context.Context, r *mpRacer, g int)) int {
	proc, err := strconv.Atoi(os.Getenv(envMPProc))
	if err != nil {
		fmt.Fprintln(os.Stderr, envMPProc, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), mpRaceFor+mpTimeout)
	defer cancel()
	store, closeStore, err := mpOpen(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer closeStore()
	fmt.Println("ready")
	proctest.WaitRelease() // the parent closes stdin to start every child at once
	r := &mpRacer{store: store, proc: proc, until: time.Now().Add(mpRaceFor)}
	var wg sync.WaitGroup
	for g := range mpGoroutines {
		wg.Go(func() { race(ctx, r, g) })
	}
	wg.Wait()
	enc := json.NewEncoder(os.Stdout)
	for _, l := range r.lines {
		if err := enc.Encode(l); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// mpLeaseRacer acquires random runs of the shared few, renews once or
// twice and releases, until the time is up. A refusal (ErrLeaseLost) is
// the expected answer while another holder has the run.
func mpLeaseRacer(ctx context.Context, r *mpRacer, g int) {
	holder := runlease.HolderFor("p", fmt.Sprintf("proc%d-g%d", r.proc, g))
	refused := 0
	for time.Now().Before(r.until) {
		run := fmt.Sprintf("run-%d", rand.IntN(mpRuns))
		lease, err := runlease.Acquire(ctx, r.store, run, holder, runlease.WithTTL(mpTTL))
		start := history.Mono() // after Acquire returned: see internal/history
		if errors.Is(err, runlease.ErrLeaseLost) {
			refused++
			mpPause()
			continue
		}
		if err != nil {
			r.fail(fmt.Errorf("acquire %s: %w", run, err))
			continue
		}
		for range 1 + rand.IntN(2) {
			mpPause()
			if err := lease.Renew(ctx); err != nil {
				r.fail(fmt.Errorf("renew %s at fence %d: %w", run, lease.Fence(), err))
				break
			}
		}
		end := history.Mono() // before Release is called
		err = lease.Release(ctx)
		r.held(history.Interval{Key: run, Holder: holder, Fence: lease.Fence(), Start: start, End: end, Proc: r.proc})
		if err != nil {
			r.fail(fmt.Errorf("release %s at fence %d: %w", run, lease.Fence(), err))
		}
	}
	r.add(mpLine{Kind: "refused", N: refused})
}

// mpSlotRacer claims a slot of the shared scope for its own run, renews
// once and releases, until the time is up. A refusal (ErrConcurrencyLimit)
// is the expected answer while every slot is held.
func mpSlotRacer(ctx context.Context, r *mpRacer, g int) {
	runID := fmt.Sprintf("proc%d-g%d", r.proc, g)
	scopes := []runlease.Scope{runlease.MemScope(mpSlotLimit)}
	refused := 0
	for time.Now().Before(r.until) {
		slots, err := runlease.ClaimSlots(ctx, r.store, runID, scopes, runlease.WithTTL(mpTTL))
		start := history.Mono() // after ClaimSlots returned
		if errors.Is(err, runlease.ErrConcurrencyLimit) {
			refused++
			mpPause()
			continue
		}
		if err != nil {
			r.fail(fmt.Errorf("claim for %s: %w", runID, err))
			continue
		}
		held := slots.Held()
		if len(held) != 1 || held[0].Scope != "mem" || held[0].Slot < 0 || held[0].Slot >= mpSlotLimit {
			r.fail(fmt.Errorf("run %s holds %+v after claiming one scope", runID, held))
		}
		mpPause()
		if err := slots.Renew(ctx); err != nil {
			r.fail(fmt.Errorf("renew slots of %s: %w", runID, err))
		}
		mpPause()
		end := history.Mono() // before Release is called
		err = slots.Release(ctx)
		for _, h := range held {
			r.held(history.Interval{Key: h.Key, Holder: runID, Start: start, End: end, Proc: r.proc})
		}
		if err != nil || len(slots.Held()) != 0 {
			r.fail(fmt.Errorf("release slots of %s: %v, still held %+v", runID, err, slots.Held()))
		}
	}
	r.add(mpLine{Kind: "refused", N: refused})
}

// mpResult is what the stalled holder prints for each call it makes after
// it was continued.
type mpResult struct {
	Op     string `json:"op"`
	Code   string `json:"code"`
	Cause  string `json:"cause,omitempty"`
	Holder string `json:"holder,omitempty"` // the holder the error names
	Fence  uint64 `json:"fence,omitempty"`
}

// mpStalledHolder acquires mpStalledRun with the shortest TTL, prints
// "held <fence>", and blocks until stdin closes; the parent stops it there,
// lets the lease expire and takes the run over. Then it makes the calls
// listed in envMPOrder with its stale lease and prints each result.
func mpStalledHolder() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*mpTimeout)
	defer cancel()
	store, closeStore, err := mpOpen(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer closeStore()
	lease, err := runlease.Acquire(ctx, store, mpStalledRun, mpStalledHolderID, runlease.WithTTL(runlease.MinTTL))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("held %d\n", lease.Fence())
	proctest.WaitRelease()
	calls := map[string]func(context.Context) error{"renew": lease.Renew, "release": lease.Release}
	enc := json.NewEncoder(os.Stdout)
	for op := range strings.SplitSeq(os.Getenv(envMPOrder), ",") {
		call, ok := calls[op]
		if !ok {
			fmt.Fprintln(os.Stderr, "unknown call", op)
			return 1
		}
		err := call(ctx)
		res := mpResult{Op: op, Code: runlease.Code(err)}
		if lost, ok := errors.AsType[*runlease.LeaseLostError](err); ok {
			res.Cause, res.Holder, res.Fence = fmt.Sprint(lost.Cause), lost.Holder, lost.Fence
		}
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// mpStore returns the parent's store on a fresh table, created here so the
// children only open it, and the table's name. The table is dropped when t
// ends, after the children are killed.
func mpStore(t *testing.T) (*runlease.PostgresStore, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, table
}

// mpOutcome is what the racing children printed, gathered.
type mpOutcome struct {
	tenures []history.Interval
	perProc [mpProcs]int // tenures recorded by each child
	refused int
	errs    []string
}

// mpRaceChildren runs mpProcs children in role against table, starting
// them at once, and gathers their lines once they have all exited.
func mpRaceChildren(t *testing.T, role, table string) mpOutcome {
	t.Helper()
	children := make([]*proctest.Child, mpProcs)
	for i := range children {
		children[i] = proctest.Start(t, role, envMPTable+"="+table, envMPProc+"="+strconv.Itoa(i))
	}
	for _, c := range children {
		require.NoError(t, c.WaitLine("ready", mpTimeout))
	}
	for _, c := range children {
		c.Release()
	}
	var out mpOutcome
	for i, c := range children {
		code, err := c.Wait(mpRaceFor + mpTimeout)
		require.NoError(t, err)
		require.Zero(t, code, "child %d exited with %d; stderr:\n%s", i, code, c.Stderr())
		lines := c.Lines()
		require.NotEmpty(t, lines)
		for _, raw := range lines[1:] { // after "ready"
			var l mpLine
			require.NoError(t, json.Unmarshal([]byte(raw), &l), "child %d printed %q", i, raw)
			switch l.Kind {
			case "held":
				out.tenures = append(out.tenures, l.Interval)
				out.perProc[i]++
			case "refused":
				out.refused += l.N
			default:
				out.errs = append(out.errs, fmt.Sprintf("child %d: %s", i, l.Err))
			}
		}
	}
	return out
}

// mpFirst returns at most the first ten of problems, for a readable failure.
func mpFirst(problems []string) []string { return problems[:min(len(problems), 10)] }

// mpHandovers counts the times a key passed from a holder in one process to
// a holder in another, and returns the shortest time between a release
// starting and the next tenure of its key beginning: how close the checks
// came to seeing an overlap.
func mpHandovers(ivs []history.Interval) (cross int, closest time.Duration) {
	closest = -1
	byKey := map[string][]history.Interval{}
	for _, iv := range ivs {
		byKey[iv.Key] = append(byKey[iv.Key], iv)
	}
	for _, list := range byKey {
		slices.SortFunc(list, func(a, b history.Interval) int { return cmp.Compare(a.Start, b.Start) })
		for i := 1; i < len(list); i++ {
			if list[i].Proc != list[i-1].Proc {
				cross++
			}
			if gap := time.Duration(list[i].Start - list[i-1].End); closest < 0 || gap < closest {
				closest = gap
			}
		}
	}
	return cross, closest
}

func mpByKey(iv history.Interval) string    { return iv.Key }
func mpByHolder(iv history.Interval) string { return iv.Holder }

func TestMultiProcessOneHolderPerRun(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	store, table := mpStore(t)
	out := mpRaceChildren(t, roleMPLeaseRacer, table)

	assert.Empty(t, mpFirst(out.errs), "%d errors other than ErrLeaseLost refusals", len(out.errs))
	for p, n := range out.perProc {
		assert.Positive(t, n, "child %d acquired nothing", p)
	}
	assert.Positive(t, out.refused, "no acquisition was refused: the runs were not contended")
	for _, iv := range out.tenures {
		require.Less(t, time.Duration(iv.End-iv.Start), mpTTL/2, "a tenure came near the TTL, so takeover by expiry was possible: %v", iv)
	}
	overlaps := history.Overlaps(out.tenures, mpByKey)
	assert.Empty(t, mpFirst(overlaps), "%d times two holders held one run at once", len(overlaps))
	// Fences are 1..n per run in the order of the tenures: every
	// acquisition was recorded (none failed), and each raised the fence
	// by exactly one over the previous holder's.
	fences := history.Fences(out.tenures, true)
	assert.Empty(t, mpFirst(fences), "%d fence violations", len(fences))

	// The store agrees: each run is released at the last fence recorded.
	last := map[string]uint64{}
	for _, iv := range out.tenures {
		last[iv.Key] = max(last[iv.Key], iv.Fence)
	}
	for run, fence := range last {
		info, err := runlease.Peek(t.Context(), store, run)
		require.NoError(t, err)
		assert.True(t, info.Released, "run %s: %+v", run, info)
		assert.Equal(t, fence, info.Fence, "run %s", run)
	}
	cross, closest := mpHandovers(out.tenures)
	t.Logf("%d acquisitions (per child %v), %d refusals; last fence per run %v; "+
		"%d handovers between processes, the closest %v after the release began",
		len(out.tenures), out.perProc, out.refused, last, cross, closest)
}

func TestMultiProcessSlotCap(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	store, table := mpStore(t)
	out := mpRaceChildren(t, roleMPSlotRacer, table)

	assert.Empty(t, mpFirst(out.errs), "%d errors other than ErrConcurrencyLimit refusals", len(out.errs))
	for p, n := range out.perProc {
		assert.Positive(t, n, "child %d claimed nothing", p)
	}
	assert.Positive(t, out.refused, "no claim was refused: the scope was not contended")
	for _, iv := range out.tenures {
		require.Less(t, time.Duration(iv.End-iv.Start), mpTTL/2, "a tenure came near the TTL, so takeover by expiry was possible: %v", iv)
	}
	peak, at := history.Peak(out.tenures)
	assert.LessOrEqual(t, peak, mpSlotLimit, "%d runs held a slot at once: %v", peak, at)
	bySlot := history.Overlaps(out.tenures, mpByKey)
	assert.Empty(t, mpFirst(bySlot), "%d times two runs held one slot at once", len(bySlot))
	byRun := history.Overlaps(out.tenures, mpByHolder)
	assert.Empty(t, mpFirst(byRun), "%d times one run held two slots at once", len(byRun))

	perSlot := map[string]int{}
	for _, iv := range out.tenures {
		perSlot[iv.Key]++
	}
	assert.LessOrEqual(t, len(perSlot), mpSlotLimit, "slots used: %v", perSlot)
	live, err := runlease.Occupancy(t.Context(), store)
	require.NoError(t, err)
	assert.Empty(t, live, "every slot was released")
	cross, closest := mpHandovers(out.tenures)
	t.Logf("%d claims (per child %v), %d refusals; peak %d at once; claims per slot %v; "+
		"%d handovers between processes, the closest %v after the release began",
		len(out.tenures), out.perProc, out.refused, peak, perSlot, cross, closest)
}

func TestStalledHolderIsReplacedAndCannotRenew(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	// The first call after the stall meets the store; the second meets the
	// lease's memory of the loss. Both orders, so that Renew and Release
	// are each refused by the store itself once.
	for _, order := range []string{"renew,release", "release,renew"} {
		t.Run(strings.ReplaceAll(order, ",", "_then_"), func(t *testing.T) {
			t.Parallel()
			store, table := mpStore(t)
			child := proctest.Start(t, roleMPStalled, envMPTable+"="+table, envMPOrder+"="+order)
			require.NoError(t, child.WaitLine("held 1", mpTimeout))
			info, err := runlease.Peek(t.Context(), store, mpStalledRun)
			require.NoError(t, err)
			// Not Live: on a loaded machine the 5 s may already be over.
			require.Equal(t, mpStalledHolderID, info.Holder)
			require.Equal(t, uint64(1), info.Fence)

			// Freeze the whole child, as a long GC pause or a stopped VM
			// would, and let its lease expire by the store's rows.
			require.NoError(t, syscall.Kill(child.Pid(), syscall.SIGSTOP))
			mpWaitStopped(t, child.Pid(), false)
			mpWaitExpired(t, store, mpStalledRun)
			mine, err := runlease.Acquire(t.Context(), store, mpStalledRun, mpReplacementID, runlease.WithTTL(mpTTL))
			require.NoError(t, err)
			require.Equal(t, uint64(2), mine.Fence())
			before := mpRow(t, store, mpStalledRun)
			mpWaitStopped(t, child.Pid(), true) // still frozen while replaced

			child.Release() // once continued, the child makes its calls
			require.NoError(t, syscall.Kill(child.Pid(), syscall.SIGCONT))
			code, err := child.Wait(mpTimeout)
			require.NoError(t, err)
			require.Zero(t, code, "stderr:\n%s", child.Stderr())
			lines := child.Lines()
			require.Len(t, lines, 3, "held, then one line per call: %q", lines)
			for _, raw := range lines[1:] {
				var res mpResult
				require.NoError(t, json.Unmarshal([]byte(raw), &res), raw)
				assert.Equal(t, runlease.CodeLeaseLost, res.Code, "%s: %s", res.Op, raw)
				assert.Equal(t, runlease.ErrTakenOver.Error(), res.Cause, "%s: %s", res.Op, raw)
				assert.Equal(t, mpReplacementID, res.Holder, "%s names the new holder", res.Op)
				assert.Equal(t, uint64(2), res.Fence, "%s names the new fence", res.Op)
			}

			assert.Equal(t, before, mpRow(t, store, mpStalledRun), "the stale holder changed the new holder's row")
			require.NoError(t, mine.Renew(t.Context()))
			info, err = runlease.Peek(t.Context(), store, mpStalledRun)
			require.NoError(t, err)
			assert.True(t, info.Live)
			assert.Equal(t, mpReplacementID, info.Holder)
			assert.Equal(t, uint64(2), info.Fence)
			require.NoError(t, mine.Release(t.Context()))
		})
	}
}

// mpRow returns the lease row of run, byte for byte.
func mpRow(t *testing.T, store runlease.Store, run string) string {
	t.Helper()
	raw, found, err := store.MetaGet(t.Context(), runlease.LeasePrefix+run)
	require.NoError(t, err)
	require.True(t, found)
	return raw
}

// mpWaitExpired polls the store until run's lease is no longer live.
func mpWaitExpired(t *testing.T, store runlease.Store, run string) {
	t.Helper()
	deadline := time.Now().Add(runlease.MinTTL + 10*time.Second)
	for {
		info, err := runlease.Peek(t.Context(), store, run)
		require.NoError(t, err)
		if !info.Live {
			return
		}
		require.True(t, time.Now().Before(deadline), "the lease is still live: %+v", info)
		time.Sleep(50 * time.Millisecond)
	}
}

// mpWaitStopped waits until the process is stopped by a signal (state T in
// /proc/<pid>/stat), or fails t after a few seconds; with once set it
// only looks once.
func mpWaitStopped(t *testing.T, pid int, once bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		require.NoError(t, err)
		// The state follows the command name, which is in parentheses
		// and may itself hold any character.
		i := strings.LastIndexByte(string(stat), ')')
		require.Positive(t, i, "%q", stat)
		state := strings.TrimSpace(string(stat[i+1:]))[0]
		if state == 'T' {
			return
		}
		require.True(t, !once && time.Now().Before(deadline), "process %d is in state %c, not stopped", pid, state)
		time.Sleep(10 * time.Millisecond)
	}
}
