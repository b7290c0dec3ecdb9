package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// report is what status shows: every lease and every live slot, read at one
// instant of the store's clock.
type report struct {
	store    string
	table    string // the Postgres table; "" for the embedded store
	now      time.Time
	leases   []runlease.LeaseInfo
	omitted  int  // leases that matched the filters beyond --max
	filtered bool // --state, --run or --max left leases out
	slots    []runlease.SlotInfo
	limits   map[string]int // scope limits given with --limit
	// at formats an instant in the text output; nil is timestamp. The
	// demo's simulated clock prints its own.
	at func(time.Time) string
}

// timeText formats t with r.at.
func (r *report) timeText(t time.Time) string {
	if r.at != nil {
		return r.at(t)
	}
	return timestamp(t)
}

// readReport reads every lease and slot of s, judged at now.
func readReport(ctx context.Context, s runlease.Store, name string, now time.Time, limits map[string]int) (*report, error) {
	leases, err := runlease.Leases(ctx, s, at(now))
	if err != nil {
		return nil, err
	}
	slots, err := runlease.Occupancy(ctx, s, at(now))
	if err != nil {
		return nil, err
	}
	return &report{store: name, now: now, leases: leases, slots: slots, limits: limits}, nil
}

// statusJSON is the document status --json prints. The field names are
// stable; see the status command's help.
type statusJSON struct {
	Store   string      `json:"store"`
	Table   *string     `json:"table"` // the Postgres table; null for the embedded store
	Now     time.Time   `json:"now"`
	Leases  []leaseJSON `json:"leases"`
	Omitted int         `json:"omitted"` // leases matching --state and --run beyond --max
	Scopes  []scopeJSON `json:"scopes"`
}

// scopeJSON is the occupancy of one scope.
type scopeJSON struct {
	Scope string     `json:"scope"`
	Used  int        `json:"used"`  // live slots, corrupt rows included: they block their slot
	Limit *int       `json:"limit"` // from --limit; null when not given
	Slots []slotJSON `json:"slots"`
}

// slotJSON is one live (or corrupt) slot row.
type slotJSON struct {
	Slot        int        `json:"slot"`     // -1 when the key has no number
	RunID       string     `json:"run_id"`   // "" when corrupt
	Until       *time.Time `json:"until"`    // null when corrupt, or outside the years 0 to 9999
	UntilMS     *int64     `json:"until_ms"` // null when corrupt
	ExpiresInMS *int64     `json:"expires_in_ms"`
	Corrupt     bool       `json:"corrupt"`
	Key         string     `json:"key"`
}

// scopes groups the slots by scope, adding the scopes of --limit that hold
// none, in name order.
func (r *report) scopes() []scopeJSON {
	by := map[string]*scopeJSON{}
	get := func(name string) *scopeJSON {
		if by[name] == nil {
			by[name] = &scopeJSON{Scope: name, Slots: []slotJSON{}}
			if n, ok := r.limits[name]; ok {
				by[name].Limit = &n
			}
		}
		return by[name]
	}
	for name := range r.limits {
		get(name)
	}
	for _, s := range r.slots {
		sc := get(s.Scope)
		sc.Used++
		sc.Slots = append(sc.Slots, newSlotJSON(s, r.now))
	}
	out := make([]scopeJSON, 0, len(by))
	for _, sc := range by {
		out = append(out, *sc)
	}
	slices.SortFunc(out, func(a, b scopeJSON) int { return strings.Compare(a.Scope, b.Scope) })
	return out
}

func newSlotJSON(s runlease.SlotInfo, now time.Time) slotJSON {
	j := slotJSON{Slot: s.Slot, RunID: s.RunID, Corrupt: s.Corrupt, Key: s.Key}
	if !s.Corrupt {
		untilMS, in := s.Until.UnixMilli(), millisUntil(s.Until, now)
		j.Until, j.UntilMS, j.ExpiresInMS = jsonTime(s.Until), &untilMS, &in
	}
	return j
}

// writeJSON prints the report as one JSON document: indented, or on one
// line for a stream of refreshes.
func (r *report) writeJSON(w io.Writer, compact bool) error {
	doc := statusJSON{Store: r.store, Now: r.now.UTC(), Leases: []leaseJSON{}, Omitted: r.omitted, Scopes: r.scopes()}
	if r.table != "" {
		doc.Table = &r.table
	}
	for _, l := range r.leases {
		doc.Leases = append(doc.Leases, newLeaseJSON(l, r.now))
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if !compact {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(doc)
}

// writeText prints the report as two aligned tables.
func (r *report) writeText(w io.Writer) {
	fmt.Fprintf(w, "store %s at %s\n\n", r.store, r.timeText(r.now))
	r.writeLeases(w)
	fmt.Fprintln(w)
	r.writeScopes(w)
}

func (r *report) writeLeases(w io.Writer) {
	if len(r.leases) == 0 && r.filtered {
		fmt.Fprintln(w, "no leases match --state and --run")
		return
	}
	if len(r.leases) == 0 {
		fmt.Fprintln(w, "no leases")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "RUN\tHOLDER\tFENCE\tSTATE\tEXPIRES\tTAKEOVER")
	for _, l := range r.leases {
		fence := strconv.FormatUint(l.Fence, 10)
		if l.Corrupt {
			fence = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.RunID, orDash(l.Holder), fence,
			leaseState(l), expiresText(l, r.now), takeoverText(l, r.timeText))
	}
	tw.Flush()
	if r.omitted > 0 {
		more := "leases"
		if r.omitted == 1 {
			more = "lease"
		}
		fmt.Fprintf(w, "… and %d more %s, beyond --max\n", r.omitted, more)
	}
}

func (r *report) writeScopes(w io.Writer) {
	scopes := r.scopes()
	if len(scopes) == 0 {
		fmt.Fprintln(w, "no slots held")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "SCOPE\tUSED\tHOLDERS")
	for _, sc := range scopes {
		used := strconv.Itoa(sc.Used)
		if sc.Limit != nil {
			used += "/" + strconv.Itoa(*sc.Limit)
			if sc.Used > *sc.Limit {
				used += " (over: the limit was lowered)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", sc.Scope, used, orDash(slotHolders(sc.Slots, r.now)))
	}
	tw.Flush()
}

// slotHolders lists who holds a scope's slots, and until when.
func slotHolders(slots []slotJSON, now time.Time) string {
	parts := make([]string, 0, len(slots))
	for _, s := range slots {
		if s.Corrupt {
			parts = append(parts, fmt.Sprintf("corrupt row %q", s.Key))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s (slot %d, %s)", s.RunID, s.Slot,
			"in "+spanText(time.UnixMilli(*s.UntilMS), now)))
	}
	return strings.Join(parts, ", ")
}
