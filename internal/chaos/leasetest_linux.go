package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// LeaseBackend is what the parent of a lease chaos test needs of one store.
type LeaseBackend struct {
	// Role is the proctest role of the children: [RunChild] with an
	// opener of this store and [LeaseTest.Child] as the body.
	Role string
	// Env names the store's rows (Table), the sink (Down) and anything
	// else the opener reads (Extra); Run sets Slot, Gen and StopIn.
	Env Env
	// Store is the parent's own store on the children's rows, read for the
	// final checkpoints and the checkpoint log once the children are done.
	Store runlease.Store
	// ReadDown returns the sink's final (fence, seq) of every run.
	ReadDown func(ctx context.Context) (map[string]FenceSeq, error)
}

// Run runs the lease chaos test. It skips t when RUNLEASE_CHAOS_BREAK
// breaks another test's holders, logs the fault window, calls setup for
// the store (setup must make the sink hold (0, 0) for every run), starts
// lt.Procs children, injects faults for the window and checks what the
// children streamed. With a broken holder set, it passes only if the check
// aimed at it reports violations; otherwise every check must come out
// clean, a pause must have been injected and a checkpoint landed, and the
// p99 takeover latency must beat lt.Bound.
func (lt LeaseTest) Run(t *testing.T, setup func(t *testing.T) LeaseBackend) {
	t.Helper()
	mode := BreakMode()
	if _, ours := (&leaseHist{}).caught()[mode]; mode != "" && !ours {
		t.Skipf("%s=%s breaks another test's holders", EnvBreak, mode)
	}
	window, err := Window()
	require.NoError(t, err)
	t.Logf("injecting faults for %v (-tags chaos: %v; %s overrides)", window, FullWindow, EnvFor)
	be := setup(t)

	// The tail lets the last faults' takeovers happen before the drivers
	// stop taking runs.
	tail := lt.Bound + time.Second
	var stopAt time.Time
	env := be.Env
	env.StopIn = window + tail
	plan := Plan{For: window, MaxDown: lt.Procs - 1, KillOdds: 0.3,
		Pause: [2]time.Duration{lt.TTL / 5, 2 * lt.TTL}, Gap: [2]time.Duration{500 * time.Millisecond, 2500 * time.Millisecond}}
	in := NewInjector(t, plan, lt.Procs, Spawner(t, be.Role, env, &stopAt))
	stopAt = time.Now().Add(window + tail)
	in.Run(t)
	events := in.Collect(t, time.Until(stopAt)+90*time.Second)

	downFinal, err := be.ReadDown(t.Context())
	require.NoError(t, err)
	h := lt.history(t, be.Store, downFinal, events, in.Faults)
	h.report(t, in)
	if mode != "" {
		assert.NotEmpty(t, h.caught()[mode], "the broken holder %q went unnoticed", mode)
		return
	}
	assert.Empty(t, h.problems, "histories that do not add up")
	assert.Empty(t, h.errs, "errors no fault explains")
	assert.Empty(t, h.fences, "fence violations")
	assert.Empty(t, h.trust, "trusted windows that overlapped a successor's grant")
	assert.Empty(t, h.ckpts, "checkpoint violations")
	assert.Empty(t, h.down, "downstream violations")
	assert.Positive(t, in.Count(FaultPause), "no pause was injected")
	assert.Positive(t, h.okCkpts, "no checkpoint landed")
	if eligible := h.eligible(); len(eligible) > 0 {
		assert.LessOrEqual(t, Percentile(eligible, 99), lt.Bound,
			"p99 takeover latency after a pause past the TTL or a kill: %s", Summary(eligible))
	}
}

// leaseHist is a lease chaos run's history and what the checks made of it.
type leaseHist struct {
	lt           LeaseTest
	tenures      []Tenure
	ckptW, downW []Write
	landed       int
	okCkpts      int
	takeovers    []Takeover

	problems, errs             []string
	fences, trust, ckpts, down []string
}

// history reads the store's final state and runs every check on the
// events.
func (lt LeaseTest) history(t *testing.T, store runlease.Store, downFinal map[string]FenceSeq,
	events []Event, faults []Fault) *leaseHist {
	t.Helper()
	killed := KillTimes(faults)
	h := &leaseHist{lt: lt, ckptW: Writes(events, KindCkpt), downW: Writes(events, KindDown)}
	h.tenures, h.problems = Tenures(events, killed)
	for _, ev := range events {
		if ev.Kind == KindErr {
			h.errs = append(h.errs, fmt.Sprintf("slot %d gen %d: %s", ev.Slot, ev.Gen, ev.Msg))
		}
	}
	for _, w := range h.ckptW {
		if w.Res == ResOK {
			h.okCkpts++
		}
	}

	final, landed := lt.finalCheckpoints(t, store)
	h.landed = len(landed)
	h.fences = CheckFences(h.tenures)
	h.trust = CheckTrust(h.tenures)
	h.ckpts = CheckCheckpoints(Checkpoints{Tenures: h.tenures, Attempts: h.ckptW, Landed: landed,
		Final: final, Killed: killed})
	h.down = CheckDownstream(Downstream{Writes: h.downW, Final: downFinal, Tenures: h.tenures, Killed: killed})
	h.takeovers = Takeovers(h.tenures, faults, lt.Procs, lt.TTL, lt.TTL, lt.Bound)
	return h
}

// finalCheckpoints reads each run's final checkpoint and the checkpoint
// log: what landed, by the store's own record.
func (lt LeaseTest) finalCheckpoints(t *testing.T, store runlease.Store) (map[string]string, []Write) {
	t.Helper()
	ctx := t.Context()
	final := map[string]string{}
	for i := range lt.Runs {
		v, found, err := store.MetaGet(ctx, CkptKey(RunName(i)))
		require.NoError(t, err)
		if found {
			final[RunName(i)] = v
		}
	}
	rows, err := store.MetaScan(ctx, CkptLogPrefix)
	require.NoError(t, err)
	var landed []Write
	for _, row := range rows {
		w, err := ParseCkptLogKey(row.Key)
		require.NoError(t, err)
		landed = append(landed, w)
	}
	return final, landed
}

// eligible returns the latencies of the takeovers that some other process
// was up to make.
func (h *leaseHist) eligible() []time.Duration {
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
func (h *leaseHist) report(t *testing.T, in *Injector) {
	t.Helper()
	longPauses := 0
	for _, f := range in.Faults {
		if f.Kind == FaultPause && f.Duration() >= h.lt.TTL {
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
	zc, sc := Acts(h.tenures, h.ckptW)
	zd, sd := Acts(h.tenures, h.downW)
	t.Logf("lease chaos: %d processes x %d drivers on %d runs; %d pauses (%d of them >= TTL), %d kills; %d grants",
		h.lt.Procs, h.lt.Drivers, h.lt.Runs, in.Count(FaultPause), longPauses, in.Count(FaultKill), len(h.tenures))
	t.Logf("checkpoints: %d attempts %v, %d landed; downstream: %d attempts %v",
		len(h.ckptW), CountResults(h.ckptW), h.landed, len(h.downW), CountResults(h.downW))
	t.Logf("acts after the trusted window (zombies): checkpoints %v, downstream %v; "+
		"acts after a successor's grant (stale): checkpoints %v, downstream %v", zc, zd, sc, sd)
	t.Logf("takeover latency from the fault: after a pause >= TTL %s; after a kill %s; bound %v; %d samples without another process up",
		Summary(byKind[FaultPause]), Summary(byKind[FaultKill]), h.lt.Bound, ineligible)
	t.Logf("takeover samples (fault, run, latency, another process up): %s", FormatTakeovers(h.takeovers))
	t.Logf("faults (kind, child slot, start from the first, down for): %s", FormatFaults(in.Faults))
	t.Logf("violations: fences %d, trust %d, checkpoints %d, downstream %d; history problems %d; errors %d",
		len(h.fences), len(h.trust), len(h.ckpts), len(h.down), len(h.problems), len(h.errs))
	for name, list := range map[string][]string{"fences": h.fences, "trust": h.trust, "checkpoints": h.ckpts,
		"downstream": h.down, "problems": h.problems, "errors": h.errs} {
		for _, v := range list[:min(len(list), 5)] {
			t.Logf("%s: %s", name, v)
		}
	}
}

// caught maps each broken holder of the lease test to the violations of
// the check that must catch it.
func (h *leaseHist) caught() map[string][]string {
	return map[string][]string{
		BreakIgnoreKeeper: h.trust,
		BreakCkptUnfenced: h.ckpts,
		BreakDownUnfenced: h.down,
	}
}
