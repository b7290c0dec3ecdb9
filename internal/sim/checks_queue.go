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

// entry is a line row as the store holds it (docs/admission.md "Rows"): a
// waiter's entry at runline:<n>:<scope>:<rank>:<run id>, or a legacy entry
// of an earlier version at runqueue:<n>:<scope>:<run id>.
type entry struct {
	Key       string `json:"-"`
	Run       string `json:"run"`
	Waiter    string `json:"waiter"`
	Fence     uint64 `json:"fence"`
	Principal string `json:"principal"`
	Weight    int    `json:"weight"`
	Priority  int    `json:"priority"`
	Units     int    `json:"units"`
	Tag       int64  `json:"tag"`
	EnqMS     int64  `json:"enq_ms"`
	UntilMS   int64  `json:"until_ms"`
}

func (e entry) live(now time.Time) bool { return e.UntilMS > now.UnixMilli() }

// liveAll reports whether e has been live at every reading of the store's
// clock up to hi, the latest: a store clock that stepped back may show an
// expired entry live again, which no one then reads as holding a place.
func (e entry) liveAll(hi time.Time) bool { return e.UntilMS > hi.UnixMilli() }

// before is the documented order (docs/admission.md): higher priority, then the smaller
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

// Widths of the rank in a line key (docs/admission.md "Rows"): MaxPriority
// less the priority, the tag and the enqueue time, zero-padded.
const (
	rankPrioDigits = 7
	rankTagDigits  = 19
	rankEnqDigits  = 16
	rankLen        = rankPrioDigits + 1 + rankTagDigits + 1 + rankEnqDigits + 1
)

func scopeSeg(scope string) string { return strconv.Itoa(len(scope)) + ":" + scope }

// linePrefix starts the entries of scope's line.
func linePrefix(scope string) string { return runlease.QueuePrefix + scopeSeg(scope) + ":" }

// lineKey is where e's entry of scope must be for it to hold a place: the
// key whose byte order is the documented order (docs/admission.md). It is
// written here from the docs, not taken from the library, so that a
// library that writes an entry elsewhere is caught.
func lineKey(scope string, e entry) string {
	return fmt.Sprintf("%s%0*d.%0*d.%0*d:%s", linePrefix(scope), rankPrioDigits, runlease.MaxPriority-e.Priority,
		rankTagDigits, e.Tag, rankEnqDigits, e.EnqMS, e.Run)
}

func placeKey(scope, run string) string { return runlease.PlacePrefix + scopeSeg(scope) + ":" + run }
func legacyKey(scope, run string) string {
	return runlease.LegacyQueuePrefix + scopeSeg(scope) + ":" + run
}
func markKey(scope, principal string) string {
	return runlease.FairPrefix + scopeSeg(scope) + ":" + principal
}

// cutScope cuts prefix and <n>:<scope>: from key.
func cutScope(key, prefix string) (scope, rest string, ok bool) {
	rest, ok = strings.CutPrefix(key, prefix)
	digits, rest, ok2 := strings.Cut(rest, ":")
	n, err := strconv.Atoi(digits)
	if !ok || !ok2 || err != nil || n <= 0 || n >= len(rest) || rest[n] != ':' {
		return "", "", false
	}
	return rest[:n], rest[n+1:], true
}

// queueScope returns the scope of a line key, runline:<n>:<scope>:<rank>:<run>.
func queueScope(key string) (string, bool) {
	scope, rest, ok := cutScope(key, runlease.QueuePrefix)
	if !ok || len(rest) <= rankLen || rest[rankLen-1] != ':' {
		return "", false
	}
	return scope, true
}

// lineEntry decodes the line row r of scope: an entry that holds a place
// (its key is where its fields rank it), or ok false.
func lineEntry(r runlease.Row, scope string) (entry, bool) {
	var e entry
	if sc, ok := queueScope(r.Key); !ok || sc != scope || json.Unmarshal([]byte(r.Value), &e) != nil || e.Run == "" || lineKey(scope, e) != r.Key {
		return e, false
	}
	e.Key = r.Key
	return e, true
}

// liveEntries returns the entries of a scope's line that hold a place and
// are live at now.
func liveEntries(rows []runlease.Row, scope string, now time.Time) []entry {
	var out []entry
	for _, r := range rows {
		if e, ok := lineEntry(r, scope); ok && e.live(now) {
			out = append(out, e)
		}
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

// entryPlaced records when the entry written at key took its place, and
// which operation its waiter is. w.mu is held.
func (w *World) entryPlaced(key, value string, opID int) {
	var e entry
	if json.Unmarshal([]byte(value), &e) != nil {
		return
	}
	if _, ok := w.waiterOp[e.Waiter]; !ok && opID > 0 && e.Waiter != "" {
		w.waiterOp[e.Waiter] = opID
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
	qp := linePrefix(scope)
	for _, c := range w.store.logs[opID] {
		if c.isRead() && (c.outcome == OK || c.outcome == Slow) {
			at = c.at
			if c.reads(qp) {
				queueAt, queueStoreAt = c.at, c.storeAt
			}
		}
	}
	if !queueAt.IsZero() {
		return queueAt, queueStoreAt
	}
	return at, storeAt
}

// rankRead returns an instant no later than the read of scope's line that
// an operation's admission was planned on (zero: none known). A waiter
// with a place reads the line, on its own or through a scan its process's
// waiters share, only after it wrote that place: when it took it bounds
// the read. One without reads the line itself, in its own reads after its
// last write: the first of them that read the line from its first row
// bounds it (later ones read on past the head). The store's mutex is held.
func (w *World) rankRead(opID int, scope string, mine *entry) time.Time {
	if mine != nil {
		w.mu.Lock()
		p, ok := w.places[mine.Key]
		w.mu.Unlock()
		if !ok || !p.holds(*mine) {
			return time.Time{}
		}
		return p.at
	}
	var first time.Time
	logs := w.store.logs[opID]
	for i := len(logs) - 1; i >= 0 && logs[i].isRead(); i-- {
		if logs[i].reads(linePrefix(scope)) {
			first = logs[i].at
		}
	}
	return first
}

func (w *World) limitOf(scope string) int {
	for _, sc := range w.mode.Scopes {
		if sc.Name == scope {
			return sc.Limit
		}
	}
	return 0
}

// batching judges a batch of a claim or a wait whose conditions hold,
// before it applies: the order of the queue (queue-order), the run's
// legacy entry (legacy-overtaken) and the fair share (fair-share). The
// store's mutex is held.
//
// queue-order: no run takes units while live entries ranked ahead of it,
// placed before the claim read the store, still need units that the free
// ones do not fit beside its own (docs/admission.md: "one behind is admitted first
// only when the free units fit both"; a waiter ahead reserves what it
// needs). Ranked ahead of it are, as the store shows the entries: within
// its principal and priority, those ahead of its own entry, or every one
// when it has none (FIFO); at a higher priority, every one (strict
// priority); and when it has an entry, every entry ahead of that one in
// the documented order (docs/admission.md) (the fair share: the tags are in the keys).
func (w *World) batching(conds []runlease.Cond, ops []runlease.Op, at time.Time, opID int, took time.Duration) {
	w.mu.Lock()
	rk, ok := w.ranks[opID]
	hi := later(w.hi, at)
	w.mu.Unlock()
	if !ok {
		return
	}
	w.checkLegacy(conds, rk, opID, hi)
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
		queue := liveEntries(w.store.scanLocked(linePrefix(scope)), scope, at)
		var mine *entry
		w.mu.Lock()
		for i := range queue {
			if queue[i].Run == run && w.waiterOp[queue[i].Waiter] == opID {
				mine = &queue[i]
			}
		}
		w.mu.Unlock()
		if w.mode.Queue != nil && w.mode.Queue.Fair {
			w.fairAdmission(scope, run, rk, queue)
		}
		plan, planStore := w.planned(opID, scope, time.Now(), at)
		read := w.rankRead(opID, scope, mine)
		need := 0
		var ahead []string
		for _, e := range queue {
			if e.Run == run {
				continue
			}
			var kind string
			switch {
			case e.Principal == rk.principal && e.Priority == rk.priority && (mine == nil || e.before(*mine)):
				// It had lapsed when the claim read the queue, by the
				// clock that judges expiry, and lost its place, if it is
				// not live by the store's clock then: live again now only
				// because that clock stepped back.
				if !e.live(planStore) || !w.placedBefore(e, plan) {
					continue
				}
				kind = "queued earlier by the same principal"
			case e.Priority > rk.priority || (mine != nil && e.before(*mine)):
				// Live at every reading of the store's clock so far, so
				// live when the claim read it; placed before that read.
				if read.IsZero() || !e.liveAll(hi) || !w.placedBefore(e, read) {
					continue
				}
				kind = "ranked ahead"
				if e.Priority > rk.priority {
					kind = "at a higher priority"
				}
			default:
				continue
			}
			n := max(e.Units-holders[e.Run], 0)
			need += n
			ahead = append(ahead, fmt.Sprintf("%s (%s, principal %q, priority %d, tag %d, needs %d)", e.Run, kind, e.Principal, e.Priority, e.Tag, n))
		}
		if limit := w.limitOf(scope); len(ahead) > 0 && used+u+need > limit {
			w.violate("queue-order", fmt.Sprintf("%s|%s", run, scope),
				"#%d admitted %s (principal %q, priority %d, own entry %v) to %d unit(s) of %s (limit %d, %d held by others) ahead of live entries placed before its read, which still need %d: %s",
				opID, run, rk.principal, rk.priority, mine != nil, u, scope, limit, used, need, strings.Join(ahead, "; "))
		}
	}
}

// placedBefore reports whether e took the place it holds before t. The
// store's mutex is held.
func (w *World) placedBefore(e entry, t time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.places[e.Key]
	return ok && p.holds(e) && p.at.Before(t)
}

// checkLegacy: a waiter that takes a place, or is admitted without
// waiting, conditions its batch on its run's legacy entry as it read it
// (docs/operating.md "Upgrading from the scanned queue"); a live one of another
// waiter, of the waiter's fence or a newer one, is a wait of the run in
// an earlier version, and the call fails with ErrAlreadyQueued instead:
// it is never admitted nor queued beside it, nor deletes it. A batch that
// holds a condition on such an entry, live at every reading of the store's
// clock so far (so when it was read), breaks that. The store's mutex is
// held.
func (w *World) checkLegacy(conds []runlease.Cond, rk claimRank, opID int, hi time.Time) {
	for _, c := range conds {
		if c.Value == nil || !strings.HasPrefix(c.Key, runlease.LegacyQueuePrefix) {
			continue
		}
		var e entry
		if json.Unmarshal([]byte(*c.Value), &e) != nil || !e.liveAll(hi) || e.Fence < rk.fence {
			continue
		}
		w.mu.Lock()
		mine := w.waiterOp[e.Waiter] == opID
		w.mu.Unlock()
		if mine {
			continue
		}
		w.violate("legacy-overtaken", fmt.Sprintf("op%d|%s", opID, c.Key),
			"#%d (fence %d) wrote a batch conditional on the live legacy entry %s of another waiter at fence %d: %s",
			opID, rk.fence, c.Key, e.Fence, *c.Value)
	}
}

// queueWritten records the store clock's high-water mark and checks that
// no wait writes an entry, a mark or a slot once it returned or its
// process died, and that no two live entries of one principal in a scope
// share a tag (shared-tag). w.mu is held.
func (w *World) queueWritten(key string, now *string, at time.Time, opID int) {
	if at.After(w.hi) {
		w.hi = at
	}
	if now != nil && strings.HasPrefix(key, runlease.QueuePrefix) {
		w.entryPlaced(key, *now, opID)
		w.checkTags(key, *now)
	}
	if w.mode.Queue == nil || now == nil || opID <= 0 {
		return
	}
	if !strings.HasPrefix(key, runlease.QueuePrefix) && !strings.HasPrefix(key, runlease.SlotPrefix) &&
		!strings.HasPrefix(key, runlease.FairPrefix) && !strings.HasPrefix(key, runlease.PlacePrefix) &&
		!strings.HasPrefix(key, runlease.ClockPrefix) {
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

// checkTags: two runs of one principal never share a tag in a scope's
// line (the mark moves by compare-and-swap with every place, so
// overlapping enqueues of one principal get distinct tags): judged when
// an entry is written, against the entries of the principal's other runs
// live at every reading of the store's clock so far. w.mu and the store's
// mutex are held.
func (w *World) checkTags(key, value string) {
	scope, ok := queueScope(key)
	if !ok {
		return
	}
	e, ok := lineEntry(runlease.Row{Key: key, Value: value}, scope)
	if !ok || e.Principal == ghostPrincipal {
		return
	}
	for _, r := range w.store.scanLocked(linePrefix(scope)) {
		f, ok := lineEntry(r, scope)
		if !ok || f.Run == e.Run || f.Principal != e.Principal || f.Tag != e.Tag || !f.liveAll(w.hi) {
			continue
		}
		id := fmt.Sprintf("shared-tag|%s|%s|%s", scope, e.Run, f.Run)
		if w.seen[id] {
			continue
		}
		w.seen[id] = true
		v := Violation{Check: "shared-tag", At: time.Since(w.start), Detail: fmt.Sprintf(
			"entry %s of %s and the live entry %s of %s, both of principal %q in %s, share tag %d (%s; %s)",
			key, e.Run, r.Key, f.Run, e.Principal, scope, e.Tag, value, r.Value)}
		w.violations = append(w.violations, v)
		w.mon.tracef("!! %s", v)
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
			// An entry is its waiter's, whoever renewed it last (renewals
			// are batched across the waiters of a process).
			var e entry
			if json.Unmarshal([]byte(r.Value), &e) == nil && w.waiterOp[e.Waiter] == rec.o.id && e.live(snow) {
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
	w.observeWaiters(entries)
	if w.mode.Queue.Hold > 0 {
		w.observeHeads(entries, snow)
	}
}

// observeWaiters checks that a run waits once (docs/admission.md: a second call
// waiting for the same run fails with ErrAlreadyQueued, and a newer
// fence's takes the older one's place, its entry with it): no two calls of
// one run, both still waiting, hold live entries in one scope at once,
// judged by entries live at every reading of the store's clock so far.
// w.mu is held.
func (w *World) observeWaiters(rows []runlease.Row) {
	inFlight := map[int]*waitRec{}
	for _, rec := range w.waits {
		if rec.o != nil && !rec.ended && !rec.dead {
			inFlight[rec.o.id] = rec
		}
	}
	waiters := map[string]map[int]string{} // scope|run → op → entry key
	for _, r := range rows {
		scope, ok := queueScope(r.Key)
		if !ok {
			continue
		}
		e, ok := lineEntry(r, scope)
		if !ok || !e.liveAll(w.hi) {
			continue
		}
		op := w.waiterOp[e.Waiter]
		if inFlight[op] == nil {
			continue
		}
		k := scope + "|" + e.Run
		if waiters[k] == nil {
			waiters[k] = map[int]string{}
		}
		waiters[k][op] = r.Key
	}
	for k, ops := range waiters {
		if len(ops) < 2 {
			continue
		}
		id := "run-waits-twice|" + k
		if w.seen[id] {
			continue
		}
		w.seen[id] = true
		v := Violation{Check: "run-waits-twice", At: time.Since(w.start), Detail: fmt.Sprintf(
			"two calls of one run wait at once, with live entries (scope|run %s; operation → entry %v)", k, ops)}
		w.violations = append(w.violations, v)
		w.mon.tracef("!! %s", v)
	}
}

// observeHeads checks the documented bound for a waiter ranked ahead of no
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
