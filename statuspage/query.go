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

// Page is the document GET status.json serves: the [Document] that
// runlease status --json prints, with its stable fields, for one page of
// the leases that match the request's filters, and what the page needs to
// say about the rest.
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
	// CorruptSlots is how many slot rows do not parse.
	CorruptSlots int `json:"corrupt_slots"`
	// ForceRelease tells whether the handler was built with
	// [AllowForceRelease].
	ForceRelease bool `json:"force_release"`
}

// query is what one request asks to see.
type query struct {
	states        map[string]bool // empty: every state
	prefix        string          // run id prefix
	limit, offset int
}

// parseQuery reads the filters of a request's query string.
func parseQuery(v url.Values) (query, error) {
	q := query{states: map[string]bool{}, prefix: v.Get("run"), limit: DefaultPageSize}
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
	return v
}

// read builds the page q asks for, every row judged at one instant.
func (h *handler) read(ctx context.Context, q query) (*Page, error) {
	snap, err := h.snapshot(ctx, q.prefix)
	if err != nil {
		return nil, err
	}
	now, slots := snap.now, snap.slots
	p := &Page{Offset: q.offset, Counts: map[string]int{
		StateLive: 0, StateExpired: 0, StateReleased: 0, StateCorrupt: 0,
	}, ForceRelease: h.o.allowForce}
	// Keep only the page: on 100,000 leases, describing every matching
	// lease for JSON would cost more than the scan. The snapshot is
	// shared, and never changed.
	kept := make([]runlease.LeaseInfo, 0, min(q.limit, len(snap.leases)))
	for _, l := range snap.leases {
		st := State(l)
		p.Counts[st]++
		if len(q.states) > 0 && !q.states[st] {
			continue
		}
		if p.Matched >= q.offset && p.Matched < q.offset+q.limit {
			kept = append(kept, l)
		}
		p.Matched++
	}
	for _, s := range slots {
		if s.Corrupt {
			p.CorruptSlots++
		}
	}
	p.Document = NewDocument(h.o.name, h.o.table, now, kept, slots, h.o.limits)
	p.Omitted = max(0, p.Matched-q.offset-len(kept))
	return p, nil
}
