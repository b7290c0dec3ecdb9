package sim

import (
	"fmt"
	"sort"
	"time"
)

// Mode is a workload family: how many drivers, which operations how often,
// and which faults. Each targets a family of failures, so that a report can
// say which promise broke under which conditions.
type Mode struct {
	Name    string
	Doc     string
	Actors  int
	Runs    int         // contended run ids
	Scopes  []ScopeSpec // scopes that claims draw from
	Mixed   bool        // odd drivers claim with each limit raised by one
	Steps   int
	OpP     float64            // chance that a step starts an operation
	Ops     map[string]float64 // operation weights
	Weather []Weather          // the first is the starting weather
	// WeatherP is the chance that a step changes the weather.
	WeatherP float64
	// ClockP is the chance that a step moves the store clock by one of
	// ClockSteps.
	ClockP     float64
	ClockSteps []time.Duration
	KeepTTL    time.Duration // when set, Keep is sometimes given this TTL
	Shared     int           // shared Renewers
	Yield      float64       // chance a store call yields first
	TTL        time.Duration
	Serial     bool // each driver runs one operation at a time
	OneKeeper  bool // a lease is kept once at most, so a Keep never waits behind a renewal
	// Plain gives the library the store without batches (no Batcher, no
	// MultiCASer), so claims write slot by slot and roll back.
	Plain bool
	// Uncertainty is the uncertainty the store's clock reports.
	Uncertainty time.Duration
	// PrefixHolders names the drivers so that each holder string starts
	// with the one before it ("d", "dx", "dxx", …).
	PrefixHolders bool
	// Strict keeps slots with KeepSlotsStrict half of the time.
	Strict bool
	// Deaf says the weather has calls that ignore their context: no call
	// of the library can then return by its context's end, so how long an
	// operation takes is not judged (what it does meanwhile still is).
	Deaf bool
	// Prune lets drivers prune the store: a run's lease row may be
	// deleted, and its fences start over.
	Prune bool
	// ByValue gives the library the store as a value that is not a
	// pointer, whose identity the process cannot know: its Leases then
	// tell their rows apart by the rows alone (see lineage.go).
	ByValue bool
	// Ranges gives the library the store with ordered range reads
	// (runlease.RangeReader), as the built-in stores have.
	Ranges bool
	// Notify gives the library, besides range reads, a store that wakes
	// by key (runlease.Notifier through runlease.DeleteReadNotifier), as
	// the built-in stores do: releases ring the waiters of their scope, and
	// hand their reads of the queue to them (every driver of a schedule
	// shares one process).
	Notify bool
	// Queue makes drivers wait for slots in the admission queue (nil: they
	// do not).
	Queue *QueueSpec
}

// QueueSpec is how the drivers of a mode wait for slots.
type QueueSpec struct {
	Principals []Principal     // one is drawn for each wait
	Priorities []int           // one is drawn for each wait
	Deadlines  []time.Duration // a wait's context ends after one of them
	Poll       time.Duration   // WithWaitPoll
	// Fair checks the fair-share bound over the admissions (checks_fair.go):
	// for a mode of one scope, one priority and claims of one unit, on a
	// healthy store, with waits that are never cancelled.
	Fair bool
	// Twins makes a third of the bursts of waits (wait-burst) waits of one
	// run.
	Twins bool
	// Hold, when set, makes every wait that is admitted hold its slots for
	// up to Hold and then release them, within the same operation, and
	// checks the documented bound for the waiter at the head of its queues.
	Hold time.Duration
}

// Principal is a fair-share principal and its weight (0: the claim names
// none, and shares the principal "" with weight 1).
type Principal struct {
	Name   string
	Weight int
}

// Margin is the least time by which a keeper must stop trusting before its
// row can expire: the default KeepMargin, a tenth of the TTL, plus the
// uncertainty of the store's clock, which KeepMargin says is added to it.
func (m Mode) Margin() time.Duration { return m.TTL/10 + m.Uncertainty }

func rates(fail, lost, unsent float64) Rates { return Rates{Fail: fail, Lost: lost, Unsent: unsent} }

func uniform(r Rates) [numClasses]Rates {
	return [numClasses]Rates{r, r, r, r, Rates{Fail: r.Fail + r.Lost}}
}

var (
	flaky = Weather{Name: "flaky", Rates: uniform(rates(0.05, 0.05, 0.03))}
	// lossy loses replies and fails the reads that would tell.
	lossy = Weather{Name: "lossy", Rates: [numClasses]Rates{
		LeaseWrite: rates(0, 0.55, 0.15), UserBatch: rates(0, 0.3, 0.4), MultiCAS: rates(0, 0.5, 0.2),
		SlotWrite: rates(0, 0.55, 0.15), Read: {Fail: 0.8}}}
	// refusing loses the replies of lease writes or refuses them, and
	// mostly answers reads: an acquisition reads back the row it sent,
	// then has its next write refused.
	refusing = Weather{Name: "refusing", Rates: [numClasses]Rates{
		LeaseWrite: rates(0.3, 0.4, 0.05), UserBatch: rates(0.2, 0.2, 0.1), MultiCAS: rates(0.2, 0.3, 0.1),
		Read: {Fail: 0.1}}}
	down = Weather{Name: "down", Rates: [numClasses]Rates{
		LeaseWrite: rates(0.3, 0.3, 0.4), UserBatch: rates(0.3, 0.3, 0.4), MultiCAS: rates(0.3, 0.3, 0.4),
		SlotWrite: rates(0.3, 0.3, 0.4), Read: {Fail: 1}}}
	// slotsDown fails slot writes while lease writes go through.
	slotsDown = Weather{Name: "slots-down", Rates: [numClasses]Rates{
		SlotWrite: rates(0.5, 0.25, 0.25), Read: {Fail: 0.1}}}
	// hanging makes calls hang until their context ends.
	hanging = Weather{Name: "hanging", Rates: [numClasses]Rates{
		LeaseWrite: {Hang: 0.2, HangApplied: 0.1}, UserBatch: {Hang: 0.3, HangApplied: 0.2},
		MultiCAS: {Hang: 0.4, HangApplied: 0.2}, SlotWrite: {Hang: 0.2}, Read: {Hang: 0.1}}}
	// blind loses every write's reply and fails every read.
	blind = Weather{Name: "blind", Rates: [numClasses]Rates{LeaseWrite: rates(0, 0.6, 0.4), Read: {Fail: 1}}}
	// unsentSlots loses slot writes with an unknown outcome; reads work.
	unsentSlots = Weather{Name: "unsent-slots", Rates: [numClasses]Rates{SlotWrite: rates(0, 0.2, 0.5)}}
	// slowSlots serves slot writes and reads slowly, so that claims of
	// different runs interleave between their reads and their writes.
	slowSlots = Weather{Name: "slow-slots", Rates: [numClasses]Rates{SlotWrite: {Slow: 0.6}, Read: {Slow: 0.4}}}
	batchHang = Weather{Name: "batch-hang", Rates: [numClasses]Rates{MultiCAS: {Hang: 0.5, HangApplied: 0.2}}}
	// memberHang loses the replies of fenced writes that applied, and of
	// batched renewals that applied in part, and fails the reads that
	// would tell, so that the next batch finds some members' rows moved on
	// and refuses them; it hangs the resolution each refused member then
	// makes on its own, some of it deaf to its context.
	memberHang = Weather{Name: "member-hang", Rates: [numClasses]Rates{
		UserBatch: {Fail: 0.3, Lost: 0.5}, MultiCAS: {Lost: 0.1}, Read: {Fail: 0.5}, Resolve: {Hang: 0.5, Deaf: 0.25}}}
	// deafSlots answers some slot writes up to one and a half TTLs late
	// whatever their context says, while lease writes go through.
	deafSlots = Weather{Name: "deaf-slots", Rates: [numClasses]Rates{SlotWrite: {Deaf: 0.3}}}
)

// leaseOps is the weight table of the lease workload.
var leaseOps = map[string]float64{
	"acquire": 3, "acquire-wait": 1, "renew": 2, "write": 3, "write-keeper-ctx": 2, "release": 1,
	"keep": 3, "stop": 0.5, "keeper-release": 1, "abandon": 0.5, "close-renewer": 0.1,
}

var queueOps = map[string]float64{
	"acquire": 2, "renew": 1.5, "release": 0.3, "wait": 4, "wait-lease": 3, "cancel-wait": 1, "abandon-wait": 0.6,
	"claim": 0.7, "slots-renew": 1, "slots-release": 2.5, "abandon": 0.2,
}

// stalling answers some calls only after more than the TTL, so that
// waiters stall past it, their entries expire, and others move ahead.
var stalling = Weather{Name: "stalling", Rates: [numClasses]Rates{
	LeaseWrite: {Stall: 0.05}, UserBatch: {Stall: 0.1}, SlotWrite: {Stall: 0.1}, Read: {Stall: 0.08}}}

var slotOps = map[string]float64{
	"acquire": 3, "keep": 3, "claim": 3, "slots-renew": 1, "slots-release": 1, "keeper-release": 1,
	"abandon": 0.5, "stop": 0.3,
}

// withOps returns base with extra's weights added.
func withOps(base, extra map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range extra {
		out[k] += v
	}
	return out
}

// Modes are the workload families, by name.
var Modes = map[string]Mode{}

func addMode(m Mode) {
	if m.Actors == 0 {
		m.Actors = 4
	}
	if m.Runs == 0 {
		m.Runs = 2
	}
	if m.Steps == 0 {
		m.Steps = 160
	}
	if m.OpP == 0 {
		m.OpP = 0.5
	}
	if m.TTL == 0 {
		m.TTL = 5 * time.Second
	}
	if m.Weather == nil {
		m.Weather = []Weather{healthy, flaky}
	}
	Modes[m.Name] = m
}

func init() {
	addMode(Mode{Name: "leases", Doc: "contended leases, keepers on shared and own Renewers, fenced writes, flaky store",
		Ops: leaseOps, Shared: 2, Weather: []Weather{healthy, flaky, lossy, down}, WeatherP: 0.06, Yield: 0.1})
	addMode(Mode{Name: "doubt", Doc: "lost replies and failing read-backs around renewals and fenced writes, no keepers",
		Actors: 2, Runs: 2, OpP: 0.7, WeatherP: 0.08,
		Ops:     map[string]float64{"acquire": 2, "renew": 4, "write": 4, "release": 0.5, "abandon": 0.3},
		Weather: []Weather{healthy, lossy, flaky}})
	addMode(Mode{Name: "unsure", Doc: "one driver renewing by hand through a long run of lost replies and failing read-backs",
		Actors: 1, Runs: 1, OpP: 0.9, Ops: map[string]float64{"acquire": 1, "renew": 10},
		Weather: []Weather{blind, healthy}, WeatherP: 0.04})
	addMode(Mode{Name: "kept-doubt", Doc: "lost replies around keepers and fenced writes through the keeper's context",
		Actors: 3, Runs: 2, Shared: 1, WeatherP: 0.06, Yield: 0.1,
		Ops:     map[string]float64{"acquire": 2, "keep": 3, "write": 3, "write-keeper-ctx": 3, "renew": 1, "keeper-release": 0.5, "abandon": 0.3, "stop": 0.3},
		Weather: []Weather{healthy, lossy, flaky}})
	addMode(Mode{Name: "slots", Doc: "one scope of limit 1 and one of limit 2, kept slots, slot writes failing while lease writes go through",
		Actors: 4, Runs: 3, Ops: slotOps, Shared: 1, WeatherP: 0.06, Yield: 0.3,
		Scopes:  []ScopeSpec{{Name: "mem", Limit: 1}, {Name: "principal:p", Limit: 2}},
		Weather: []Weather{healthy, slotsDown, lossy, flaky}})
	addMode(Mode{Name: "limits", Doc: "hosts that disagree on a scope's limit (1 and 2), slots left to expire",
		Actors: 3, Runs: 3, Mixed: true, Scopes: []ScopeSpec{{Name: "mem", Limit: 1}},
		Ops: map[string]float64{"claim": 4, "slots-renew": 1, "slots-release": 1, "acquire": 0.2}})
	addMode(Mode{Name: "claims", Doc: "racing claims of one slot under unknown outcomes of slot writes",
		Actors: 4, Runs: 4, Scopes: []ScopeSpec{{Name: "mem", Limit: 1}}, OpP: 0.8, Yield: 0.6, WeatherP: 0.1,
		Ops:     map[string]float64{"acquire": 2, "claim": 6, "slots-release": 2, "abandon": 0.5},
		Weather: []Weather{healthy, unsentSlots}})
	addMode(Mode{Name: "keep-ttl", Doc: "Keep given a TTL option longer than the lease's",
		Actors: 2, Runs: 2, KeepTTL: time.Hour, Shared: 1, Ops: leaseOps, Weather: []Weather{healthy}})
	addMode(Mode{Name: "stop", Doc: "batched renewals that hang, stopped and released by their drivers",
		Actors: 4, Runs: 4, Shared: 1, OpP: 0.85, Weather: []Weather{batchHang}, OneKeeper: true,
		Ops: map[string]float64{"acquire": 3, "keep-shared": 4, "stop": 2, "keeper-release": 2, "close-renewer": 0.5, "abandon": 0.3}})
	addMode(Mode{Name: "member-hang", Doc: "batched renewals one of whose members hangs in its own resolution (the compare-and-swap of a refused write, some deaf to its context) while the other members are due, renewed and released",
		Actors: 10, Runs: 10, Shared: 1, OpP: 0.45, Steps: 240, Deaf: true, WeatherP: 0.06, Weather: []Weather{memberHang, healthy},
		Ops: map[string]float64{"acquire": 3, "keep-shared": 5, "write": 1, "reenter": 0.5, "stop": 0.1, "keeper-release": 0.3, "release-kept": 0.3, "abandon": 0.05}})
	addMode(Mode{Name: "wait", Doc: "AcquireWait with contexts that end while it waits or calls the store",
		Actors: 3, Runs: 1, WeatherP: 0.1, Weather: []Weather{healthy, hanging, flaky}, Serial: true,
		Ops: map[string]float64{"acquire": 1, "acquire-wait": 4, "release": 1, "renew": 1, "abandon": 0.5}})
	addMode(Mode{Name: "hang", Doc: "hung store calls under keepers sharing a Renewer",
		Shared: 1, WeatherP: 0.08, Weather: []Weather{healthy, hanging}, Ops: leaseOps})
	addMode(Mode{Name: "batches", Doc: "two Renewers keeping the same leases, so batched renewals overlap",
		Actors: 2, Runs: 3, Shared: 2, OpP: 0.85,
		Ops: map[string]float64{"acquire": 3, "keep-shared": 5, "renew": 0.5, "stop": 0.3, "abandon": 0.2}, Weather: []Weather{healthy}})
	addMode(Mode{Name: "reentry", Doc: "holders whose names share a prefix, re-entry by the same holder at a higher fence with the replaced Lease still called, Release with keepers running, a store clock of 150 ms uncertainty",
		Actors: 4, Runs: 2, Shared: 1, PrefixHolders: true, Uncertainty: 150 * time.Millisecond, WeatherP: 0.06, Yield: 0.1, ByValue: true,
		Ops:     withOps(leaseOps, map[string]float64{"reenter": 1.5, "renew-stale": 1, "write-stale": 1, "release-kept": 1}),
		Weather: []Weather{healthy, flaky, lossy}})
	addMode(Mode{Name: "prune", Doc: "lease rows pruned once expired or released, the same holder acquiring the run again at fence 1 with its stale Lease still called, lost replies",
		Actors: 3, Runs: 2, Shared: 1, Prune: true, WeatherP: 0.06, Yield: 0.1,
		Ops: map[string]float64{"acquire": 2, "reenter": 2, "renew": 1, "write": 1, "renew-stale": 2, "write-stale": 1.5,
			"keep": 1, "stop": 0.5, "release": 0.5, "abandon": 0.3, "prune": 2},
		Weather: []Weather{healthy, lossy, flaky}})
	addMode(Mode{Name: "twice", Doc: "one driver acquiring a run twice at once (two goroutines starting it), lost replies, rows pruned so fences start over, the Lease at the lower fence still called",
		Actors: 3, Runs: 2, Shared: 1, Prune: true, WeatherP: 0.06, Yield: 0.1,
		Ops: map[string]float64{"acquire": 1, "acquire-twice": 3, "reenter": 1, "renew": 1, "write": 1, "renew-stale": 2, "write-stale": 1,
			"keep": 1.5, "stop": 0.5, "release": 0.5, "abandon": 0.3, "prune": 1},
		Weather: []Weather{healthy, refusing, lossy, flaky}})
	addMode(Mode{Name: "plain", Doc: "slots on a store without batches: claims slot by slot with rollback, kept strictly or not, slot writes of unknown outcome",
		Actors: 5, Runs: 5, Shared: 1, Plain: true, Strict: true, WeatherP: 0.06, Yield: 0.3,
		Scopes:  []ScopeSpec{{Name: "mem", Limit: 2}, {Name: "principal:p", Limit: 1}},
		Ops:     withOps(slotOps, map[string]float64{"claim": 2, "slots-release": 1, "release-kept": 0.5}),
		Weather: []Weather{slowSlots, healthy, unsentSlots, slotsDown, flaky}})
	addMode(Mode{Name: "deaf", Doc: "slot writes that ignore their context and answer up to one and a half TTLs late, under keepers kept strictly or not",
		Actors: 4, Runs: 3, Ops: slotOps, Shared: 1, Strict: true, Deaf: true, WeatherP: 0.08, Yield: 0.2,
		Scopes:  []ScopeSpec{{Name: "mem", Limit: 1}, {Name: "principal:p", Limit: 2}},
		Weather: []Weather{healthy, deafSlots}})
	addMode(Mode{Name: "queue", Doc: "ClaimSlotsWait unfenced and through leases: priorities, weighted principals, two scopes, Take(n), contexts cancelled, waiters that die, stalls past the TTL, store clock steps, plain claims beside the queue",
		Actors: 6, Runs: 3, Steps: 140, Ops: queueOps, WeatherP: 0.06, Yield: 0.2,
		Scopes:     []ScopeSpec{{Name: "gpu", Limit: 3}, {Name: "mem", Limit: 2}},
		Weather:    []Weather{healthy, flaky, lossy, hanging, stalling},
		ClockP:     0.02,
		ClockSteps: []time.Duration{-2 * time.Second, -300 * time.Millisecond, 200 * time.Millisecond, 6 * time.Second},
		Queue: &QueueSpec{Principals: []Principal{{"", 0}, {"a", 1}, {"b", 2}, {"a", 1}},
			Priorities: []int{0, 0, 0, 1, -1}, Poll: 300 * time.Millisecond,
			Deadlines: []time.Duration{400 * time.Millisecond, 2 * time.Second, 6 * time.Second, 15 * time.Second}}})
	addMode(Mode{Name: "queue-bound", Doc: "a healthy store with range reads where every admitted waiter releases within 1.5 s: the waiter at the head of its queues is admitted within the documented bound while others keep arriving, some of one principal at once, behind entries of dead waiters and beside legacy entries",
		Actors: 6, Runs: 1, Steps: 140, Ops: map[string]float64{"wait": 1, "wait-burst": 0.4, "plant-ghosts": 0.1, "plant-legacy": 0.1},
		Weather: []Weather{healthy}, Ranges: true, Notify: true,
		Scopes: []ScopeSpec{{Name: "gpu", Limit: 3}, {Name: "mem", Limit: 2}},
		Queue: &QueueSpec{Principals: []Principal{{"", 0}, {"a", 1}, {"b", 3}}, Priorities: []int{0},
			Poll: 300 * time.Millisecond, Hold: 1500 * time.Millisecond, Deadlines: []time.Duration{30 * time.Second}}})
	addMode(Mode{Name: "queue-line", Doc: "long lines on a store with range reads: ten drivers, small limits, overlapping enqueues of one principal, entries of dead waiters at the head (expired, more than the limit plus one, ahead of many), legacy entries, stalls, faults and clock steps",
		Actors: 10, Runs: 3, Steps: 160, WeatherP: 0.05, Yield: 0.2, Ranges: true, Notify: true,
		Ops:        withOps(queueOps, map[string]float64{"wait-burst": 2.5, "plant-ghosts": 0.8, "plant-legacy": 1, "claim": -0.3}),
		Scopes:     []ScopeSpec{{Name: "gpu", Limit: 2}, {Name: "mem", Limit: 1}},
		Weather:    []Weather{healthy, flaky, stalling, lossy},
		ClockP:     0.015,
		ClockSteps: []time.Duration{-2 * time.Second, -300 * time.Millisecond, 200 * time.Millisecond, 6 * time.Second},
		Queue: &QueueSpec{Principals: []Principal{{"", 0}, {"a", 1}, {"b", 2}, {"a", 1}},
			Priorities: []int{0, 0, 1, -1}, Poll: 300 * time.Millisecond, Twins: true,
			Deadlines: []time.Duration{400 * time.Millisecond, 3 * time.Second, 10 * time.Second, 20 * time.Second}}})
	addMode(Mode{Name: "queue-fair", Doc: "the fair share on a healthy store with range reads: one scope of limit 1, two principals of weights 1 and 2 (or 3) whose waiters enqueue several at once, every admitted waiter releasing within 0.8 s",
		Actors: 8, Runs: 1, Steps: 200, Ops: map[string]float64{"wait": 1, "wait-burst": 2}, Weather: []Weather{healthy}, Ranges: true, Notify: true, Yield: 0.2,
		Scopes: []ScopeSpec{{Name: "gpu", Limit: 1}},
		Queue: &QueueSpec{Principals: []Principal{{"a", 1}, {"b", 2}}, Priorities: []int{0}, Fair: true,
			Poll: 300 * time.Millisecond, Hold: 800 * time.Millisecond, Deadlines: []time.Duration{60 * time.Second}}})
	addMode(Mode{Name: "clock", Doc: "store clock steps forward and back (a step forward past the margin is a fault the keeper cannot see)",
		Ops: leaseOps, Shared: 1, ClockP: 0.05,
		ClockSteps: []time.Duration{-2 * time.Second, -300 * time.Millisecond, 200 * time.Millisecond, 3 * time.Second}})
}

// ModeNames returns the names of the modes in the order the default run
// takes them: modes whose failures can hang the bubble come last, since a
// hang ends the test binary.
func ModeNames() []string {
	last := map[string]int{"hang": 2, "batches": 2, "stop": 1, "wait": 1}
	names := make([]string, 0, len(Modes))
	for n := range Modes {
		if n != "clock" {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool {
		if last[names[i]] != last[names[j]] {
			return last[names[i]] < last[names[j]]
		}
		return names[i] < names[j]
	})
	return names
}

// Describe lists the modes, for help text.
func Describe() string {
	s := ""
	for _, n := range append(ModeNames(), "clock") {
		s += fmt.Sprintf("  %-10s %s\n", n, Modes[n].Doc)
	}
	return s
}
