//go:build linux

package runlease_test

// Lease safety under pauses and kills, on the shared Postgres store: three
// child processes of eight drivers each compete for four runs with the
// shortest TTL, keep their leases with a Keeper, and advance each run in
// supersteps that write downstream (a plain table with a fence condition)
// and then checkpoint through lease.Write. The parent freezes children
// (SIGSTOP, for 0.2 to 2 TTLs, then SIGCONT) and kills them (SIGKILL, then
// a replacement with new holder strings) at random, and checks what the
// children streamed; internal/chaos documents each check and why it is
// sound. The slot test, in chaos_slots_test.go, shares the machinery.
//
// Linux only, with RUNLEASE_TEST_POSTGRES set (they skip without it):
//
//	go test -race -run TestChaos -count=1 -v .             # CI size: 25 s of faults each
//	go test -race -tags chaos -run TestChaos -count=1 -v . # full size: 60 s each
//	RUNLEASE_CHAOS_FOR=2m go test -race -run TestChaos -count=1 -v .
//
// Each check is shown to fail by a deliberately broken holder, chosen with
// RUNLEASE_CHAOS_BREAK (ignore-keeper, ckpt-unfenced, downstream-unfenced,
// slots-ignore-keeper): with it set, the test it targets passes only if its
// check reports violations. internal/chaos's own tests feed the checks
// hand-made violating histories on every run.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/chaos"
	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/proctest"
)

var roleChaosLease = proctest.Register("chaos-lease-driver", func() int { return chaos.RunChild(clConns, clChild) })

const (
	clProcs   = 3
	clDrivers = 8 // per process; driver g drives run g mod clRuns
	clRuns    = 4
	clConns   = 8 // per process: the drivers, renewals and the listener share them
	clTTL     = runlease.MinTTL
	// clInterval is the keeper's default renewal interval at clTTL.
	clInterval = clTTL / 3
	// clBound is the takeover latency that 99% of takeovers must beat,
	// counted from the fault: the lease expires at most a TTL after the
	// last renewal before the fault, plus a renewal interval for a renewal
	// that was late, plus a second of slack for a loaded machine.
	clBound = clTTL + clInterval + time.Second

	clDownFenced   = `UPDATE %s SET fence = $2, seq = $3 WHERE id = $1 AND fence <= $2`
	clDownUnfenced = `UPDATE %s SET fence = $2, seq = $3 WHERE id = $1` // BreakDownUnfenced
	clDownSchema   = `CREATE TABLE %s (id text PRIMARY KEY, fence bigint NOT NULL, seq bigint NOT NULL)`
)

func clRun(i int) string { return fmt.Sprintf("run-%d", i) }

// clChild runs one process's drivers until the stop time.
func clChild(r *chaos.Run) {
	mode := chaos.BreakMode()
	sql := clDownFenced
	if mode == chaos.BreakDownUnfenced {
		sql = clDownUnfenced
	}
	var wg sync.WaitGroup
	for g := range clDrivers {
		d := &clDriver{r: r, run: clRun(g % clRuns), mode: mode,
			holder:  runlease.HolderFor("chaos", fmt.Sprintf("gen%d-slot%d-d%d", r.Gen, r.Slot, g)),
			downSQL: fmt.Sprintf(sql, pgx.Identifier{r.Down}.Sanitize())}
		wg.Go(func() {
			for time.Now().Before(r.StopAt) {
				d.tenure()
			}
		})
	}
	wg.Wait()
}

// clDriver is one run driver. Pinning each driver to one run keeps two
// drivers of every process waiting on every run, so a takeover never waits
// for a driver to come round to the run: its latency measures the lease.
type clDriver struct {
	r       *chaos.Run
	run     string
	holder  string
	mode    string
	downSQL string
}

// ignoresKeeper reports whether this driver is a broken one that acts
// whatever its keeper says.
func (d *clDriver) ignoresKeeper() bool { return d.mode != "" }

// tenure acquires the run, advances it a few supersteps and releases it.
func (d *clDriver) tenure() {
	acqCtx, cancel := context.WithDeadline(d.r.Ctx, d.r.StopAt)
	defer cancel()
	t0 := history.Mono()
	lease, err := runlease.AcquireWait(acqCtx, d.r.Store, d.run, d.holder, runlease.WithTTL(clTTL))
	t1 := history.Mono() // after Acquire returned: see chaos.Tenure
	if err != nil {
		if acqCtx.Err() == nil {
			d.r.Out.Errorf("acquire %s: %v", d.run, err)
			chaos.Sleep(acqCtx, 100*time.Millisecond)
		}
		return
	}
	// Keep is given the process's context, not acqCtx: the run must not
	// stop renewing when the time to start new tenures is over.
	keeper, err := runlease.Keep(d.r.Ctx, lease)
	if err != nil {
		d.r.Out.Errorf("keep %s at fence %d: %v", d.run, lease.Fence(), err)
		return
	}
	d.emit(chaos.Event{Kind: chaos.KindGrant, T0: t0, T1: t1, Trust: d.trust(keeper)}, lease)
	why := d.supersteps(lease, keeper)
	// Read before Release is called, and after the loss was seen: the
	// earliest of this and TrustedUntil ends the trusted window.
	stop := history.Mono()
	d.emit(chaos.Event{Kind: chaos.KindEnd, T0: stop, Trust: d.trust(keeper), Res: why}, lease)
	relCtx, cancel := context.WithTimeout(d.r.Ctx, 20*time.Second)
	defer cancel()
	if err := keeper.Release(relCtx); err != nil && !errors.Is(err, runlease.ErrLeaseLost) {
		d.r.Out.Errorf("release %s at fence %d: %v", d.run, lease.Fence(), err)
	}
}

// supersteps advances the run 2 to 4 steps: work, a downstream write, a
// checkpoint. A correct driver, as the README shows one, works under
// keeper.Context() and stops at the first sign of loss: the context ends,
// a fenced write is refused. A driver resumed from a pause may still begin
// a write before the keeper's goroutine has run and cancelled the context;
// the test counts those writes (zombie acts) and the fences must refuse
// them. It returns why it stopped.
func (d *clDriver) supersteps(lease *runlease.Lease, keeper *runlease.Keeper) string {
	ctx := keeper.Context()
	if d.ignoresKeeper() {
		ctx = d.r.Ctx
	}
	steps := 2 + rand.IntN(3)
	for seq := 1; seq <= steps && time.Now().Before(d.r.StopAt); seq++ {
		if !chaos.Sleep(ctx, time.Duration(100+rand.IntN(500))*time.Millisecond) {
			return chaos.Reason(keeper.Err())
		}
		if res := d.downstream(ctx, lease, seq); res != chaos.ResOK && !d.ignoresKeeper() {
			return "downstream " + res
		}
		if res := d.checkpoint(ctx, lease, keeper, seq); res != chaos.ResOK && !d.ignoresKeeper() {
			return "checkpoint " + res
		}
	}
	if err := keeper.Err(); err != nil && !d.ignoresKeeper() {
		return chaos.Reason(err)
	}
	return "release"
}

// downstream writes the step to the downstream table, which refuses a
// fence lower than the one it holds.
func (d *clDriver) downstream(ctx context.Context, lease *runlease.Lease, seq int) string {
	t0 := history.Mono()
	tag, err := d.r.Pool.Exec(ctx, d.downSQL, d.run, int64(lease.Fence()), seq)
	t1 := history.Mono()
	res := chaos.ResRefused
	switch {
	case err != nil: // cancelled or failed in flight: it may have been applied
		res = chaos.ResUnknown
	case tag.RowsAffected() == 1:
		res = chaos.ResOK
	}
	d.emit(chaos.Event{Kind: chaos.KindDown, Seq: seq, T0: t0, T1: t1, Res: res}, lease)
	return res
}

// checkpoint writes the step's checkpoint, and its entry in the checkpoint
// log, with lease.Write: atomically with a renewal of the lease, or not at
// all.
func (d *clDriver) checkpoint(ctx context.Context, lease *runlease.Lease, keeper *runlease.Keeper, seq int) string {
	trust := d.trust(keeper)
	key, value := "ckpt:"+d.run, chaos.CkptValue(lease.Fence(), seq)
	logKey := chaos.CkptLogKey(d.run, lease.Fence(), seq)
	t0 := history.Mono()
	var res string
	if d.mode == chaos.BreakCkptUnfenced {
		res = d.unfencedCheckpoint(ctx, key, value, logKey)
	} else {
		err := lease.Write(ctx, runlease.Put(key, value), runlease.Put(logKey, d.holder))
		res = chaos.ResOK
		switch {
		case runlease.IsOutcomeUnknown(err):
			// Also when the lease is lost: the checkpoint may have
			// landed just before (a keeper that ended cut the call short).
			res = chaos.ResUnknown
		case errors.Is(err, runlease.ErrLeaseLost):
			res = chaos.ResLost
		case err != nil:
			res = chaos.ResUnknown
		}
	}
	t1 := history.Mono()
	d.emit(chaos.Event{Kind: chaos.KindCkpt, Seq: seq, T0: t0, T1: t1, Trust: trust, Res: res}, lease)
	return res
}

// unfencedCheckpoint is the broken checkpoint of BreakCkptUnfenced: a read
// and a compare-and-swap on the checkpoint key alone, which nothing ties to
// the lease.
func (d *clDriver) unfencedCheckpoint(ctx context.Context, key, value, logKey string) string {
	cur, found, err := d.r.Store.MetaGet(ctx, key)
	if err != nil {
		return chaos.ResUnknown
	}
	var expected *string
	if found {
		expected = &cur
	}
	ok, err := d.r.Store.MetaCAS(ctx, key, expected, value)
	switch {
	case err != nil:
		return chaos.ResUnknown
	case !ok:
		return chaos.ResLost
	}
	if _, err := d.r.Store.MetaCAS(ctx, logKey, nil, d.holder); err != nil {
		return chaos.ResUnknown
	}
	return chaos.ResOK
}

// trust returns the keeper's TrustedUntil on the Mono clock, or 0 for a
// driver that does not consult it.
func (d *clDriver) trust(k *runlease.Keeper) int64 {
	if d.mode == chaos.BreakIgnoreKeeper {
		return 0
	}
	return chaos.MonoOf(k.TrustedUntil())
}

func (d *clDriver) emit(ev chaos.Event, lease *runlease.Lease) {
	ev.Run, ev.Holder, ev.Fence = d.run, d.holder, lease.Fence()
	d.r.Out.Emit(ev)
}

// chaosWindow returns how long to inject faults, and logs how to change it:
// 25 s by default, 60 s with `-tags chaos`, or RUNLEASE_CHAOS_FOR.
func chaosWindow(t *testing.T) time.Duration {
	t.Helper()
	window, err := chaos.Window()
	require.NoError(t, err)
	t.Logf("injecting faults for %v (-tags chaos: %v; %s overrides)", window, chaos.FullWindow, chaos.EnvFor)
	return window
}

// chaosStore returns a pool and a store on a fresh table for the parent.
func chaosStore(t *testing.T) (*pgxpool.Pool, *runlease.PostgresStore) {
	t.Helper()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	store, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	return pool, store
}

func TestChaosLeaseSafeUnderPausesAndKills(t *testing.T) {
	t.Parallel()
	mode := chaos.BreakMode()
	if _, ours := clCaught(&clHist{})[mode]; mode != "" && !ours {
		t.Skipf("%s=%s breaks another test's holders", chaos.EnvBreak, mode)
	}
	window := chaosWindow(t)
	pool, store := chaosStore(t)
	down := pgtest.UniqueName("runlease_test_down_")
	pgtest.DropAtCleanup(t, pool, down)
	_, err := pool.Exec(t.Context(), fmt.Sprintf(clDownSchema, pgx.Identifier{down}.Sanitize()))
	require.NoError(t, err)
	for i := range clRuns {
		_, err := pool.Exec(t.Context(), fmt.Sprintf(`INSERT INTO %s VALUES ($1, 0, 0)`, pgx.Identifier{down}.Sanitize()), clRun(i))
		require.NoError(t, err)
	}

	// The tail lets the last faults' takeovers happen before the drivers
	// stop taking runs.
	tail := clBound + time.Second
	var stopAt time.Time
	env := chaos.Env{Table: store.Table(), Down: down, StopIn: window + tail}
	plan := chaos.Plan{For: window, MaxDown: clProcs - 1, KillOdds: 0.3,
		Pause: [2]time.Duration{clTTL / 5, 2 * clTTL}, Gap: [2]time.Duration{500 * time.Millisecond, 2500 * time.Millisecond}}
	in := chaos.NewInjector(t, plan, clProcs, chaos.Spawner(t, roleChaosLease, env, &stopAt))
	stopAt = time.Now().Add(window + tail)
	in.Run(t)
	events := in.Collect(t, time.Until(stopAt)+90*time.Second)

	h := clHistory(t, store, pool, down, events, in.Faults)
	h.report(t, in)
	if mode != "" {
		h.expectCaught(t, mode)
		return
	}
	assert.Empty(t, h.problems, "histories that do not add up")
	assert.Empty(t, h.errs, "errors no fault explains")
	assert.Empty(t, h.fences, "fence violations")
	assert.Empty(t, h.trust, "trusted windows that overlapped a successor's grant")
	assert.Empty(t, h.ckpts, "checkpoint violations")
	assert.Empty(t, h.down, "downstream violations")
	assert.Positive(t, in.Count(chaos.FaultPause), "no pause was injected")
	assert.Positive(t, h.okCkpts, "no checkpoint landed")
	if eligible := h.eligible(); len(eligible) > 0 {
		assert.LessOrEqual(t, chaos.Percentile(eligible, 99), clBound,
			"p99 takeover latency after a pause past the TTL or a kill: %s", chaos.Summary(eligible))
	}
}

// clHist is a lease chaos run's history and what the checks made of it.
type clHist struct {
	tenures      []chaos.Tenure
	ckptW, downW []chaos.Write
	landed       int
	okCkpts      int
	takeovers    []chaos.Takeover

	problems, errs             []string
	fences, trust, ckpts, down []string
}

// clHistory reads the store's and the downstream table's final state and
// runs every check on the events.
func clHistory(t *testing.T, store *runlease.PostgresStore, pool *pgxpool.Pool, down string,
	events []chaos.Event, faults []chaos.Fault) *clHist {
	t.Helper()
	killed := chaos.KillTimes(faults)
	h := &clHist{ckptW: chaos.Writes(events, chaos.KindCkpt), downW: chaos.Writes(events, chaos.KindDown)}
	h.tenures, h.problems = chaos.Tenures(events, killed)
	for _, ev := range events {
		if ev.Kind == chaos.KindErr {
			h.errs = append(h.errs, fmt.Sprintf("slot %d gen %d: %s", ev.Slot, ev.Gen, ev.Msg))
		}
	}
	for _, w := range h.ckptW {
		if w.Res == chaos.ResOK {
			h.okCkpts++
		}
	}

	final, landed, downFinal := clFinalState(t, store, pool, down)
	h.landed = len(landed)
	h.fences = chaos.CheckFences(h.tenures)
	h.trust = chaos.CheckTrust(h.tenures)
	h.ckpts = chaos.CheckCheckpoints(chaos.Checkpoints{Tenures: h.tenures, Attempts: h.ckptW, Landed: landed,
		Final: final, Killed: killed})
	h.down = chaos.CheckDownstream(chaos.Downstream{Writes: h.downW, Final: downFinal, Tenures: h.tenures, Killed: killed})
	h.takeovers = chaos.Takeovers(h.tenures, faults, clProcs, clTTL, clTTL, clBound)
	return h
}

// clFinalState reads each run's final checkpoint, the checkpoint log (what
// landed, by the store's own record) and the downstream table.
func clFinalState(t *testing.T, store *runlease.PostgresStore, pool *pgxpool.Pool, down string) (
	map[string]string, []chaos.Write, map[string]chaos.FenceSeq) {
	t.Helper()
	ctx := t.Context()
	final := map[string]string{}
	for i := range clRuns {
		v, found, err := store.MetaGet(ctx, "ckpt:"+clRun(i))
		require.NoError(t, err)
		if found {
			final[clRun(i)] = v
		}
	}
	rows, err := store.MetaScan(ctx, chaos.CkptLogPrefix)
	require.NoError(t, err)
	var landed []chaos.Write
	for _, row := range rows {
		w, err := chaos.ParseCkptLogKey(row.Key)
		require.NoError(t, err)
		landed = append(landed, w)
	}
	downFinal := map[string]chaos.FenceSeq{}
	dr, err := pool.Query(ctx, fmt.Sprintf(`SELECT id, fence, seq FROM %s`, pgx.Identifier{down}.Sanitize()))
	require.NoError(t, err)
	defer dr.Close()
	for dr.Next() {
		var id string
		var fence, seq int64
		require.NoError(t, dr.Scan(&id, &fence, &seq))
		downFinal[id] = chaos.FenceSeq{Fence: uint64(fence), Seq: int(seq)}
	}
	require.NoError(t, dr.Err())
	return final, landed, downFinal
}

// eligible returns the latencies of the takeovers that some other process
// was up to make.
func (h *clHist) eligible() []time.Duration {
	var out []time.Duration
	for _, to := range h.takeovers {
		if to.Eligible {
			out = append(out, to.Latency)
		}
	}
	return out
}

// report logs the figures of the run and the first violations of each
// check.
func (h *clHist) report(t *testing.T, in *chaos.Injector) {
	t.Helper()
	longPauses := 0
	for _, f := range in.Faults {
		if f.Kind == chaos.FaultPause && f.Duration() >= clTTL {
			longPauses++
		}
	}
	byKind := map[string][]time.Duration{}
	ineligible := 0
	for _, to := range h.takeovers {
		if !to.Eligible {
			ineligible++
			continue
		}
		byKind[to.Fault.Kind] = append(byKind[to.Fault.Kind], to.Latency)
	}
	zc, sc := chaos.Acts(h.tenures, h.ckptW)
	zd, sd := chaos.Acts(h.tenures, h.downW)
	t.Logf("lease chaos: %d processes x %d drivers on %d runs; %d pauses (%d of them >= TTL), %d kills; %d grants",
		clProcs, clDrivers, clRuns, in.Count(chaos.FaultPause), longPauses, in.Count(chaos.FaultKill), len(h.tenures))
	t.Logf("checkpoints: %d attempts %v, %d landed; downstream: %d attempts %v",
		len(h.ckptW), chaos.CountResults(h.ckptW), h.landed, len(h.downW), chaos.CountResults(h.downW))
	t.Logf("acts after the trusted window (zombies): checkpoints %v, downstream %v; "+
		"acts after a successor's grant (stale): checkpoints %v, downstream %v", zc, zd, sc, sd)
	t.Logf("takeover latency from the fault: after a pause >= TTL %s; after a kill %s; bound %v; %d samples without another process up",
		chaos.Summary(byKind[chaos.FaultPause]), chaos.Summary(byKind[chaos.FaultKill]), clBound, ineligible)
	t.Logf("takeover samples (fault, run, latency, another process up): %s", chaos.FormatTakeovers(h.takeovers))
	t.Logf("violations: fences %d, trust %d, checkpoints %d, downstream %d; history problems %d; errors %d",
		len(h.fences), len(h.trust), len(h.ckpts), len(h.down), len(h.problems), len(h.errs))
	for name, list := range map[string][]string{"fences": h.fences, "trust": h.trust, "checkpoints": h.ckpts,
		"downstream": h.down, "problems": h.problems, "errors": h.errs} {
		for _, v := range list[:min(len(list), 5)] {
			t.Logf("%s: %s", name, v)
		}
	}
}

// clCaught maps each broken holder of this test to the violations of the
// check that must catch it.
func clCaught(h *clHist) map[string][]string {
	return map[string][]string{
		chaos.BreakIgnoreKeeper: h.trust,
		chaos.BreakCkptUnfenced: h.ckpts,
		chaos.BreakDownUnfenced: h.down,
	}
}

// expectCaught asserts that the check aimed at by a broken holder caught it.
func (h *clHist) expectCaught(t *testing.T, mode string) {
	t.Helper()
	assert.NotEmpty(t, clCaught(h)[mode], "the broken holder %q went unnoticed", mode)
}
