package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/areev/runlease"
)

// Violation is one broken promise, found at one instant of a schedule.
type Violation struct {
	Check  string        // the checker that fired, such as "exclusive-trust"
	At     time.Duration // fake time since the schedule began
	Detail string
}

func (v Violation) String() string {
	return fmt.Sprintf("[%s] t=%s: %s", v.Check, fmtDur(v.At), v.Detail)
}

// actor is one run driver: a holder that takes leases on the shared runs
// and claims slots for a run id of its own.
type actor struct {
	id      int
	holder  string
	slotRun string // the run its slots are claimed for: the run of its lease at the claim
	busy    int    // operations in flight
	// gen counts the driver's abandons: rows written before its last
	// abandon belong to objects it dropped, as a process that died would,
	// and no call of its later objects answers for them.
	gen int

	lease Lease // nil when it holds none
	fence uint64
	epoch int // the run's lineage when the lease was granted (see World.epoch)
	run   string
	lost  bool // a call on lease reported it lost: the driver must drop it
	slots Slots

	// shadowed is set when an acquisition of run by this driver, made at
	// the same time as the one that granted lease, failed with an unknown
	// outcome: its row, at a higher fence, may be in the store, so lease's
	// keepers count as superseded (see keeperRec.superseded).
	shadowed bool

	// stale is a lease of this holder on run that a later Acquire by the
	// same holder replaced (re-entered at a higher fence), kept to call.
	stale      Lease
	staleFence uint64
	staleEpoch int

	wait     *waitRec // its ClaimSlotsWait in flight, if any
	unfenced bool     // slots came from an unfenced ClaimSlotsWait: no lease vouches for them
}

// keeperRec is a keeper the workload started.
type keeperRec struct {
	id      int
	k       Keeper
	a       *actor
	lease   Lease
	run     string
	holder  string
	fence   uint64
	epoch   int
	work    context.Context // the work context, taken when it was started
	slots   Slots
	renewer int // 0: a Renewer of its own
	stopped bool
	trusted time.Time // TrustedUntil at the last fresh look
	strict  bool      // its slots are kept with KeepSlotsStrict
	hooks   hookPlan  // what its hooks do to it (hooks.go)
	// superseded is set when its driver began to re-enter the run, or an
	// acquisition of the run made at the same time as its lease's failed
	// with an unknown outcome: a row of
	// the same holder at a higher fence is then its driver's own doing, not
	// a contender's, and the keeper may trust until its lease finds it.
	superseded bool
}

// supersededBy reports whether r is a keeper whose driver re-entered the
// run and cur, of lineage epoch, is a row of that re-entry. w.mu is held.
func (r *keeperRec) supersededBy(cur row, epoch int) bool {
	return r.superseded && cur.Holder == r.holder && cur.Fence > r.fence && epoch == r.epoch
}

// op is one workload operation in flight or done.
type op struct {
	id      int
	desc    string
	a       *actor
	gen     int // a.gen when it started
	start   time.Time
	bound   time.Time // it must have returned by then
	done    bool
	overdue bool
}

// claimRec is a ClaimSlots in flight, for the claim-limit checker.
type claimRec struct {
	limits     map[string]int
	interfered map[string]bool // another run took a slot of the scope meanwhile
}

// World is one schedule: the store, the drivers, and what the checkers
// know. Its mutex is never held across a library or store call.
type World struct {
	mode  Mode
	seed  uint64
	api   API
	store *Store
	rng   *rand.Rand
	mon   *Monitor
	start time.Time

	mu          sync.Mutex
	actors      []*actor
	keepers     []*keeperRec
	ops         []*op
	renewers    []Renewer
	violations  []Violation
	seen        map[string]bool          // checks already reported, to report each once
	lostAt      map[Lease]time.Time      // when a call on the lease first reported it lost
	slotLosses  map[string]bool          // slot run + key reported lost by a hook
	claims      map[string]*claimRec     // slot run → its claim in flight
	userValues  map[string]bool          // every user value a fenced write landed
	writer      map[string]*actor        // key → the driver whose operation last wrote it, when known
	writerGen   map[string]int           // key → that driver's gen when the operation started
	releasing   map[Lease]bool           // leases whose driver called a release
	fenceHolder map[string]string        // run|fence → the holder granted it first
	confirmed   map[Lease][]confirmation // the calls on the lease that succeeded
	acks        map[string][]ackedRow    // run → the latest lease rows whose writes the store acknowledged
	opWriter    map[string]int           // key → the operation whose call last wrote it, when known
	strictLost  map[*keeperRec]time.Time // strict keepers whose SlotsLost hook reported a loss, and when
	// epoch counts, per run, the deletions of its lease row (by Prune):
	// each starts a new lineage whose fences start over at 1, so a lease is
	// known by its lineage, holder and fence, and by holder and fence alone
	// only within one lineage.
	epoch      map[string]int
	leaseEpoch map[Lease]int // the lineage each lease was granted in

	waits []*waitRec // every ClaimSlotsWait the workload made
	// ranks holds, by operation, the priority and principal a claim or a
	// wait ranks with, for the queue-order checker.
	ranks map[int]claimRank
	// places holds, by queue key, when its entry took its place.
	places map[string]placed
	// waiterOp holds, by waiter id (an entry's "waiter"), the operation
	// whose call first wrote an entry of that waiter: its own ClaimSlotsWait
	// (renewals batched across waiters are sent with no operation's context).
	waiterOp map[string]int
	// fair is the record of admissions the fair-share check judges.
	fair fairLog
	// hi is the latest reading of the store's clock seen: no row written
	// before now lives past hi plus the TTL, whatever steps the clock took.
	hi time.Time
}

// violate records a violation, once per check and subject.
func (w *World) violate(check, subject, format string, a ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	id := check + "|" + subject
	if w.seen[id] {
		return
	}
	w.seen[id] = true
	v := Violation{Check: check, At: time.Since(w.start), Detail: fmt.Sprintf(format, a...)}
	w.violations = append(w.violations, v)
	w.mon.tracef("!! %s", v)
}

func (w *World) tracef(format string, a ...any) {
	w.mon.tracef("t=%s %s", fmtDur(time.Since(w.start)), fmt.Sprintf(format, a...))
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.4fs", d.Seconds()) }

// row is a decoded lease or slot row.
type row struct {
	Holder  string `json:"holder"`
	Fence   uint64 `json:"fence"`
	UntilMS int64  `json:"until_ms"`
}

func decode(raw string) (row, bool) {
	var r row
	return r, json.Unmarshal([]byte(raw), &r) == nil
}

// live reports whether r is held at now by the store clock.
func (r row) live(now time.Time) bool { return r.Holder != "" && r.UntilMS > now.UnixMilli() }

// remaining is how long r stays live after now, exactly.
func (r row) remaining(now time.Time) time.Duration {
	return time.UnixMilli(r.UntilMS).Sub(now)
}

// leaseRow reads a run's lease row without a fault.
func (w *World) leaseRow(run string) (row, bool) {
	raw, ok := w.store.Peek(runlease.LeasePrefix + run)
	if !ok {
		return row{}, false
	}
	return decode(raw)
}

// lib is the store the library is given: the fault store itself, or, in a
// mode without batches, the same store offering single-key calls only.
func (w *World) lib() runlease.Store {
	switch {
	case w.mode.Plain:
		return plainStore{w.store}
	case w.mode.Notify:
		return notifyStore{rangeStore{w.store}}
	case w.mode.Ranges:
		return rangeStore{w.store}
	case w.mode.ByValue:
		return byValue{w.store}
	}
	return w.store
}

// byValue is the store, every method of it, as a value that is not a
// pointer.
type byValue struct{ *Store }

func (w *World) storeNow() time.Time { t, _ := w.store.ClockNow(); return t }

// ownRow reports whether run's row is the one of holder at fence, in
// lineage epoch.
func (w *World) ownRow(run, holder string, fence uint64, epoch int) (row, bool) {
	r, ok := w.leaseRow(run)
	w.mu.Lock()
	same := w.epoch[run] == epoch
	w.mu.Unlock()
	return r, ok && same && r.Holder == holder && r.Fence == fence
}

// runEpoch returns run's lineage now.
func (w *World) runEpoch(run string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.epoch[run]
}

// epochOf returns the lineage l was granted in. w.mu is not held.
func (w *World) epochOf(l Lease) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.leaseEpoch[l]
}

// slotScope returns the scope of a slot key.
func slotScope(key string) string {
	rest := strings.TrimPrefix(key, runlease.SlotPrefix)
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		return rest[:i]
	}
	return rest
}
