package statuspage

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/areev/runlease"
)

// Page is what the page shows, and what GET page.json serves its script:
// the status [Document] of one page of the leases that match the request's
// filters, exactly as GET status.json serves it, and what the page needs
// to say about the rest. Only the Document's fields are stable; the others
// follow the page.
type Page struct {
	Document
	// Offset is how many matching leases come before the ones shown.
	Offset int `json:"offset"`
	// Matched is how many leases match the filters (Omitted of them come
	// after the ones shown).
	Matched int `json:"matched"`
	// Counts is how many leases with the requested run id prefix are in
	// each state, whatever the state filter.
	Counts map[string]int `json:"counts"`
	// Released tells whether released leases are shown when no state is
	// asked for (?released=1); the page hides them otherwise.
	Released bool `json:"released"`
	// CorruptSlots is how many slot rows do not parse.
	CorruptSlots int `json:"corrupt_slots"`
	// ForceRelease tells whether the handler was built with
	// [AllowForceRelease].
	ForceRelease bool `json:"force_release"`
	// Why says what holds each waiter back, by scope and run id.
	Why map[string]map[string]Why `json:"why"`
	// Explain is the run the request asked to explain (?explain=RUN);
	// null when none.
	Explain *Explained `json:"explain"`
}

// query is what one request asks to see.
type query struct {
	states        map[string]bool // empty: every state (the page: but released)
	prefix        string          // run id prefix
	limit, offset int             // limit 0: every lease
	released      bool            // the page: show released leases without a state filter
	explain       string          // the page: the run to explain
}

// parseQuery reads the filters of a request's query string. The page
// (page) pages its leases by DefaultPageSize, hides released leases unless
// asked, and may explain a run; status.json, as runlease status --json,
// shows every matching lease unless given a limit.
func parseQuery(v url.Values, page bool) (query, error) {
	q := query{states: map[string]bool{}, prefix: v.Get("run")}
	if page {
		q.limit = DefaultPageSize
	}
	for _, s := range v["state"] {
		for st := range strings.SplitSeq(s, ",") {
			switch st {
			case StateLive, StateExpired, StateReleased, StateCorrupt:
				q.states[st] = true
			case "":
			default:
				return q, fmt.Errorf("state %q: want live, expired, released or corrupt", st)
			}
		}
	}
	var err error
	if s := v.Get("limit"); s != "" {
		if q.limit, err = strconv.Atoi(s); err != nil || q.limit < 1 || q.limit > MaxPageSize {
			return q, fmt.Errorf("limit %q: want 1 to %d", s, MaxPageSize)
		}
	}
	if s := v.Get("offset"); s != "" {
		if q.offset, err = strconv.Atoi(s); err != nil || q.offset < 0 {
			return q, fmt.Errorf("offset %q: want 0 or more", s)
		}
	}
	for _, k := range []string{"released", "explain"} {
		if v.Has(k) && !page {
			return q, fmt.Errorf("%s: the page's own setting; status.json shows every state unless ?state= is given, "+
				"as status --json does", k)
		}
	}
	switch s := v.Get("released"); s {
	case "", "0":
	case "1":
		q.released = true
	default:
		return q, fmt.Errorf("released %q: want 1 or 0", s)
	}
	q.explain = v.Get("explain")
	return q, nil
}

// values returns q as a query string, for the page's links and its script.
func (q query) values() url.Values {
	v := url.Values{}
	if len(q.states) > 0 {
		states := make([]string, 0, len(q.states))
		for s := range q.states {
			states = append(states, s)
		}
		slices.Sort(states)
		v.Set("state", strings.Join(states, ","))
	}
	if q.prefix != "" {
		v.Set("run", q.prefix)
	}
	if q.limit != DefaultPageSize {
		v.Set("limit", strconv.Itoa(q.limit))
	}
	if q.offset > 0 {
		v.Set("offset", strconv.Itoa(q.offset))
	}
	if q.released {
		v.Set("released", "1")
	}
	if q.explain != "" {
		v.Set("explain", q.explain)
	}
	return v
}

// filter is the Filter q asks for: the page hides released leases unless
// a state filter or ?released=1 shows them.
func (q query) filter(page bool) Filter {
	f := Filter{States: q.states, Run: q.prefix, Max: q.limit, Offset: q.offset}
	if page && len(q.states) == 0 && !q.released {
		f.States = map[string]bool{StateLive: true, StateExpired: true, StateCorrupt: true}
	}
	return f
}

// read builds the page q asks for, every row judged at one instant. The
// page (page) adds the why column and the explanation asked for; its
// Document is what status.json serves.
func (h *handler) read(ctx context.Context, q query, page bool) (*Page, error) {
	snap, err := h.snapshot(ctx, q.prefix)
	if err != nil {
		return nil, err
	}
	r := snap.reading
	// Keep only the page: on 100,000 leases, describing every matching
	// lease for JSON would cost more than the scan. The snapshot is
	// shared, and never changed.
	kept, matched := q.filter(page).Apply(r.Leases)
	p := &Page{Offset: q.offset, Matched: matched, Released: q.released, ForceRelease: h.o.allowForce,
		Counts: map[string]int{StateLive: 0, StateExpired: 0, StateReleased: 0, StateCorrupt: 0}}
	p.Document = NewStatus(h.o.name, h.o.table, r.Now, kept, max(0, matched-q.offset-len(kept)), r.Slots, r.Waiters, h.o.limits)
	if !page {
		return p, nil
	}
	for _, l := range r.Leases {
		p.Counts[State(l)]++
	}
	for _, s := range r.Slots {
		if s.Corrupt {
			p.CorruptSlots++
		}
	}
	p.Why = whys(p.Document, snap.why)
	if q.explain != "" {
		e, ok := snap.why[q.explain]
		if !ok {
			e = explainRun(ctx, h.store, r, q.explain, h.o.limits)
		}
		p.Explain = explained(q.explain, r, e)
	}
	return p, nil
}

// waiting reports whether runID waits in any queue of r.
func (r *Reading) waiting(runID string) bool {
	return slices.ContainsFunc(r.Waiters, func(w runlease.Waiter) bool { return w.RunID == runID })
}
