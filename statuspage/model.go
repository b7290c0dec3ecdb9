package statuspage

import (
	"slices"
	"strings"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/millis"
)

// Lease states, as the page, the JSON endpoint and runlease status --json
// spell them.
const (
	StateLive     = "live"     // held: Acquire by another holder is refused until it expires
	StateExpired  = "expired"  // its holder stopped renewing: anyone may take over
	StateReleased = "released" // given up: anyone may take over, continuing the fence
	StateCorrupt  = "corrupt"  // the row does not parse: nobody takes over until a person looks
	StateAbsent   = "absent"   // no row (runlease peek only)
)

// State names the state of info: one of the State constants.
func State(info runlease.LeaseInfo) string {
	switch {
	case !info.Found:
		return StateAbsent
	case info.Corrupt:
		return StateCorrupt
	case info.Released:
		return StateReleased
	case info.Live:
		return StateLive
	}
	return StateExpired
}

// Document is the status document: what GET /status.json serves and what
// runlease status --json prints. Its JSON field names are stable; README
// "Operating runlease" documents them. The zero value is not useful; build
// one with [NewDocument].
type Document struct {
	// Store names the store for people, never with a password.
	Store string `json:"store"`
	// Table is the Postgres table; null for the embedded store.
	Table *string `json:"table"`
	// Now is the instant every row was judged at, in UTC.
	Now time.Time `json:"now"`
	// Leases are the leases shown, in run id order.
	Leases []Lease `json:"leases"`
	// Omitted counts the leases that matched the filters but come after
	// the ones shown (beyond runlease status --max, or beyond this page).
	Omitted int `json:"omitted"`
	// Scopes are every scope's slots, in scope name order, never filtered.
	Scopes []Scope `json:"scopes"`
}

// NewDocument returns the document of the given leases and slots judged at
// now, with the scopes of limits that hold no slot listed too. It never
// fails; Omitted is left 0 for the caller to fill in.
func NewDocument(store, table string, now time.Time, leases []runlease.LeaseInfo, slots []runlease.SlotInfo, limits map[string]int) Document {
	doc := Document{Store: store, Now: now.UTC(), Leases: make([]Lease, 0, len(leases)), Scopes: NewScopes(slots, limits, now)}
	if table != "" {
		doc.Table = &table
	}
	for _, l := range leases {
		doc.Leases = append(doc.Leases, NewLease(l, now))
	}
	return doc
}

// Lease is one lease of a [Document]. The JSON field names are stable.
type Lease struct {
	RunID  string `json:"run_id"`
	State  string `json:"state"`  // live, expired, released, corrupt; peek also absent
	Holder string `json:"holder"` // "" when released, corrupt or absent
	Fence  uint64 `json:"fence"`  // 0 when corrupt or absent
	// Until is when the lease expires (expired, released: ended); null when
	// corrupt or absent, and when RFC 3339 cannot write it (outside the
	// years 0 to 9999; UntilMS still has it).
	Until *time.Time `json:"until"`
	// UntilMS is the row's until_ms, milliseconds since the Unix epoch;
	// null when corrupt or absent.
	UntilMS *int64 `json:"until_ms"`
	// ExpiresInMS is until_ms minus now in milliseconds, clamped to the
	// int64 range: negative once expired.
	ExpiresInMS *int64 `json:"expires_in_ms"`
	// TakeoverPossible tells whether another holder may acquire the run now:
	// true for an absent run, false for a corrupt row.
	TakeoverPossible bool `json:"takeover_possible"`
	// TakeoverAt is when takeover becomes possible (in the past when it
	// already is); null for a corrupt row, which nobody takes over, and for
	// an absent run, which has no lease to take over.
	TakeoverAt *time.Time `json:"takeover_at"`
	Row        string     `json:"row"` // the stored row, byte for byte
}

// NewLease describes info, judged at now.
func NewLease(info runlease.LeaseInfo, now time.Time) Lease {
	j := Lease{RunID: info.RunID, State: State(info), Holder: info.Holder, Fence: info.Fence, Row: info.Row}
	switch j.State {
	case StateAbsent:
		j.TakeoverPossible = true // no lease: the first acquirer gets the run
		return j
	case StateCorrupt:
		return j
	}
	untilMS, in := info.Until.UnixMilli(), millis.Until(info.Until, now)
	takeover := info.Until
	if !info.Live && info.Until.After(now) { // released ahead of this clock
		takeover = now
	}
	j.Until, j.UntilMS, j.ExpiresInMS, j.TakeoverAt = jsonTime(info.Until), &untilMS, &in, jsonTime(takeover)
	j.TakeoverPossible = !info.Live
	return j
}

// Scope is the occupancy of one scope.
type Scope struct {
	Scope string `json:"scope"`
	Used  int    `json:"used"`  // live slots, corrupt rows included: they block their slot
	Limit *int   `json:"limit"` // the operator's limit; null when not given
	Slots []Slot `json:"slots"`
	// Queue is the scope's live waiters (runlease.ClaimSlotsWait), first
	// first; empty when nobody waits or the queues were not read.
	Queue []Waiter `json:"queue"`
}

// Waiter is one live entry of a scope's queue.
type Waiter struct {
	Position    int        `json:"position"` // waiters ranked ahead of it
	RunID       string     `json:"run_id"`
	Principal   string     `json:"principal"`
	Weight      int        `json:"weight"`
	Priority    int        `json:"priority"`
	Units       int        `json:"units"`
	Tag         int64      `json:"tag"` // fair-share start tag: smaller goes first at equal priority
	Enqueued    *time.Time `json:"enqueued"`
	EnqueuedMS  int64      `json:"enqueued_ms"`
	Until       *time.Time `json:"until"`
	UntilMS     int64      `json:"until_ms"`
	ExpiresInMS int64      `json:"expires_in_ms"`
}

// AddQueues puts the waiters (as [runlease.Queues] lists them) in the
// queues of their scopes, adding the scopes that hold no slot.
func AddQueues(scopes []Scope, waiters []runlease.Waiter, now time.Time) []Scope {
	for _, w := range waiters {
		i := slices.IndexFunc(scopes, func(s Scope) bool { return s.Scope == w.Scope })
		if i < 0 {
			scopes = append(scopes, Scope{Scope: w.Scope, Slots: []Slot{}, Queue: []Waiter{}})
			i = len(scopes) - 1
		}
		scopes[i].Queue = append(scopes[i].Queue, Waiter{Position: w.Position, RunID: w.RunID,
			Principal: w.Principal, Weight: w.Weight, Priority: w.Priority, Units: w.Units, Tag: w.Tag,
			Enqueued: jsonTime(w.Enqueued), EnqueuedMS: w.Enqueued.UnixMilli(),
			Until: jsonTime(w.Until), UntilMS: w.Until.UnixMilli(), ExpiresInMS: millis.Until(w.Until, now)})
	}
	slices.SortFunc(scopes, func(a, b Scope) int { return strings.Compare(a.Scope, b.Scope) })
	return scopes
}

// Slot is one live (or corrupt) slot row.
type Slot struct {
	Slot        int        `json:"slot"`     // -1 when the key has no number
	RunID       string     `json:"run_id"`   // "" when corrupt
	Until       *time.Time `json:"until"`    // null when corrupt, or outside the years 0 to 9999
	UntilMS     *int64     `json:"until_ms"` // null when corrupt
	ExpiresInMS *int64     `json:"expires_in_ms"`
	Corrupt     bool       `json:"corrupt"`
	Key         string     `json:"key"`
}

// NewScopes groups slots by scope, adding the scopes of limits that hold
// none, in name order.
func NewScopes(slots []runlease.SlotInfo, limits map[string]int, now time.Time) []Scope {
	by := map[string]*Scope{}
	get := func(name string) *Scope {
		if by[name] == nil {
			by[name] = &Scope{Scope: name, Slots: []Slot{}, Queue: []Waiter{}}
			if n, ok := limits[name]; ok {
				by[name].Limit = &n
			}
		}
		return by[name]
	}
	for name := range limits {
		get(name)
	}
	for _, s := range slots {
		sc := get(s.Scope)
		sc.Used++
		sc.Slots = append(sc.Slots, newSlot(s, now))
	}
	out := make([]Scope, 0, len(by))
	for _, sc := range by {
		out = append(out, *sc)
	}
	slices.SortFunc(out, func(a, b Scope) int { return strings.Compare(a.Scope, b.Scope) })
	return out
}

func newSlot(s runlease.SlotInfo, now time.Time) Slot {
	j := Slot{Slot: s.Slot, RunID: s.RunID, Corrupt: s.Corrupt, Key: s.Key}
	if !s.Corrupt {
		untilMS, in := s.Until.UnixMilli(), millis.Until(s.Until, now)
		j.Until, j.UntilMS, j.ExpiresInMS = jsonTime(s.Until), &untilMS, &in
	}
	return j
}

// jsonTime returns t in UTC for a JSON field, or nil when RFC 3339 cannot
// write it: a row may hold any int64 of milliseconds, some 292 million
// years either way, and encoding/json refuses years outside 0 to 9999.
func jsonTime(t time.Time) *time.Time {
	t = t.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		return nil
	}
	return &t
}
