package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/areev/runlease/internal/history"
)

// Event kinds of the admission-queue test. A competitor's round is: wait
// (ClaimSlotsWait called at T0), then admit (it returned at T1 holding
// Keys) or giveup (it returned at T1 without them), then end (the belief
// in the slots ended at T0) and release (Release called at T0). A waiter
// told it lost its place prints requeue at T0.
const (
	KindWait    = "wait"
	KindAdmit   = "admit"
	KindGiveUp  = "giveup"
	KindRequeue = "requeue"
	KindRelease = "release"
)

// ScopeOfSlot returns the scope of a slot row's key, runslot:<scope>:<n>.
func ScopeOfSlot(key string) string {
	rest := strings.TrimPrefix(key, "runslot:")
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		return rest[:i]
	}
	return rest
}

// QueueBeliefs rebuilds, from the queue competitors' events, the interval
// over which each believed it held each slot it was admitted to: Key is
// the slot row, Holder the competitor's run id, Proc its child's
// generation.
//
// A belief starts when ClaimSlotsWait returned and ends at the earliest of
// the moment the competitor saw its keeper end or began to release, and
// the Trust of its end event: the keeper's TrustedUntil, which for a
// strict keeper is never later than the slots' own trust window, counted
// from the start of the last write of each slot that landed (the
// admission's batch, or a renewal). While a belief lasts, the slot row is
// the competitor's and unexpired, so two beliefs in one slot, or more
// units believed at once than a scope's limit, are a broken promise. For a
// killed competitor, the belief ends at the earliest of the kill and the
// slots' trust window as it stood at admission.
func QueueBeliefs(events []Event, killed map[int]int64) ([]history.Interval, []string) {
	type claim struct {
		ev    Event
		trust int64
	}
	open := map[string]*claim{}
	var out []history.Interval
	var problems []string
	add := func(c *claim, end int64) {
		for _, key := range c.ev.Keys {
			out = append(out, history.Interval{Key: key, Holder: c.ev.Run, Start: c.ev.T1, End: end, Proc: c.ev.Gen})
		}
	}
	for _, ev := range events {
		switch ev.Kind {
		case KindAdmit:
			if prev := open[ev.Run]; prev != nil {
				problems = append(problems, fmt.Sprintf("run %s admitted again before its admission at %d ended", ev.Run, prev.ev.T1))
			}
			if len(ev.Keys) == 0 {
				problems = append(problems, fmt.Sprintf("run %s admitted at %d holding no slot", ev.Run, ev.T1))
			}
			open[ev.Run] = &claim{ev: ev, trust: ev.Trust}
		case KindEnd:
			c := open[ev.Run]
			if c == nil {
				problems = append(problems, fmt.Sprintf("run %s ended an admission it never had", ev.Run))
				continue
			}
			add(c, minNonZero(minNonZero(ev.T0, ev.Trust), ev.Cap))
			delete(open, ev.Run)
		}
	}
	for run, c := range open {
		kill, ok := killed[c.ev.Gen]
		if !ok {
			problems = append(problems, fmt.Sprintf("run %s: admission at %d never ended, and its process was not killed", run, c.ev.T1))
			continue
		}
		add(c, minNonZero(kill, c.trust))
	}
	slices.SortFunc(out, func(a, b history.Interval) int { return cmp.Compare(a.Start, b.Start) })
	return out, problems
}

// CheckQueueCap checks the beliefs against each scope's limit: never more
// slots of a scope believed held at once than its limit, never two
// competitors in one slot. A weighted claim holds several slots of a scope
// at once, so one competitor in several slots is legal. It returns the peak
// units believed per scope and a description of each violation.
func CheckQueueCap(beliefs []history.Interval, limits map[string]int) (map[string]int, []string) {
	byScope := map[string][]history.Interval{}
	var opened []history.Interval
	for _, b := range beliefs {
		if b.End > b.Start {
			byScope[ScopeOfSlot(b.Key)] = append(byScope[ScopeOfSlot(b.Key)], b)
			opened = append(opened, b)
		}
	}
	peaks := map[string]int{}
	var out []string
	for scope, ivs := range byScope {
		limit, ok := limits[scope]
		if !ok {
			out = append(out, fmt.Sprintf("a slot of scope %q, which no competitor asked for, was believed held", scope))
			continue
		}
		peak, at := history.Peak(ivs)
		peaks[scope] = peak
		if peak > limit {
			out = append(out, fmt.Sprintf("%d units of scope %q believed held at once (limit %d): %v", peak, scope, limit, at))
		}
	}
	for _, o := range history.Overlaps(opened, func(iv history.Interval) string { return iv.Key }) {
		out = append(out, "two competitors in one slot: "+o)
	}
	slices.Sort(out)
	return peaks, out
}

// QueueEntry is one live queue entry as the parent scanned it.
type QueueEntry struct {
	Scope, Run, Waiter, Principal string
	Priority, Units               int
	Tag                           int64
}

// QueueSnap is the live queue entries read by one scan that began at Start
// and returned at At (both [history.Mono]); an entry is live when its
// until_ms was later than the store's clock read after the scan returned,
// so it was live at the instant the scan read it.
type QueueSnap struct {
	Start, At int64
	Entries   []QueueEntry
}

// waitCall is one ClaimSlotsWait call of a competitor.
type waitCall struct {
	run, principal string
	t0, end        int64 // end: when it returned, 0 if never (killed)
	units          int   // slots admitted, 0 if not
	requeued       bool
}

// waitCalls indexes the wait calls by run, in the order they were made.
type waitCalls map[string][]*waitCall

func indexWaits(events []Event) waitCalls {
	calls := waitCalls{}
	for _, ev := range events {
		switch ev.Kind {
		case KindWait:
			calls[ev.Run] = append(calls[ev.Run], &waitCall{run: ev.Run, principal: ev.Principal, t0: ev.T0})
		case KindAdmit, KindGiveUp:
			if c := calls.at(ev.Run, ev.T0); c != nil && c.t0 == ev.T0 {
				c.end = ev.T1
				c.units = len(ev.Keys)
			}
		case KindRequeue:
			if c := calls.at(ev.Run, ev.T0); c != nil {
				c.requeued = true
			}
		}
	}
	return calls
}

// at returns the latest call of run made at or before t. A competitor
// waits once at a time, so that is the call running at t, if any is.
func (wc waitCalls) at(run string, t int64) *waitCall {
	list := wc[run]
	i, _ := slices.BinarySearchFunc(list, t, func(c *waitCall, t int64) int { return cmp.Compare(c.t0, t+1) })
	if i == 0 {
		return nil
	}
	return list[i-1]
}

// CheckQueueOrder checks first-come-first-served within a principal, as
// decided by what each enqueue read: a waiter X whose wait began after the
// parent saw Y's entry live, in a scope X waits in, with the same
// principal and priority, must rank behind Y (X's tag is above Y's) in
// every scan that shows both.
//
// # Why the check is sound
//
// A waiter computes its tag from the first read that does not admit it,
// which it makes after its call began; the tag is at least the finish of
// every live entry of its principal in its scopes, which is above that
// entry's tag. Y's entry, identified by its waiter id and tag, stays live
// from its first write until it is deleted, unless its waiter stalls past
// the TTL, and then the waiter is told so (a requeue event) before it
// writes a new place. So if the parent saw Y live at a scan that returned
// before X's call began, saw Y again (same waiter, same tag) at a later
// scan that also shows X, and Y's wait call had no requeue, Y was live at
// X's read. X's own call must have no requeue either, so that its tag came
// from that first read. Which call wrote an entry is taken to be the run's
// latest call begun before the scan that first showed it began, which can
// only make X's call look earlier than it was, and skip a pair.
//
// It returns how many pairs were checked and a description of each pair
// out of order.
func CheckQueueOrder(snaps []QueueSnap, events []Event) (int, []string) {
	calls := indexWaits(events)
	type id struct {
		waiter string
		tag    int64
	}
	firstSeen := map[id]int64{}      // the At of the first scan showing it
	callOf := map[string]*waitCall{} // by waiter
	for _, s := range snaps {
		for _, e := range s.Entries {
			k := id{e.Waiter, e.Tag}
			if _, ok := firstSeen[k]; !ok {
				firstSeen[k] = s.At
			}
			if _, ok := callOf[e.Waiter]; !ok {
				callOf[e.Waiter] = calls.at(e.Run, s.Start)
			}
		}
	}
	checked := 0
	seen := map[[2]string]bool{}
	var out []string
	for _, s := range snaps {
		for _, x := range s.Entries {
			cx := callOf[x.Waiter]
			if cx == nil || cx.requeued {
				continue
			}
			for _, y := range s.Entries {
				if y.Waiter == x.Waiter || y.Scope != x.Scope || y.Principal != x.Principal || y.Priority != x.Priority {
					continue
				}
				cy := callOf[y.Waiter]
				if cy == nil || cy.requeued || firstSeen[id{y.Waiter, y.Tag}] >= cx.t0 {
					continue
				}
				pair := [2]string{x.Waiter, y.Waiter}
				if seen[pair] {
					continue
				}
				seen[pair] = true
				checked++
				if x.Tag <= y.Tag {
					out = append(out, fmt.Sprintf("scope %q: run %s (tag %d) waited from %d, after run %s (tag %d) was seen queued at %d, and ranks ahead of it",
						x.Scope, x.Run, x.Tag, cx.t0, y.Run, y.Tag, firstSeen[id{y.Waiter, y.Tag}]))
				}
			}
		}
	}
	return checked, out
}

// QueueStats are the measurements of a queue test run, reported and not
// checked: what they describe depends on the timing of faults.
type QueueStats struct {
	Waits      []time.Duration // call to admission, for calls never requeued
	Released   []time.Duration // release begun to the next admission of a waiter waiting then, in that scope
	Admissions int
	// Inversions counts admissions that overtook a waiter of the same
	// principal ranked ahead in the same scope: legal backfill, when the
	// free units fit both.
	Inversions int
	// Units counts the slots admitted per scope and principal while every
	// principal had a waiter able to be admitted in that scope in the last
	// scan before the admission: one whose process was neither killed nor
	// paused within the stall window before the scan. A paused waiter's
	// entries stay live, and hold their place and reservations, until they
	// expire, and it then queues again at the back; counting it as waiting
	// would charge its principal for admissions it could not take.
	Units map[string]map[string]int
}

// QueueMeasure computes the QueueStats of a run. stall is how long before
// a scan a pause keeps a waiter from counting as able to be admitted (see
// QueueStats.Units): a TTL covers a pause the waiter has yet to notice.
func QueueMeasure(snaps []QueueSnap, events []Event, principals []string, faults []Fault, stall time.Duration) QueueStats {
	calls := indexWaits(events)
	st := QueueStats{Units: map[string]map[string]int{}}
	var admits, releases []Event
	genOf := map[string]int{}
	for _, ev := range events {
		switch ev.Kind {
		case KindWait:
			genOf[ev.Run] = ev.Gen
		case KindAdmit:
			admits = append(admits, ev)
		case KindRelease:
			releases = append(releases, ev)
		}
	}
	able := func(run string, at int64) bool {
		gen := genOf[run]
		for _, f := range faults {
			if f.Gen != gen {
				continue
			}
			if f.Kind == FaultKill && f.T0 <= at {
				return false
			}
			if f.Kind == FaultPause && f.T0 <= at && (f.T1 == 0 || f.T1 > at-int64(stall)) {
				return false
			}
		}
		return true
	}
	slices.SortFunc(admits, func(a, b Event) int { return cmp.Compare(a.T1, b.T1) })
	st.Admissions = len(admits)
	for _, a := range admits {
		c := calls.at(a.Run, a.T0)
		if c != nil && !c.requeued {
			st.Waits = append(st.Waits, time.Duration(a.T1-a.T0))
		}
		i, _ := slices.BinarySearchFunc(snaps, a.T1, func(s QueueSnap, t int64) int { return cmp.Compare(s.At, t) })
		if i == 0 {
			continue
		}
		last := snaps[i-1]
		waiting := map[[2]string]bool{} // scope, principal
		for _, e := range last.Entries {
			if able(e.Run, last.At) {
				waiting[[2]string{e.Scope, e.Principal}] = true
			}
		}
		for _, k := range a.Keys {
			scope, all := ScopeOfSlot(k), c != nil && len(principals) > 0
			for _, p := range principals {
				all = all && waiting[[2]string{scope, p}]
			}
			if !all {
				continue
			}
			if st.Units[scope] == nil {
				st.Units[scope] = map[string]int{}
			}
			st.Units[scope][c.principal]++
		}
		if last.Start > a.T0 && overtook(last, a.Run, calls, a.T1) {
			st.Inversions++
		}
	}
	for _, r := range releases {
		scopes := map[string]bool{}
		for _, k := range r.Keys {
			scopes[ScopeOfSlot(k)] = true
		}
		for _, a := range admits {
			if a.T1 <= r.T0 || a.T0 >= r.T0 || !anyScope(a.Keys, scopes) {
				continue
			}
			st.Released = append(st.Released, time.Duration(a.T1-r.T0))
			break
		}
	}
	return st
}

// overtook reports whether run's entries in snap rank behind an entry of
// the same principal and scope whose call was still waiting at t.
func overtook(snap QueueSnap, run string, calls waitCalls, t int64) bool {
	for _, e := range snap.Entries {
		if e.Run != run {
			continue
		}
		for _, f := range snap.Entries {
			if f.Run == run || f.Scope != e.Scope || f.Principal != e.Principal || f.Priority != e.Priority || f.Tag >= e.Tag {
				continue
			}
			if c := calls.at(f.Run, snap.Start); c != nil && (c.end == 0 || c.end > t) {
				return true
			}
		}
	}
	return false
}

func anyScope(keys []string, scopes map[string]bool) bool {
	for _, k := range keys {
		if scopes[ScopeOfSlot(k)] {
			return true
		}
	}
	return false
}

// UnexplainedRequeues returns the requeue events whose process was not
// paused in the stretch before: a waiter loses its place only when it
// stalled past its TTL, and one whose process ran on is renewed in time.
// A requeue counts as explained by a pause of its process that ended
// within window before it (the waiter notices at its first look after
// waking).
func UnexplainedRequeues(events []Event, faults []Fault, window time.Duration) []string {
	var out []string
	for _, ev := range events {
		if ev.Kind != KindRequeue {
			continue
		}
		explained := false
		for _, f := range faults {
			if f.Kind == FaultPause && f.Gen == ev.Gen && f.T1 <= ev.T0 && ev.T0-f.T1 <= int64(window) {
				explained = true
				break
			}
		}
		if !explained {
			out = append(out, fmt.Sprintf("run %s (proc %d) lost its place at %d with no pause of its process before", ev.Run, ev.Gen, ev.T0))
		}
	}
	return out
}
