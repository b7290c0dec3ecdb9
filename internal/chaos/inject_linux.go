package chaos

import (
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/proctest"
)

// Plan says what faults an [Injector] makes.
type Plan struct {
	For      time.Duration    // how long to inject faults
	MaxDown  int              // the most children paused at once
	KillOdds float64          // the chance that a fault is a kill rather than a pause
	Pause    [2]time.Duration // a pause lasts a uniformly random time in [Pause[0], Pause[1])
	Gap      [2]time.Duration // the wait between two faults, likewise
}

// Child is one child process the injector started, in a slot.
type Child struct {
	Slot, Gen int
	Proc      *proctest.Child
	Killed    bool

	paused   bool
	resumeAt time.Time
	fault    int // the open pause's index in Faults
}

// Injector starts a fixed number of children and, while it runs, pauses and
// kills them at random, starting a replacement for each child it kills. It
// runs on the test's goroutine, as proctest requires; it is not safe for
// concurrent use.
type Injector struct {
	plan    Plan
	spawn   func(slot, gen int) *proctest.Child
	rnd     *rand.Rand
	slots   []*Child // the live child of each slot
	All     []*Child // every child started, in order
	Faults  []Fault
	nextGen int
}

// NewInjector starts n children with spawn, which must start the child of
// a slot with the given generation (a number no other child of the test
// has), waits until every one has printed "ready" and releases them all at
// once.
func NewInjector(t testing.TB, plan Plan, n int, spawn func(slot, gen int) *proctest.Child) *Injector {
	t.Helper()
	in := &Injector{plan: plan, spawn: spawn, rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	for slot := range n {
		in.slots = append(in.slots, in.start(slot))
	}
	for _, c := range in.slots {
		if err := c.Proc.WaitLine("ready", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range in.slots {
		c.Proc.Release()
	}
	return in
}

func (in *Injector) start(slot int) *Child {
	c := &Child{Slot: slot, Gen: in.nextGen, Proc: in.spawn(slot, in.nextGen)}
	in.nextGen++
	in.All = append(in.All, c)
	return c
}

// Run injects faults for the plan's duration, then continues every paused
// child. A signal that fails (the child has exited) is reported with
// t.Errorf.
func (in *Injector) Run(t testing.TB) {
	t.Helper()
	end := time.Now().Add(in.plan.For)
	next := time.Now().Add(in.between(in.plan.Gap))
	for {
		now := time.Now()
		wake := end
		for _, c := range in.slots {
			if c.paused && (!now.Before(c.resumeAt) || !now.Before(end)) {
				in.resume(t, c)
			}
			if c.paused && c.resumeAt.Before(wake) {
				wake = c.resumeAt
			}
		}
		if !now.Before(end) {
			return
		}
		if !now.Before(next) {
			if up := in.up(); len(up) > 0 && len(in.slots)-len(up) < in.plan.MaxDown {
				in.fault(t, up[in.rnd.IntN(len(up))])
			}
			next = now.Add(in.between(in.plan.Gap))
		}
		if next.Before(wake) {
			wake = next
		}
		time.Sleep(max(time.Until(wake), time.Millisecond))
	}
}

func (in *Injector) between(r [2]time.Duration) time.Duration {
	return r[0] + time.Duration(in.rnd.Int64N(int64(r[1]-r[0])+1))
}

// up returns the children not paused now.
func (in *Injector) up() []*Child {
	var out []*Child
	for _, c := range in.slots {
		if !c.paused {
			out = append(out, c)
		}
	}
	return out
}

func (in *Injector) fault(t testing.TB, c *Child) {
	t.Helper()
	if in.rnd.Float64() < in.plan.KillOdds {
		in.kill(c)
		return
	}
	f := Fault{Kind: FaultPause, Slot: c.Slot, Gen: c.Gen, T0: history.Mono()}
	if err := syscall.Kill(c.Proc.Pid(), syscall.SIGSTOP); err != nil {
		t.Errorf("chaos: SIGSTOP child slot %d gen %d: %v", c.Slot, c.Gen, err)
		return
	}
	c.paused, c.resumeAt, c.fault = true, time.Now().Add(in.between(in.plan.Pause)), len(in.Faults)
	in.Faults = append(in.Faults, f)
}

func (in *Injector) resume(t testing.TB, c *Child) {
	t.Helper()
	in.Faults[c.fault].T1 = history.Mono()
	if err := syscall.Kill(c.Proc.Pid(), syscall.SIGCONT); err != nil {
		t.Errorf("chaos: SIGCONT child slot %d gen %d: %v", c.Slot, c.Gen, err)
	}
	c.paused = false
}

// kill kills c the way a crash does and starts its replacement, released
// at once: the others are already running.
func (in *Injector) kill(c *Child) {
	f := Fault{Kind: FaultKill, Slot: c.Slot, Gen: c.Gen, T0: history.Mono()}
	c.Proc.Kill() // SIGKILL, then reap
	c.Killed = true
	next := in.start(c.Slot)
	next.Proc.Release()
	in.slots[c.Slot] = next
	f.NewGen = next.Gen
	in.Faults = append(in.Faults, f)
}

// Count returns how many faults of kind were injected.
func (in *Injector) Count(kind string) int {
	n := 0
	for _, f := range in.Faults {
		if f.Kind == kind {
			n++
		}
	}
	return n
}

// Spawner returns the spawn function of an injector: children playing role
// with env's tables, each told to stop at one shared instant, *stopAt. The
// caller sets *stopAt once the first children are released; until then a
// child is told env.StopIn.
func Spawner(t testing.TB, role string, env Env, stopAt *time.Time) func(slot, gen int) *proctest.Child {
	return func(slot, gen int) *proctest.Child {
		e := env
		e.Slot, e.Gen = slot, gen
		if !stopAt.IsZero() {
			e.StopIn = max(time.Until(*stopAt), time.Second)
		}
		return proctest.Start(t, role, e.Environ()...)
	}
}

// Collect waits for every child that was not killed to exit with code 0
// (failing t otherwise), and returns every child's events, with the
// faults settled (see [Settle]).
func (in *Injector) Collect(t testing.TB, timeout time.Duration) []Event {
	t.Helper()
	var events []Event
	for _, c := range in.All {
		if !c.Killed {
			code, err := c.Proc.Wait(timeout)
			if err != nil {
				t.Fatal(err)
			}
			if code != 0 {
				t.Fatalf("chaos: child slot %d gen %d exited with %d; stderr:\n%s", c.Slot, c.Gen, code, c.Proc.Stderr())
			}
		}
		evs, err := Parse(c.Proc.Lines(), c.Slot, c.Gen, c.Killed)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, evs...)
	}
	Settle(in.Faults, events)
	return events
}
