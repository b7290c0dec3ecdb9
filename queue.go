package runlease

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// QueuePrefix starts the rows of the admission queue: one entry per scope a
// waiting run asks for, at runqueue:<n>:<scope>:<run id>, where n is the
// scope name's length in bytes. The length keeps the key unambiguous when a
// principal scope's name or a run id holds ':' ("principal:a" with run
// "b:x" and "principal:a:b" with run "x" are two keys).
const QueuePrefix = "runqueue:"

// Fair-share ranking. Among waiters of equal priority, each entry carries a
// start tag in a virtual time that advances by tagUnit per unit claimed
// divided by the principal's weight. A new entry starts at the later of the
// smallest tag waiting (the virtual time now) and the finish of its
// principal's last waiting entry, so a principal's k-th waiting run starts
// (k-1)/weight units after its first one, and a principal with nothing
// waiting starts at the head. This is start-time fair queueing.
const (
	tagUnit = 1_000_000
	// MaxWeight is the largest fair-share weight [WithFairShare] accepts.
	MaxWeight = 1000
	// MaxUnits is the most units one claim may ask of a scope: each unit
	// is a slot row, and a claim writes all of them in one batch.
	MaxUnits = 64
	// MaxPriority bounds [WithPriority] both ways.
	MaxPriority = 1_000_000
	// maxTag bounds the tags and finishes a row may hold, far below
	// overflow: a virtual time that grows by at most 64e6 per admission.
	maxTag = 1 << 61
)

// queueEntry is the JSON of one queue row. The fields are documented in
// the README ("Queue entries").
type queueEntry struct {
	Run       string   `json:"run"`
	Waiter    string   `json:"waiter"` // the waiting call's id: a run waits once
	Fence     uint64   `json:"fence"`  // the lease's fence for Lease.ClaimSlotsWait, else 0
	Seq       uint64   `json:"seq"`    // grows with every write, so no two rows are equal
	Principal string   `json:"principal"`
	Weight    int      `json:"weight"`
	Priority  int      `json:"priority"`
	Units     int      `json:"units"`
	Tag       int64    `json:"tag"`
	EnqMS     int64    `json:"enq_ms"`
	UntilMS   int64    `json:"until_ms"`
	Scopes    []string `json:"scopes"`
}

func (e *queueEntry) encode() string {
	b, err := json.Marshal(e)
	if err != nil {
		panic(err) // strings and integers always marshal
	}
	return string(b)
}

func (e *queueEntry) live(nowMS int64) bool { return e.UntilMS > nowMS }

// finish is the virtual time at which the entry's share is spent.
func (e *queueEntry) finish() int64 {
	return e.Tag + int64(e.Units)*tagUnit/int64(e.Weight)
}

// before reports whether e ranks ahead of f: higher priority first, then the
// smaller fair-share tag, then the earlier enqueue, then the run id. The
// order is total and the same in every scope, so two waiters that share two
// scopes are in the same order in both and cannot hold each other back.
func (e *queueEntry) before(f *queueEntry) bool {
	switch {
	case e.Priority != f.Priority:
		return e.Priority > f.Priority
	case e.Tag != f.Tag:
		return e.Tag < f.Tag
	case e.EnqMS != f.EnqMS:
		return e.EnqMS < f.EnqMS
	default:
		return e.Run < f.Run
	}
}

var errBadEntry = errors.New("not a queue entry")

func decodeEntry(value string) (queueEntry, error) {
	e, ok := decodeCanonicalEntry(value)
	if !ok {
		e = queueEntry{}
		if err := json.Unmarshal([]byte(value), &e); err != nil {
			return e, err
		}
	}
	switch {
	case e.Run == "" || e.Waiter == "":
		return e, fmt.Errorf("%w: run and waiter are required", errBadEntry)
	case e.Weight < 1 || e.Weight > MaxWeight:
		return e, fmt.Errorf("%w: weight %d is outside [1, %d]", errBadEntry, e.Weight, MaxWeight)
	case e.Units < 1 || e.Units > MaxUnits:
		return e, fmt.Errorf("%w: units %d is outside [1, %d]", errBadEntry, e.Units, MaxUnits)
	case e.Priority < -MaxPriority || e.Priority > MaxPriority:
		return e, fmt.Errorf("%w: priority %d is outside [%d, %d]", errBadEntry, e.Priority, -MaxPriority, MaxPriority)
	case e.Tag < 0 || e.Tag > maxTag || e.UntilMS <= 0 || e.EnqMS <= 0:
		return e, fmt.Errorf("%w: tag must be in [0, %d], enq_ms and until_ms positive", errBadEntry, int64(maxTag))
	}
	return e, nil
}

// queueScopePrefix is the key prefix of a scope's queue.
func queueScopePrefix(scope string) string {
	return QueuePrefix + strconv.Itoa(len(scope)) + ":" + scope + ":"
}

func queueKey(scope, runID string) string { return queueScopePrefix(scope) + runID }

// parseQueueKey splits a queue key into its scope and run id.
func parseQueueKey(key string) (scope, runID string, ok bool) {
	rest, ok := strings.CutPrefix(key, QueuePrefix)
	if !ok {
		return "", "", false
	}
	digits, rest, ok := strings.Cut(rest, ":")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n <= 0 || n >= len(rest) || strconv.Itoa(n) != digits || rest[n] != ':' {
		return "", "", false
	}
	if rest[n+1:] == "" {
		return "", "", false
	}
	return rest[:n], rest[n+1:], true
}

// queuedRow is a live entry of a scope's queue as a scan found it.
type queuedRow struct {
	key string
	raw string
	e   queueEntry
}

// scopeView is one scope as a claim sees it: its slot rows and its live
// queue entries, read by two scans.
type scopeView struct {
	sc    Scope
	nowMS int64
	slots []Row // the scope's slot rows, parsed and checked by plan
	queue []queuedRow
	// expiresMS is the earliest instant at which a live slot row or queue
	// entry of the view expires, for a waiter's next look (0: none).
	expiresMS int64
}

// scanQueue reads the live entries of a scope's queue, and records every
// entry row by key in all (when not nil). An entry that does not parse is
// recorded in bad, by key, and holds no place: it ranks nowhere and
// reserves nothing, and nothing writes over it. With bad nil, it is a
// [*CorruptRowError] instead.
func scanQueue(rows []Row, scope string, nowMS int64, all, bad map[string]string) ([]queuedRow, int64, error) {
	return scanQueueReusing(rows, scope, nowMS, all, bad, nil)
}

// scanQueueReusing is scanQueue that takes the decoded entry of a row from
// prev, an earlier scan's shared decoding, when the row is unchanged since
// (nil: decode every row).
func scanQueueReusing(rows []Row, scope string, nowMS int64, all, bad map[string]string, prev *sharedQueue) ([]queuedRow, int64, error) {
	out := make([]queuedRow, 0, len(rows)) // entries are large: grow once
	var next int64
	for _, r := range rows {
		sc, _, ok := parseQueueKey(r.Key)
		if !ok || sc != scope {
			continue
		}
		e, found := prev.entry(r)
		if !found {
			var err error
			if e, err = decodeEntry(r.Value); err != nil {
				if bad == nil {
					return nil, 0, corruptRow(r.Key, r.Value, err)
				}
				bad[r.Key] = r.Value
				continue
			}
		}
		if all != nil {
			all[r.Key] = r.Value
		}
		if !e.live(nowMS) {
			continue
		}
		if next == 0 || e.UntilMS < next {
			next = e.UntilMS
		}
		out = append(out, queuedRow{key: r.Key, raw: r.Value, e: e})
	}
	if len(out) == 0 {
		out = nil // no entry: nil, not empty
	}
	sortQueue(out)
	return out, next, nil
}

// sortQueue sorts q in rank order. It sorts indices and then moves each
// entry once: entries are large, and a sort that swapped them would copy
// each of them about log n times (with write barriers, for their strings).
func sortQueue(q []queuedRow) {
	if len(q) < 2 {
		return
	}
	idx := make([]int32, len(q))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		switch {
		case q[a].e.before(&q[b].e):
			return -1
		case q[b].e.before(&q[a].e):
			return 1
		}
		return 0
	})
	// Position j takes the entry at idx[j]. Each cycle of the permutation
	// is followed once, from its first position; a position filled is
	// marked -1.
	for i := range q {
		if idx[i] < 0 {
			continue
		}
		first, j := q[i], i
		for {
			k := int(idx[j])
			idx[j] = -1
			if k == i {
				q[j] = first
				break
			}
			q[j], j = q[k], k
		}
	}
}

// rankOf returns the fair-share tag a new entry of the run gets in queues
// that hold the given live entries, where marks holds, per scope, the
// finish of each principal's last queued entry (see fairMark): the later
// of the virtual time now and the principal's finish. The virtual time is
// the smallest tag waiting at the entry's priority or, when nothing waits
// there, the latest finish any principal has marked, so that it never goes
// back and a principal gains no credit by having waited less.
func rankOf(queues [][]queuedRow, marks []map[string]int64, runID, principal string, priority int) int64 {
	var vt, fin int64
	waiting := false
	for _, q := range queues {
		for i := range q {
			e := &q[i].e
			if e.Run == runID || e.Priority != priority {
				continue
			}
			if !waiting || e.Tag < vt {
				vt, waiting = e.Tag, true
			}
			if e.Principal == principal {
				fin = max(fin, e.finish())
			}
		}
	}
	for _, m := range marks {
		if !waiting {
			for _, f := range m {
				vt = max(vt, f)
			}
		}
		fin = max(fin, m[principal])
	}
	return max(vt, fin)
}

// rankIn is rankOf over the queues and marks of scopes as read.
func rankIn(states []*scopeState, runID, principal string, priority int) int64 {
	queues := make([][]queuedRow, len(states))
	marks := make([]map[string]int64, len(states))
	for i, st := range states {
		queues[i], marks[i] = st.queue, st.marks
	}
	return rankOf(queues, marks, runID, principal, priority)
}

// FairPrefix starts the rows that remember, per scope, where each
// principal's last admitted run finishes in fair-share virtual time:
// runfair:<n>:<scope>:<principal>, with n the scope name's length, holding
// {"finish":N,"until_ms":N}. A principal whose runs are admitted at once
// and who queues again does not start over at the head: its next run
// starts where its last one finished. A mark moves only when a waiter of
// [ClaimSlotsWait] is admitted, and lapses a TTL later: a run that queues
// writes no mark, and a wait that ends without admission leaves the marks
// as they were.
const FairPrefix = "runfair:"

type fairMark struct {
	Finish  int64 `json:"finish"`
	UntilMS int64 `json:"until_ms"`
}

func decodeMark(value string) (fairMark, error) {
	var m fairMark
	if err := json.Unmarshal([]byte(value), &m); err != nil {
		return m, err
	}
	if m.Finish < 0 || m.Finish > maxTag || m.UntilMS <= 0 {
		return m, fmt.Errorf("%w: finish must be in [0, %d], until_ms positive", errBadEntry, int64(maxTag))
	}
	return m, nil
}

func fairScopePrefix(scope string) string {
	return FairPrefix + strconv.Itoa(len(scope)) + ":" + scope + ":"
}

func fairKey(scope, principal string) string { return fairScopePrefix(scope) + principal }

// scanMarks reads the live fair-share marks of a scope, by principal, and
// records every mark row by key in all (when not nil). A mark that does
// not parse is recorded in bad, by key: its principal ranks as one without
// a mark, and nothing writes over it. With bad nil, it is a
// [*CorruptRowError] instead.
func scanMarks(rows []Row, scope string, nowMS int64, all, bad map[string]string) (map[string]int64, error) {
	prefix := fairScopePrefix(scope)
	marks := map[string]int64{}
	for _, r := range rows {
		principal, ok := strings.CutPrefix(r.Key, prefix)
		if !ok {
			continue
		}
		m, err := decodeMark(r.Value)
		if err != nil {
			if bad == nil {
				return nil, corruptRow(r.Key, r.Value, err)
			}
			bad[r.Key] = r.Value
			continue
		}
		if all != nil {
			all[r.Key] = r.Value
		}
		if m.UntilMS > nowMS {
			marks[principal] = m.Finish
		}
	}
	return marks, nil
}

// verdict is whether a run can be admitted to one scope now, and why not.
type verdict struct {
	used     int // slots in use: live slot rows (the run's own included) and rows that do not parse
	reserved int // units reserved by live waiters ranked ahead
	ahead    []queuedRow
}

// admits reports whether units can be taken in the scope without exceeding
// its limit or overtaking a waiter ranked ahead. The run's own live slots
// count as used: a claim never re-uses another claim's rows.
func (v verdict) admits(units, limit int) bool { return v.used+v.reserved+units <= limit }

// blockedBy names what holds a run back in one scope: "capacity" when the
// units in use leave too few, "order" when waiters ranked ahead
// reserve what is free, and "" when it can be admitted.
func (v verdict) blockedBy(units, limit int) string {
	switch {
	case v.admits(units, limit):
		return ""
	case v.used+units > limit:
		return "capacity"
	default:
		return "order"
	}
}

// judge computes the verdict of a run ranked at me in a scope where used
// slots are in use.
func judge(used int, queue []queuedRow, me *queueEntry) verdict {
	v := verdict{used: used}
	for _, q := range queue {
		if q.e.Run == me.Run || !q.e.before(me) {
			continue
		}
		v.ahead = append(v.ahead, q)
		// A waiter ahead reserves every unit it asks for, even when its
		// run holds slots of the scope already (it claimed them before
		// and waits again): its admission takes rows of its own.
		v.reserved += q.e.Units
	}
	return v
}
