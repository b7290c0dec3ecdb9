package runlease

import (
	"encoding/json"
	"errors"
	"fmt"
)

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
// docs/admission.md ("Rows").
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

// queueScopePrefix is the key prefix of a scope's legacy queue entries,
// and the key of the scope's bell (queueBell), which no row has.
func queueScopePrefix(scope string) string { return LegacyQueuePrefix + scopeSegment(scope) + ":" }

// parseLegacyQueueKey splits a legacy queue key into its scope and run id.
func parseLegacyQueueKey(key string) (scope, runID string, ok bool) {
	scope, runID, ok = cutScopeSegment(key, LegacyQueuePrefix)
	return scope, runID, ok && runID != ""
}

// queuedRow is a live entry of a scope's line as a read found it.
type queuedRow struct {
	key string
	raw string
	e   queueEntry
}

// decodeLine decodes the rows of a scope's line, read in key order (so in
// rank order), and returns its live entries, in that order. It records every entry row that parses by
// key in all (when not nil). An entry that does not parse is recorded in
// bad, by key, and holds no place: it ranks nowhere and reserves nothing,
// and nothing writes over it. With bad nil, it is a [*CorruptRowError]
// instead.
func decodeLine(rows []Row, scope string, nowMS int64, all, bad map[string]string) ([]queuedRow, error) {
	var out []queuedRow
	for _, r := range rows {
		e, err := decodeLineRow(scope, r)
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
		if !e.live(nowMS) {
			continue
		}
		out = append(out, queuedRow{key: r.Key, raw: r.Value, e: e})
	}
	return out, nil
}

// rankIn returns the fair-share tag a new entry of the run gets in the
// scopes read: the later of the virtual time now and where the
// principal's last run finishes (its mark, the latest of every scope's).
// A scope's virtual time is the smallest tag waiting there at the entry's
// priority or, when nothing waits there, the scope's clock, so that it
// never goes back and a principal gains no credit by having waited less;
// a claim of several scopes takes the latest of theirs. The marks are advanced by compare-and-swap with every entry
// and every admission from a read (waiter.placeWrites, markWrites), so two
// runs of one principal never get the same tag.
func rankIn(states []*scopeState, runID, principal string, priority int) int64 {
	var vt, fin int64
	for _, st := range states {
		// Each scope's virtual time, and the latest of them: a claim of
		// several scopes starts at no scope's head earlier than that
		// scope's own, so it never ranks ahead of a scope's head.
		if st.prioSeen {
			vt = max(vt, st.prioTag)
		} else {
			vt = max(vt, st.clock)
		}
		fin = max(fin, st.marks[principal])
	}
	return max(vt, fin)
}

// FairPrefix starts the rows that remember, per scope, where each
// principal's last run finishes in fair-share virtual time:
// runfair:<n>:<scope>:<principal>, with n the scope name's length, holding
// {"finish":N,"until_ms":N}. A mark moves, by compare-and-swap, when a
// run of the principal takes a place in the line or is admitted without
// waiting, so two runs of one principal never share a tag however their
// calls overlap. A wait that ends without admission moves the mark back
// when no later run of the principal moved it since. until_ms only tells
// Prune when the mark was last written: ranking uses the finish whatever
// its age, since a finish behind the virtual time changes nothing.
const FairPrefix = "runfair:"

type fairMark struct {
	Finish  int64 `json:"finish"`
	UntilMS int64 `json:"until_ms"`
}

func (m fairMark) encode() string {
	b, _ := json.Marshal(m) // integers always marshal
	return string(b)
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

func fairScopePrefix(scope string) string { return FairPrefix + scopeSegment(scope) + ":" }

func fairKey(scope, principal string) string { return fairScopePrefix(scope) + principal }

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
