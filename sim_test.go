package runlease_test

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/areev/runlease/internal/sim"
)

// Environment variables of TestSimulationModes.
const (
	envSchedules = "RUNLEASE_DSIM_SCHEDULES" // schedules of the random sweep, over all modes (default simDefaultSchedules; simShortSchedules a mode under -short)
	envModes     = "RUNLEASE_DSIM_MODES"     // comma-separated modes of the sweep (default: all but clock)
	envBase      = "RUNLEASE_DSIM_BASE"      // first seed of the sweep (default 1)
	envSeed      = "RUNLEASE_DSIM_SEED"      // replay one seed (with RUNLEASE_DSIM_MODE), printing its trace
	envMode      = "RUNLEASE_DSIM_MODE"
	envStall     = "RUNLEASE_DSIM_STALL"  // real time without progress that counts as a hang (default 10s)
	envSurvey    = "RUNLEASE_DSIM_SURVEY" // when set, sweep without failing fast and list, per mode and checker, the seeds that fire it
	envStrict    = "RUNLEASE_DSIM_STRICT" // when set, the open findings of testdata/sim/known.txt fail the test too
	envTrace     = "RUNLEASE_DSIM_TRACE"  // when set, a failing schedule of the sweep logs its whole trace (a replay may not fail again: goroutines that call the store at one fake instant race); in a survey, set to checkers (comma-separated), the first schedule of each that fires them
)

// simDefaultSchedules is the size of the sweep CI runs: about 25 s on one
// core. Under the race detector the sweep is a tenth of it.
const simDefaultSchedules = 10_000

// simShortSchedules is how many schedules of each mode the sweep runs
// under `go test -short` (after every regression schedule): the first
// seeds of the CI sweep, a few seconds in all, so that the loop a developer
// runs while editing still plays every mode.
const simShortSchedules = 12

// simMaxFailures is how many failing schedules of one mode the sweep
// reports before it moves on to the next mode.
const simMaxFailures = 3

// TestSimulationModes runs the committed regression schedules
// (testdata/sim/regressions.txt), then a sweep of seeded schedules of every
// workload mode of internal/sim but clock (whose forward steps past the
// margin are a fault no keeper can see; run it with RUNLEASE_DSIM_MODES=clock).
// Under -short the sweep is simShortSchedules a mode, unless
// RUNLEASE_DSIM_SCHEDULES sets it.
// Each failure prints its seed, the command that replays it, the violations
// and a trace. A schedule that stops moving (a goroutine waiting on a lock
// that no store call can release) is reported by a watchdog, which then ends
// the test binary: nothing can wake a synctest bubble from outside.
func TestSimulationModes(t *testing.T) {
	if seed := os.Getenv(envSeed); seed != "" {
		n, err := strconv.ParseUint(seed, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, seed, err)
		}
		mode := simMode(t, os.Getenv(envMode))
		rep := runSimSchedule(t, mode, n)
		t.Logf("full trace:\n%s", strings.Join(rep.Trace, "\n"))
		return
	}
	t.Run("regression", func(t *testing.T) {
		for _, c := range loadSimRegressions(t) {
			t.Run(fmt.Sprintf("mode=%s/seed=%d", c.mode, c.seed), func(t *testing.T) {
				runSimSchedule(t, simMode(t, c.mode), c.seed)
			})
		}
	})
	modes := sim.ModeNames()
	if s := os.Getenv(envModes); s != "" {
		modes = strings.Split(s, ",")
	}
	def := simDefaultSchedules
	switch {
	case testing.Short():
		def = simShortSchedules * len(modes)
	case raceEnabled:
		def /= 10
	}
	total := simModesEnvInt(t, envSchedules, def)
	base := simModesEnvInt(t, envBase, 1)
	if os.Getenv(envSurvey) != "" {
		for _, name := range modes {
			surveySim(t, simMode(t, name), uint64(base), total/len(modes))
		}
		return
	}
	for _, name := range modes {
		mode := simMode(t, name)
		t.Run("mode="+name, func(t *testing.T) {
			failures := 0
			per := total / len(modes)
			for i := range per {
				seed := uint64(base + i)
				ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runSimSchedule(t, mode, seed) })
				if !ok {
					if failures++; failures == simMaxFailures {
						t.Logf("stopped after %d failing schedules of %d", failures, i+1)
						return
					}
				}
			}
		})
	}
}

// runSchedule plays one schedule in a bubble of its own and fails t with
// the report when a checker fires.
func runSimSchedule(t *testing.T, mode sim.Mode, seed uint64) *sim.Report {
	t.Helper()
	known := loadKnownFindings(t)
	replay := fmt.Sprintf("%s=%d %s=%s go test -run TestSimulationModes -count=1 .", envSeed, seed, envMode, mode.Name)
	mon := sim.NewMonitor(fmt.Sprintf("mode %s seed %d\nreplay: %s", mode.Name, seed, replay))
	stall := 10 * time.Second
	if s := os.Getenv(envStall); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", envStall, s, err)
		}
		stall = d
	}
	defer mon.Watch(stall, os.Stderr)()
	var rep *sim.Report
	synctest.Test(t, func(t *testing.T) { rep = sim.Run(mode, seed, simAPI{}, mon) })
	var knownFired []string
	for _, c := range rep.Checks() {
		if known[mode.Name+" "+c] != "" && os.Getenv(envStrict) == "" {
			knownFired = append(knownFired, c)
		}
	}
	switch {
	case len(knownFired) < len(rep.Checks()):
		t.Errorf("%s\nreplay: %s", rep, replay)
		if os.Getenv(envTrace) != "" {
			t.Logf("full trace:\n%s", strings.Join(rep.Trace, "\n"))
		}
	case len(knownFired) > 0:
		t.Logf("open finding(s) %v, listed in testdata/sim/known.txt (%s=1 fails on them): replay: %s", knownFired, envStrict, replay)
	}
	return rep
}

// loadKnownFindings reads testdata/sim/known.txt: "mode checker reason"
// per line, the findings on the current tree that are reported but do not
// fail the sweep until they are fixed; '#' starts a comment line.
func loadKnownFindings(t *testing.T) map[string]string {
	t.Helper()
	known := map[string]string{}
	data, err := os.ReadFile("testdata/sim/known.txt")
	if os.IsNotExist(err) {
		return known
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && !strings.HasPrefix(f[0], "#") {
			known[f[0]+" "+f[1]] = strings.Join(f[2:], " ")
		}
	}
	return known
}

func simMode(t *testing.T, name string) sim.Mode {
	t.Helper()
	m, ok := sim.Modes[name]
	if !ok {
		t.Fatalf("unknown simulation mode %q; the modes are:\n%s", name, sim.Describe())
	}
	return m
}

func simModesEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q is not a count", name, s)
	}
	return n
}

// simRegression is a committed schedule that found a bug.
type simRegression struct {
	mode string
	seed uint64
}

// loadSimRegressions reads testdata/sim/regressions.txt: one "mode seed"
// per line, then free text; '#' starts a comment line.
func loadSimRegressions(t *testing.T) []simRegression {
	t.Helper()
	f, err := os.Open("testdata/sim/regressions.txt")
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []simRegression
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		seed, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			t.Fatalf("regressions.txt: %q: %v", sc.Text(), err)
		}
		out = append(out, simRegression{fields[0], seed})
	}
	return out
}

// surveySim plays n schedules of mode from seed base on and reports, per
// checker, how many schedules it fired in, the first seeds, and one
// violation as an example.
func surveySim(t *testing.T, mode sim.Mode, base uint64, n int) {
	type tally struct {
		count   int
		seeds   []uint64
		example string
	}
	tallies := map[string]*tally{}
	var order []string
	for i := range n {
		seed := base + uint64(i)
		mon := sim.NewMonitor(fmt.Sprintf("mode %s seed %d (survey)", mode.Name, seed))
		stop := mon.Watch(10*time.Second, os.Stderr)
		var rep *sim.Report
		synctest.Test(t, func(t *testing.T) { rep = sim.Run(mode, seed, simAPI{}, mon) })
		stop()
		seen := map[string]bool{}
		traced := false
		for _, v := range rep.Violations {
			if tr := os.Getenv(envTrace); !traced && tr != "" && (tr == "1" || slices.Contains(strings.Split(tr, ","), v.Check)) {
				traced = true
				t.Logf("seed %d: %s\nfull trace:\n%s", seed, v, strings.Join(rep.Trace, "\n"))
			}
			if seen[v.Check] {
				continue
			}
			seen[v.Check] = true
			ty := tallies[v.Check]
			if ty == nil {
				ty = &tally{example: v.Detail}
				tallies[v.Check] = ty
				order = append(order, v.Check)
			}
			ty.count++
			if len(ty.seeds) < 5 {
				ty.seeds = append(ty.seeds, seed)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "mode %s: %d schedules from seed %d\n", mode.Name, n, base)
	for _, c := range order {
		ty := tallies[c]
		fmt.Fprintf(&b, "  %-26s %5d schedules, seeds %v\n      e.g. %s\n", c, ty.count, ty.seeds, ty.example)
	}
	t.Log(b.String())
	if len(order) > 0 {
		t.Fail()
	}
}
