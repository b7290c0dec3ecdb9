package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing/synctest"
	"time"
)

// Report is the outcome of one schedule.
type Report struct {
	Mode       string
	Seed       uint64
	Violations []Violation
	Trace      []string
	Elapsed    time.Duration // fake time the schedule covered
	Ops        int
}

// Failed reports whether any checker fired.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

// Checks returns the names of the checkers that fired, each once.
func (r *Report) Checks() []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range r.Violations {
		if !seen[v.Check] {
			seen[v.Check] = true
			out = append(out, v.Check)
		}
	}
	return out
}

// String lists the violations and the tail of the trace.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mode %s seed %d: %d violation(s) in %s of fake time, %d operations\n",
		r.Mode, r.Seed, len(r.Violations), fmtDur(r.Elapsed), r.Ops)
	for i, v := range r.Violations {
		if i == 8 {
			fmt.Fprintf(&b, "  … and %d more\n", len(r.Violations)-i)
			break
		}
		fmt.Fprintf(&b, "  %s\n", v)
	}
	tail := r.Trace
	if len(tail) > 80 {
		tail = tail[len(tail)-80:]
	}
	fmt.Fprintf(&b, "--- trace (last %d lines; '!!' marks a violation)\n%s\n", len(tail), strings.Join(tail, "\n"))
	return b.String()
}

// Run plays one schedule of mode from seed. It must be called inside a
// testing/synctest bubble: the bubble's fake clock is the schedule's time.
func Run(mode Mode, seed uint64, api API, mon *Monitor) *Report {
	w := &World{mode: mode, seed: seed, api: api, mon: mon, start: time.Now(),
		rng:  rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		seen: map[string]bool{}, lostAt: map[Lease]time.Time{}, slotLosses: map[string]bool{},
		claims: map[string]*claimRec{}, userValues: map[string]bool{}, writer: map[string]*actor{}, writerGen: map[string]int{}, releasing: map[Lease]bool{}, fenceHolder: map[string]string{}, confirmed: map[Lease][]confirmation{},
		opWriter: map[string]int{}, ranks: map[int]claimRank{}, places: map[string]placed{}, waiterOp: map[string]int{}, strictLost: map[*keeperRec]time.Time{}, epoch: map[string]int{}, leaseEpoch: map[Lease]int{}}
	jitter := rand.New(rand.NewPCG(seed^0x5851f42d4c957f2d, seed))
	var jitterMu sync.Mutex
	api.SetJitter(func(n int64) int64 {
		jitterMu.Lock()
		defer jitterMu.Unlock()
		return jitter.Int64N(n)
	})
	defer api.SetJitter(nil)
	w.store = newStore(seed, w, w.tracef)
	w.store.yield = mode.Yield
	w.store.weather = mode.Weather[0]
	w.store.uncertainty = mode.Uncertainty
	w.store.stall = mode.TTL
	for i := range mode.Actors {
		holder := fmt.Sprintf("d%d", i)
		if mode.PrefixHolders {
			holder = "d" + strings.Repeat("x", i)
		}
		w.actors = append(w.actors, &actor{id: i, holder: holder})
	}
	for range mode.Shared {
		w.renewers = append(w.renewers, api.NewRenewer())
	}
	for range mode.Steps {
		synctest.Wait()
		mon.tick()
		w.observe(w.store.Hung() == 0)
		w.event()
	}
	w.teardown()
	w.store.detach() // see detach: the library outlives the schedule
	return &Report{Mode: mode.Name, Seed: seed, Violations: w.violations, Trace: mon.Lines(),
		Elapsed: time.Since(w.start), Ops: len(w.ops)}
}

// timeSteps are the fake durations a step may advance the clock by. Some
// are not whole milliseconds, so attempts start between ticks of until_ms.
var timeSteps = []time.Duration{
	300 * time.Microsecond, time.Millisecond, 7 * time.Millisecond, 40 * time.Millisecond,
	150 * time.Millisecond, 400*time.Millisecond + 700*time.Microsecond, 900 * time.Millisecond, 1700 * time.Millisecond,
}

// event takes one scheduling decision: change the weather, step the store
// clock, start an operation, or let fake time pass.
func (w *World) event() {
	m := w.mode
	x := w.rng.Float64()
	switch {
	case x < m.WeatherP:
		wt := m.Weather[w.rng.IntN(len(m.Weather))]
		w.store.setWeather(wt)
		w.tracef("weather %s", wt.Name)
	case x < m.WeatherP+m.ClockP:
		d := m.ClockSteps[w.rng.IntN(len(m.ClockSteps))]
		w.store.stepClock(d)
		w.tracef("store clock steps %v", d)
	case x < m.WeatherP+m.ClockP+m.OpP && w.startOp():
	default:
		d := timeSteps[w.rng.IntN(len(timeSteps))]
		time.Sleep(d)
	}
}

// teardown heals the store, stops every keeper and Renewer, and lets fake
// time pass until every operation has returned, checking the bounds.
func (w *World) teardown() {
	// Let the last step's operation run until it blocks, as every other
	// step's does, before the heal ends the hung calls: otherwise it races
	// them on real threads, and a replay need not end as the schedule did.
	synctest.Wait()
	w.mon.tick()
	w.observe(w.store.Hung() == 0)
	w.store.healAll()
	w.tracef("teardown: store healed; stopping every keeper")
	synctest.Wait()
	for _, a := range w.actors {
		if a.busy == 0 {
			w.launch(a, "teardown: stop keepers", promptly, func(_ context.Context, _ *op) error { w.stopAll(a); return nil })
		}
	}
	for i, r := range w.renewers {
		w.launch(w.actors[0], fmt.Sprintf("teardown: Close R%d", i+1), promptly, func(_ context.Context, _ *op) error { r.Close(); return nil })
	}
	for range 600 {
		synctest.Wait()
		w.mon.tick()
		w.observe(true)
		w.mu.Lock()
		pending := 0
		for _, o := range w.ops {
			if !o.done {
				pending++
			}
		}
		w.mu.Unlock()
		if pending == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, a := range w.actors { // keepers started by operations that were in flight
		w.stopAll(a)
	}
	for _, r := range w.renewers {
		r.Close()
	}
}
