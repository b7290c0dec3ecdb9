package sim

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// leftSlack is how far past the TTL, after the latest store time a call
// saw, a row it wrote may live: until_ms is rounded up to the millisecond,
// and a renewal after the store clock stepped back never shortens a row,
// so each adds a millisecond.
const leftSlack = 50 * time.Millisecond

// entry is a queue row as the store holds it (README "Queue entries").
type entry struct {
	Key       string `json:"-"`
	Run       string `json:"run"`
	Waiter    string `json:"waiter"`
	Principal string `json:"principal"`
	Priority  int    `json:"priority"`
	Units     int    `json:"units"`
	Tag       int64  `json:"tag"`
	EnqMS     int64  `json:"enq_ms"`
	UntilMS   int64  `json:"until_ms"`
}

func (e entry) live(now time.Time) bool { return e.UntilMS > now.UnixMilli() }

// before is the README's order: higher priority, then the smaller
// fair-share tag, then the earlier enqueue, then the run id.
func (e entry) before(f entry) bool {
	switch {
	case e.Priority != f.Priority:
		return e.Priority > f.Priority
	case e.Tag != f.Tag:
		return e.Tag < f.Tag
	case e.EnqMS != f.EnqMS:
		return e.EnqMS < f.EnqMS
	}
	return e.Run < f.Run
}

// queueScope returns the scope of a queue key, runqueue:<n>:<scope>:<run>.
func queueScope(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, runlease.QueuePrefix)
	digits, rest, ok2 := strings.Cut(rest, ":")
	n, err := strconv.Atoi(digits)
	if !ok || !ok2 || err != nil || n <= 0 || n >= len(rest) {
		return "", false
	}
	return rest[:n], true
}

func queuePrefix(scope string) string {
	return runlease.QueuePrefix + strconv.Itoa(len(scope)) + ":" + scope + ":"
}

// liveEntries returns the live entries of a scope's queue at now.
func liveEntries(rows []runlease.Row, scope string, now time.Time) []entry {
	var out []entry
	for _, r := range rows {
		var e entry
		if sc, ok := queueScope(r.Key); !ok || sc != scope || json.Unmarshal([]byte(r.Value), &e) != nil || !e.live(now) {
			continue
		}
		e.Key = r.Key
		out = append(out, e)
	}
	return out
}

// placed is when an entry took the place it holds: its waiter's first
// write of that rank. A waiter that lost its place (its entry lapsed while a
// read stalled) and queues again writes a new enqueue time, though its
// waiter and, often, its tag are the same: that is a new place.
type placed struct {
	waiter string
	tag    int64
	enqMS  int64
	at     time.Time
}

func (p placed) holds(e entry) bool {
	return p.waiter == e.Waiter && p.tag == e.Tag && p.enqMS == e.EnqMS
}

// entryPlaced records when the entry written at key took its place. w.mu
// is held.
func (w *World) entryPlaced(key, value string) {
	var e entry
	if json.Unmarshal([]byte(value), &e) != nil {
		return
	}
	if p, ok := w.places[key]; ok && p.holds(e) {
		return
	}
	w.places[key] = placed{waiter: e.Waiter, tag: e.Tag, enqMS: e.EnqMS, at: time.Now()}
}

// planned returns when an operation read the entries of scope's queue that
// its plan ranked it among, by the bubble's clock and by the store's: its
// last read of that queue before now, or, when it read the queue through no
// call of its own, its last read of the store (and the store's clock now).
// A read of a scope is a scan per prefix, one after the other on a store
// without MultiScanner; a scan after the queue's (the fair-share marks')
// may stall for seconds, and entries placed meanwhile were not in the
// plan, so they are not ranked ahead of it (two that overlap are in no
// promised order). The store's mutex is held.
func (w *World) planned(opID int, scope string, now, storeNow time.Time) (at, storeAt time.Time) {
	at, storeAt = now, storeNow
	var queueAt, queueStoreAt time.Time
	qp := queuePrefix(scope)
	for _, c := range w.store.logs[opID] {
		if (c.op == "MetaScan" || c.op == "MetaGet") && (c.outcome == OK || c.outcome == Slow) {
			at = c.at
			if c.key == qp {
				queueAt, queueStoreAt = c.at, c.storeAt
			}
		}
	}
	if !queueAt.IsZero() {
		return queueAt, queueStoreAt
	}
	return at, storeAt
}

func (w *World) limitOf(scope string) int {
	for _, sc := range w.mode.Scopes {
		if sc.Name == scope {
			return sc.Limit
		}
	}
	return 0
}

// batching is the queue-order check, judged on a
// batch of a claim or a wait whose conditions hold, before it applies:
// within a principal and a priority, no run takes units while a live entry
// ranked ahead of it (as the store shows the entries: ahead of its own
// entry, or of every entry when it has none), placed before the claim
// read the store, still needs units that the free ones do not fit beside
// its own (README: "one behind is admitted first only when the free units
// fit both"). The store's mutex is held.
func (w *World) batching(ops []runlease.Op, at time.Time, opID int, took time.Duration) {
	w.mu.Lock()
	rk, ok := w.ranks[opID]
	w.mu.Unlock()
	if !ok {
		return
	}
	units := map[string]int{}
	run := ""
	var dead []string
	for _, op := range ops {
		if !op.Delete && strings.HasPrefix(op.Key, runlease.SlotPrefix) {
			r, _ := decode(op.Value)
			run = r.Holder
			units[slotScope(op.Key)]++
			if r.remaining(at) <= w.mode.Margin() {
				dead = append(dead, fmt.Sprintf("%s for %s", op.Key, fmtDur(r.remaining(at))))
			}
		}
	}
	if stale := w.mode.TTL - w.mode.Margin(); took >= stale && len(units) > 0 {
		dead = append(dead, fmt.Sprintf("the batch was sent %s ago", fmtDur(took)))
	}
	if len(dead) > 0 {
		// The batch was sent on a read older than the TTL less the margin
		// (it hung or stalled in the store), or its rows live no longer
		// than the margin: it was planned on a place and on slots that may
		// no longer be there, and no store can refuse a batch for being
		// late. What is promised is that the claimant never takes it as an
		// admission: it gives the slots back and queues again, which the
		// wait's return judges (stale-admission, wait-partial), so the
		// order it went in at is not judged here.
		w.mon.tracef("   #%d's claim of %v for %s landed late, on a plan older than %v: %v",
			opID, units, run, w.mode.TTL-w.mode.Margin(), dead)
		return
	}
	for scope, u := range units {
		used, holders := 0, map[string]int{}
		for _, r := range w.store.scanLocked(runlease.SlotPrefix + scope + ":") {
			if row, _ := decode(r.Value); slotScope(r.Key) == scope && row.live(at) {
				holders[row.Holder]++
				if row.Holder != run {
					used++
				}
			}
		}
		queue := liveEntries(w.store.scanLocked(queuePrefix(scope)), scope, at)
		var mine *entry
		for i := range queue {
			if queue[i].Run == run {
				mine = &queue[i]
			}
		}
		plan, planStore := w.planned(opID, scope, time.Now(), at)
		for _, e := range queue {
			if e.Run == run || e.Principal != rk.principal || e.Priority != rk.priority || (mine != nil && !e.before(*mine)) {
				continue
			}
			if !e.live(planStore) {
				// It had lapsed when the claim read the queue, by the
				// clock that judges expiry, and lost its place; live
				// again now only because that clock stepped back.
				continue
			}
			// Only an entry placed before the claim read the store ranks
			// it behind: two that overlap are in no promised order.
			w.mu.Lock()
			p, ok := w.places[e.Key]
			w.mu.Unlock()
			if !ok || !p.holds(e) || !p.at.Before(plan) {
				continue
			}
			need := max(e.Units-holders[e.Run], 0)
			if limit := w.limitOf(scope); used+u+need > limit {
				w.violate("queue-order", fmt.Sprintf("%s|%s|%s", run, e.Run, scope),
					"#%d admitted %s to %d unit(s) of %s (limit %d, %d held by others) ahead of %s, queued earlier by the same principal %q at priority %d, which still needs %d (entry of %s: %v)",
					opID, run, u, scope, limit, used, e.Run, rk.principal, rk.priority, need, run, mine != nil)
			}
		}
	}
}

// queueWritten records the store clock's high-water mark and checks that
// no wait writes an entry, a mark or a slot once it returned or its
// process died. w.mu is held.
func (w *World) queueWritten(key string, now *string, at time.Time, opID int) {
	if at.After(w.hi) {
		w.hi = at
	}
	if now != nil && strings.HasPrefix(key, runlease.QueuePrefix) {
		w.entryPlaced(key, *now)
	}
	if w.mode.Queue == nil || now == nil || opID <= 0 {
		return
	}
	if !strings.HasPrefix(key, runlease.QueuePrefix) && !strings.HasPrefix(key, runlease.SlotPrefix) && !strings.HasPrefix(key, runlease.FairPrefix) {
		return
	}
	for _, r := range w.waits {
		if r.o != nil && r.o.id == opID && r.ended {
			id := fmt.Sprintf("wait-wrote-after-return|op%d", opID)
			if !w.seen[id] {
				w.seen[id] = true
				v := Violation{Check: "wait-wrote-after-return", At: time.Since(w.start), Detail: fmt.Sprintf(
					"ClaimSlotsWait #%d wrote %s after it returned or its process died (dead %v): %s", opID, key, r.dead, *now)}
				w.violations = append(w.violations, v)
				w.mon.tracef("!! %s", v)
			}
		}
	}
}

// observeQueue judges the waits: a wait that ended without being admitted
// (an error, a cancelled context, a process that died) leaves no live
// entry and no live slot it wrote once a TTL has passed since the latest
// store time it saw; and, in a mode with a hold time, the bound on the
// waiter at the head.
func (w *World) observeQueue() {
	if w.mode.Queue == nil {
		return
	}
	snow := w.storeNow()
	entries := w.store.Scan(runlease.QueuePrefix)
	slots := w.store.Scan(runlease.SlotPrefix)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hi = later(w.hi, snow)
	var left []string
	for _, rec := range w.waits {
		if !rec.ended || rec.admitted || rec.swept || !snow.After(rec.endHi.Add(w.mode.TTL+leftSlack)) {
			continue
		}
		rec.swept = true
		for _, r := range entries {
			var e entry
			if w.opWriter[r.Key] == rec.o.id && json.Unmarshal([]byte(r.Value), &e) == nil && e.live(snow) {
				left = append(left, fmt.Sprintf("wait-left-entry|op%d|entry %s %s", rec.o.id, r.Key, r.Value))
			}
		}
		for _, r := range slots {
			if row, _ := decode(r.Value); w.opWriter[r.Key] == rec.o.id && row.live(snow) {
				left = append(left, fmt.Sprintf("wait-left-slot|op%d|slot %s %s", rec.o.id, r.Key, r.Value))
			}
		}
		for _, l := range left {
			f := strings.SplitN(l, "|", 3)
			id := f[0] + "|" + f[1]
			if w.seen[id] {
				continue
			}
			w.seen[id] = true
			v := Violation{Check: f[0], At: time.Since(w.start), Detail: fmt.Sprintf(
				"ClaimSlotsWait #%d of %s ended (dead %v, cancelled %v) at store time ≤ %s and left its live %s past its TTL",
				rec.o.id, rec.run, rec.dead, rec.cancelled, rec.endHi.Format("15:04:05.000"), f[2])}
			w.violations = append(w.violations, v)
			w.mon.tracef("!! %s", v)
		}
		left = left[:0]
	}
	if w.mode.Queue.Hold > 0 {
		w.observeHeads(entries, snow)
	}
}

// observeHeads checks the README's bound for a waiter ranked ahead of no
// one (k = 0): in a mode where every holder releases within Hold of its
// admission and nothing of a higher priority arrives, a waiter at the head
// of every queue it waits in is admitted within ⌈1/L⌉·Hold = Hold, plus
// the wake-up (its poll interval with jitter, at most 5/4 of it). w.mu is
// held.
func (w *World) observeHeads(rows []runlease.Row, snow time.Time) {
	now := time.Now()
	queues := map[string][]entry{}
	for _, sc := range w.mode.Scopes {
		queues[sc.Name] = liveEntries(rows, sc.Name, snow)
	}
	bound := w.mode.Queue.Hold + w.mode.Queue.Poll*5/4 + 100*time.Millisecond
	for _, rec := range w.waits {
		if rec.o == nil || rec.ended || rec.ctx.Err() != nil {
			continue
		}
		head := true
		for _, sc := range rec.specs {
			var mine *entry
			q := queues[sc.Name]
			for i := range q {
				if q[i].Run == rec.run {
					mine = &q[i]
				}
			}
			if mine == nil {
				head = false
				break
			}
			for _, e := range q {
				if e.Run != rec.run && e.before(*mine) {
					head = false
				}
			}
		}
		switch {
		case !head:
			rec.headAt = time.Time{}
		case rec.headAt.IsZero():
			rec.headAt = now
		case now.Sub(rec.headAt) > bound:
			id := fmt.Sprintf("head-bound|op%d", rec.o.id)
			if !w.seen[id] {
				w.seen[id] = true
				v := Violation{Check: "head-bound", At: time.Since(w.start), Detail: fmt.Sprintf(
					"ClaimSlotsWait #%d of %s %s has been at the head of its queues for %s, past the bound %s (holders release within %v)",
					rec.o.id, rec.run, specsText(rec.specs), fmtDur(now.Sub(rec.headAt)), fmtDur(bound), w.mode.Queue.Hold)}
				w.violations = append(w.violations, v)
				w.mon.tracef("!! %s", v)
			}
		}
	}
}
