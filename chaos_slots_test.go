//go:build linux

package runlease_test

// The slot cap under pauses and kills, on the shared Postgres store: two
// child processes of six competitors each claim slots of one scope of
// limit 3, each holding a lease on its own run id (the authority) and
// keeping both with one Keeper, for a short random time. The parent pauses
// and kills the children at random and scans the slot rows every 50 ms;
// afterwards it checks what the competitors believed (see chaos.Beliefs
// for what "believe" means and why the check is sound) and how soon a
// frozen or killed holder's slot was free again.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/chaos"
	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
)

var roleChaosSlots = proctest.Register("chaos-slot-competitor", func() int { return chaos.RunChild(chaosOpener(csConns), csChild) })

const (
	csProcs       = 2
	csCompetitors = 6 // per process
	csLimit       = 3
	csConns       = 6
	csTTL         = runlease.MinTTL
	csInterval    = csTTL / 3
	// csBound is how soon after a kill (or a pause past the TTL) the
	// holder's slot must be free: its row expires at most a TTL after the
	// last renewal, plus a renewal interval for a late renewal, plus a
	// second for a loaded machine and the 50 ms scans.
	csBound = csTTL + csInterval + time.Second
	csPoll  = 50 * time.Millisecond
)

// csChild runs one process's competitors until the stop time.
func csChild(r *chaos.Run) {
	var wg sync.WaitGroup
	for g := range csCompetitors {
		run := fmt.Sprintf("comp-gen%d-slot%d-c%d", r.Gen, r.Slot, g)
		c := &csCompetitor{r: r, run: run, holder: runlease.HolderFor("chaos", run),
			ignoreKeeper: chaos.BreakMode() == chaos.BreakSlotsIgnoreKeeper}
		wg.Go(func() {
			for time.Now().Before(r.StopAt) {
				c.round()
			}
			r.Out.Emit(chaos.Event{Kind: chaos.KindRefused, Run: run, N: c.refused})
		})
	}
	wg.Wait()
}

// csCompetitor is one run that competes for a slot.
type csCompetitor struct {
	r            *chaos.Run
	run, holder  string
	ignoreKeeper bool // BreakSlotsIgnoreKeeper: believes until it releases
	refused      int
}

// round acquires the run's lease, claims a slot, holds both for a while
// under a keeper and releases them. The lease comes first so that the
// keeper's trust, counted from the lease's last write, never outlasts the
// slot row, whose expiry is stamped later.
func (c *csCompetitor) round() {
	ctx := c.r.Ctx
	t0 := history.Mono()
	lease, err := runlease.Acquire(ctx, c.r.Store, c.run, c.holder, runlease.WithTTL(csTTL))
	if err != nil {
		c.r.Out.Errorf("acquire %s: %v", c.run, err)
		chaos.Sleep(ctx, 100*time.Millisecond)
		return
	}
	slots, err := runlease.ClaimSlots(ctx, c.r.Store, c.run, []runlease.Scope{runlease.MemScope(csLimit)}, runlease.WithTTL(csTTL))
	t1 := history.Mono() // after ClaimSlots returned: the belief starts here
	if err != nil {
		if errors.Is(err, runlease.ErrConcurrencyLimit) {
			c.refused++
		} else {
			c.r.Out.Errorf("claim for %s: %v", c.run, err)
		}
		c.release(lease.Release)
		chaos.Sleep(ctx, time.Duration(20+rand.IntN(130))*time.Millisecond)
		return
	}
	held := slots.Held()
	if len(held) == 0 && !slots.TrustedUntil().After(time.Now()) {
		// A pause since the claim was sent outlasted its trust window
		// (trust counts from the send): the claim rightly trusts nothing,
		// and there is nothing to hold.
		c.release(slots.Release)
		c.release(lease.Release)
		return
	}
	if len(held) != 1 || held[0].Slot < 0 || held[0].Slot >= csLimit {
		c.r.Out.Errorf("run %s holds %+v after claiming one slot", c.run, held)
		c.release(slots.Release)
		c.release(lease.Release)
		return
	}
	b := &csBelief{start: t1}
	keeper, err := runlease.Keep(ctx, lease, runlease.KeepSlots(slots),
		runlease.WithHooks(runlease.Hooks{SlotsLost: func(runlease.SlotLossEvent) { b.trouble() }}),
		runlease.WithLogger(slog.New(&csSlotLog{on: b.trouble})))
	if err != nil {
		c.r.Out.Errorf("keep %s: %v", c.run, err)
		return
	}
	b.keeper.Store(keeper)
	c.emit(chaos.Event{Kind: chaos.KindClaim, Key: held[0].Key, T0: t0, T1: t1, Trust: c.trust(keeper)})
	why := c.hold(keeper)
	stop := history.Mono() // read after the loss was seen, before Release is called
	c.emit(chaos.Event{Kind: chaos.KindEnd, Key: held[0].Key, T0: stop, Trust: c.trust(keeper), Cap: b.capped(c), Res: why})
	c.release(keeper.Release)
}

// hold waits for a random short time, or until the keeper ends.
func (c *csCompetitor) hold(keeper *runlease.Keeper) string {
	d := time.Duration(200+rand.IntN(1800)) * time.Millisecond
	if c.ignoreKeeper {
		// The broken holder holds longer, so that more pauses catch it
		// holding: it is there to be caught within a CI-sized run.
		chaos.Sleep(c.r.Ctx, 2*d)
		return "release"
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return "release"
	case <-keeper.Done():
		return chaos.Reason(keeper.Err())
	}
}

func (c *csCompetitor) release(release func(context.Context) error) {
	ctx, cancel := context.WithTimeout(c.r.Ctx, 20*time.Second)
	defer cancel()
	if err := release(ctx); err != nil && !errors.Is(err, runlease.ErrLeaseLost) {
		c.r.Out.Errorf("release %s: %v", c.run, err)
	}
}

// trust returns the keeper's TrustedUntil on the Mono clock, or 0 for a
// competitor that ignores it.
func (c *csCompetitor) trust(k *runlease.Keeper) int64 {
	if c.ignoreKeeper {
		return 0
	}
	return chaos.MonoOf(k.TrustedUntil())
}

func (c *csCompetitor) emit(ev chaos.Event) {
	ev.Run, ev.Holder = c.run, c.holder
	c.r.Out.Emit(ev)
}

// csBelief tracks how a slot renewal that failed cuts a belief short. The
// keeper renews the slot right after the lease, and reports a slot it
// could not renew (to SlotsLost, or to the logger for a fault) before it
// moves TrustedUntil on for the lease: TrustedUntil read then is the one
// the slot's last renewal still covers, and it caps the belief.
type csBelief struct {
	start  int64
	keeper atomic.Pointer[runlease.Keeper]
	cap    atomic.Int64
}

func (b *csBelief) trouble() {
	v := b.start // the keeper is not known yet: cut the belief to nothing
	if k := b.keeper.Load(); k != nil {
		v = chaos.MonoOf(k.TrustedUntil())
	}
	for {
		old := b.cap.Load()
		if old != 0 && old <= v || b.cap.CompareAndSwap(old, v) {
			return
		}
	}
}

func (b *csBelief) capped(c *csCompetitor) int64 {
	if c.ignoreKeeper {
		return 0
	}
	return b.cap.Load()
}

// csSlotLog is a slog handler that reports the keeper's log lines about
// slots: "slot renewal failed" (a fault: the slot was not renewed) and
// "slots lost".
type csSlotLog struct{ on func() }

func (h *csSlotLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *csSlotLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *csSlotLog) WithGroup(string) slog.Handler            { return h }
func (h *csSlotLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "slot") {
		h.on()
	}
	return nil
}

// csPoller scans the slot rows until stopped: the store's own view of who
// holds which slot, for the time a slot takes to free.
type csPoller struct {
	snaps    []chaos.Snapshot
	problems []string
	done     chan struct{}
}

func csStartPoller(ctx context.Context, store runlease.Store, stop <-chan struct{}) *csPoller {
	p := &csPoller{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(csPoll)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			live, err := runlease.Occupancy(ctx, store)
			at := history.Mono() // after the scan returned
			if err != nil {
				p.problems = append(p.problems, err.Error())
				continue
			}
			snap := chaos.Snapshot{At: at, Holders: map[string]string{}}
			runs := map[string]bool{}
			for _, s := range live {
				snap.Holders[s.Key] = s.RunID
				runs[s.RunID] = true
			}
			// One scan is one statement: a consistent snapshot of the rows.
			if len(live) > csLimit || len(runs) != len(live) {
				p.problems = append(p.problems, fmt.Sprintf("scan at %d: over the limit or a run in two slots: %+v", at, live))
			}
			p.snaps = append(p.snaps, snap)
		}
	}()
	return p
}

func TestChaosSlotCapHoldsUnderPausesAndKills(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	mode := chaos.BreakMode()
	if mode != "" && mode != chaos.BreakSlotsIgnoreKeeper {
		t.Skipf("%s=%s breaks another test's holders", chaos.EnvBreak, mode)
	}
	window := chaosWindow(t)
	_, store := chaosStore(t)
	stop := make(chan struct{})
	poller := csStartPoller(t.Context(), store, stop)
	stopPolling := sync.OnceFunc(func() { close(stop); <-poller.done })
	t.Cleanup(stopPolling)

	tail := csBound + time.Second
	var stopAt time.Time
	env := chaos.Env{Table: store.Table(), StopIn: window + tail}
	plan := chaos.Plan{For: window, MaxDown: csProcs, KillOdds: 0.3,
		Pause: [2]time.Duration{csTTL / 5, 2 * csTTL}, Gap: [2]time.Duration{500 * time.Millisecond, 2 * time.Second}}
	in := chaos.NewInjector(t, plan, csProcs, chaos.Spawner(t, roleChaosSlots, env, &stopAt))
	stopAt = time.Now().Add(window + tail)
	in.Run(t)
	events := in.Collect(t, time.Until(stopAt)+90*time.Second)
	stopPolling()

	killed := chaos.KillTimes(in.Faults)
	beliefs, problems := chaos.Beliefs(events, killed)
	peak, violations := chaos.CheckSlots(beliefs, csLimit)
	frees := csFrees(poller.snaps, in.Faults, events)
	csReport(t, in, events, peak, frees)
	for _, v := range violations[:min(len(violations), 10)] {
		t.Logf("violation: %s", v)
	}
	if mode != "" {
		assert.NotEmpty(t, violations, "the broken holder %q went unnoticed", mode)
		return
	}
	assert.Empty(t, problems, "histories that do not add up")
	assert.Empty(t, csErrors(events), "errors no fault explains")
	assert.Empty(t, violations, "slot cap violations")
	assert.Empty(t, poller.problems, "the store's own view broke the cap")
	assert.Positive(t, in.Count(chaos.FaultPause), "no pause was injected")
	require.NotEmpty(t, beliefs, "nobody held a slot")
	all := append(append([]time.Duration(nil), frees[chaos.FaultKill]...), frees[chaos.FaultPause]...)
	for _, d := range all {
		assert.LessOrEqual(t, d, csBound, "a frozen or killed holder's slot freed late: %s", chaos.Summary(all))
	}
}

// csFrees measures how soon the slots of killed children, and of children
// paused past the TTL, were free, by fault kind.
func csFrees(snaps []chaos.Snapshot, faults []chaos.Fault, events []chaos.Event) map[string][]time.Duration {
	gens := map[string]int{}
	for _, ev := range events {
		if ev.Kind == chaos.KindClaim {
			gens[ev.Run] = ev.Gen
		}
	}
	out := map[string][]time.Duration{}
	for _, kind := range []string{chaos.FaultKill, chaos.FaultPause} {
		var of []chaos.Fault
		for _, f := range faults {
			if f.Kind == kind {
				of = append(of, f)
			}
		}
		out[kind] = chaos.Frees(snaps, of, gens, csTTL)
	}
	return out
}

func csErrors(events []chaos.Event) []string {
	var out []string
	for _, ev := range events {
		if ev.Kind == chaos.KindErr {
			out = append(out, fmt.Sprintf("slot %d gen %d: %s", ev.Slot, ev.Gen, ev.Msg))
		}
	}
	return out
}

func csReport(t *testing.T, in *chaos.Injector, events []chaos.Event, peak int, frees map[string][]time.Duration) {
	t.Helper()
	claims, refused, capped := 0, 0, 0
	why := map[string]int{}
	for _, ev := range events {
		switch ev.Kind {
		case chaos.KindClaim:
			claims++
		case chaos.KindRefused:
			refused += ev.N
		case chaos.KindEnd:
			why[ev.Res]++
			if ev.Cap != 0 {
				capped++
			}
		}
	}
	t.Logf("slot chaos: %d processes x %d competitors, limit %d; %d pauses, %d kills",
		csProcs, csCompetitors, csLimit, in.Count(chaos.FaultPause), in.Count(chaos.FaultKill))
	t.Logf("%d claims, %d refused; ends %v; %d beliefs cut by a slot renewal that failed; peak believers %d",
		claims, refused, why, capped, peak)
	t.Logf("slot free after the fault: kill %s; pause >= TTL %s; bound %v",
		chaos.Summary(frees[chaos.FaultKill]), chaos.Summary(frees[chaos.FaultPause]), csBound)
}
