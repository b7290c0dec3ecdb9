package statuspage

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

//go:embed page.html
var pageHTML string

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"expires":     expiresText,
	"takeover":    takeoverText,
	"used":        usedText,
	"holders":     holdersText,
	"at":          timestamp,
	"release":     releaseURL,
	"waited":      waitedText,
	"why":         whyCell,
	"ahead":       aheadText,
	"slotHolders": func(slots []Slot) string { return holdersText(Scope{Slots: slots}) },
	"add":         func(a, b int) int { return a + b },
	"states":      func() []string { return []string{StateLive, StateExpired, StateReleased, StateCorrupt} },
}).Parse(pageHTML))

// view is what the page template shows.
type view struct {
	*Page
	Query      string // the request's filters, as a query string
	States     map[string]bool
	Run        string
	Limit      int
	Prev, Next string // links to the neighbouring pages; "" at either end
	First      int    // the 1-based position of the first lease shown
	Corrupt    int    // corrupt lease and slot rows
	// ReleasedLink shows or hides released leases, when no state filter
	// is given ("" otherwise); Hidden counts the released leases hidden.
	ReleasedLink string
	Hidden       int
	Queued       int    // waiters in every queue
	Explaining   string // the link that closes the explanation
	Linked       query  // the request's query, for the explain links
}

// load reads the page that r's query asks for. When the query is bad or
// the store fails, it answers r with the error and returns false.
func (h *handler) load(w http.ResponseWriter, r *http.Request, page bool) (query, *Page, bool) {
	q, err := parseQuery(r.URL.Query(), page)
	if err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return query{}, nil, false
	}
	p, err := h.read(r.Context(), q, page)
	if err != nil {
		http.Error(w, "reading the store: "+err.Error(), http.StatusServiceUnavailable)
		return query{}, nil, false
	}
	return q, p, true
}

func (h *handler) page(w http.ResponseWriter, r *http.Request) {
	q, p, ok := h.load(w, r, true)
	if !ok {
		return
	}
	v := view{Page: p, Query: q.values().Encode(), States: q.states, Run: q.prefix, Limit: q.limit,
		First: q.offset + 1, Corrupt: p.Counts[StateCorrupt] + p.CorruptSlots, Linked: q}
	if len(q.states) == 0 {
		toggle := q
		toggle.released, toggle.offset = !q.released, 0
		v.ReleasedLink = "?" + toggle.values().Encode()
		if !q.released {
			v.Hidden = p.Counts[StateReleased]
		}
	}
	for _, sc := range p.Scopes {
		v.Queued += len(sc.Queue)
	}
	if q.explain != "" {
		closed := q
		closed.explain = ""
		v.Explaining = "?" + closed.values().Encode()
	}
	if q.offset > 0 {
		prev := q
		prev.offset = max(0, q.offset-q.limit)
		v.Prev = "?" + prev.values().Encode()
	}
	if p.Omitted > 0 {
		next := q
		next.offset = q.offset + len(p.Leases)
		v.Next = "?" + next.values().Encode()
	}
	render(w, http.StatusOK, pageTmpl, v)
}

// json serves status.json: the Document alone, which runlease status
// --json prints for the same filters.
func (h *handler) json(w http.ResponseWriter, r *http.Request) {
	_, p, ok := h.load(w, r, false)
	if !ok {
		return
	}
	writeJSON(w, p.Document)
}

// pageJSON serves page.json, what the page's script refreshes it from.
func (h *handler) pageJSON(w http.ResponseWriter, r *http.Request) {
	_, p, ok := h.load(w, r, true)
	if !ok {
		return
	}
	writeJSON(w, p)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // a failed write is the client's gone; nothing to tell it
}

// render executes t into a buffer first, so that a failed template is a
// 500 and not half a page.
func render(w http.ResponseWriter, status int, t *template.Template, data any) {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		http.Error(w, "rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// The page's words for instants and spans, which assets/page.js repeats
// for its refreshes: change both together.

// expiresText says when a lease expires, or since when it has been free.
func expiresText(l Lease) string {
	if l.ExpiresInMS == nil {
		return "-"
	}
	switch l.State {
	case StateLive:
		return "in " + spanText(*l.ExpiresInMS)
	case StateExpired:
		return spanText(neg(*l.ExpiresInMS)) + " ago"
	case StateReleased:
		return "released " + spanText(neg(*l.ExpiresInMS)) + " ago"
	}
	return "-"
}

// takeoverText says when another driver may take the run over: for a
// live lease, when it expires, relative to now (the page shows the instant
// on hover).
func takeoverText(l Lease) string {
	switch l.State {
	case StateLive:
		return "in " + spanText(*l.ExpiresInMS)
	case StateCorrupt:
		return "never: inspect the row"
	}
	return "possible now"
}

// neg returns -ms without overflowing.
func neg(ms int64) int64 {
	if ms == math.MinInt64 {
		return math.MaxInt64
	}
	return -ms
}

// spanText formats ms milliseconds for people, as runlease status does.
func spanText(ms int64) string {
	switch {
	case ms <= 0:
		return "0s"
	case ms < 1000:
		return strconv.FormatInt(ms, 10) + "ms"
	case ms > math.MaxInt64/int64(time.Millisecond):
		return strconv.FormatInt(ms/(365.25*24*3600*1000), 10) + " years"
	}
	s := (time.Duration(ms) * time.Millisecond).Round(time.Second).String()
	s = strings.Replace(s, "m0s", "m", 1)
	return strings.Replace(s, "h0m", "h", 1)
}

// timestamp formats t for people: UTC, to the second.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// usedText is a scope's fill: used, or used/limit.
func usedText(sc Scope) string {
	s := strconv.Itoa(sc.Used)
	if sc.Limit != nil {
		s += "/" + strconv.Itoa(*sc.Limit)
		if sc.Used > *sc.Limit {
			s += " (over: the limit was lowered)"
		}
	}
	return s
}

// holdersText lists who holds a scope's slots, and until when.
func holdersText(sc Scope) string {
	parts := make([]string, 0, len(sc.Slots))
	for _, s := range sc.Slots {
		if s.Corrupt {
			parts = append(parts, "CORRUPT row "+strconv.Quote(s.Key))
			continue
		}
		parts = append(parts, s.RunID+" (slot "+strconv.Itoa(s.Slot)+", in "+spanText(*s.ExpiresInMS)+")")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// waitedText says how long a waiter has waited, judged at now.
func waitedText(q Waiter, now time.Time) string {
	return spanText(now.UnixMilli()-q.EnqueuedMS) + " ago"
}

// ExplainURL is the page, as v shows it, with runID explained.
func (v view) ExplainURL(runID string) string {
	q := v.Linked
	q.explain = runID
	return "?" + q.values().Encode() + "#explain"
}

// aheadText lists the waiters ahead of a run.
func aheadText(ahead []Waiter) string {
	parts := make([]string, 0, len(ahead))
	for _, w := range ahead {
		parts = append(parts, w.RunID+" ("+plural(w.Units, "unit")+")")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// whyCell is the why column of a waiter of scope.
func whyCell(p *Page, scope, runID string) Why { return p.Why[scope][runID] }

// releaseURL is the confirmation page of runID's release.
func releaseURL(runID string) string { return "release?run=" + url.QueryEscape(runID) }
