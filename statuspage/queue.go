package statuspage

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// MaxExplained is how many waiting runs one read of the store explains
// for the page's why column ([runlease.ExplainSlots], one read of each of
// the run's scopes per run); the waiters of further runs show no reason,
// but each can still be explained on its own (?explain=RUN).
const MaxExplained = 100

// Why is what holds one waiter back in one scope, as the page shows it.
type Why struct {
	// BlockedBy is runlease.ScopeExplanation.BlockedBy: "capacity" (the
	// units in use leave too few), "order" (units are free but waiters
	// ranked ahead reserve them) or "" (nothing: it is admitted at its
	// next look); "unknown" when the page cannot tell.
	BlockedBy string `json:"blocked_by"`
	Text      string `json:"text"` // for people
}

// Explained is where one run stands in each scope it waits in: the
// page's explanation view (?explain=RUN).
type Explained struct {
	RunID      string           `json:"run_id"`
	Waiting    bool             `json:"waiting"`    // the run has a live queue entry
	Admissible bool             `json:"admissible"` // a claim made now would be admitted in every scope explained
	Note       string           `json:"note"`       // why scopes are missing, if any are
	Summary    string           `json:"summary"`    // for people: the verdict and the note
	Scopes     []ExplainedScope `json:"scopes"`
}

// ExplainedScope is runlease.ScopeExplanation for the page.
type ExplainedScope struct {
	Scope    string   `json:"scope"`
	Limit    int      `json:"limit"`
	Units    int      `json:"units"`
	Used     int      `json:"used"`
	Own      int      `json:"own"`
	Corrupt  int      `json:"corrupt"`
	QueueLen int      `json:"queue_length"`
	Queued   bool     `json:"queued"`
	Position int      `json:"position"`
	Reserved int      `json:"reserved"`
	Why      Why      `json:"why"`
	Ahead    []Waiter `json:"ahead"`
	Holders  []Slot   `json:"holders"`
}

// explanation is ExplainSlots' answer for one run, or why there is none.
type explanation struct {
	ex      *runlease.Explanation
	err     error
	noLimit []string // the run's scopes without a limit, not explained
}

// explainRun explains runID in the scopes r shows it waiting in whose
// limits are known.
func explainRun(ctx context.Context, store runlease.Store, r *Reading, runID string, limits map[string]int) explanation {
	var scopes []runlease.Scope
	var e explanation
	for _, w := range r.Waiters {
		if w.RunID != runID {
			continue
		}
		limit, ok := limits[w.Scope]
		if !ok {
			e.noLimit = append(e.noLimit, w.Scope)
			continue
		}
		var sc runlease.Scope
		if p, ok := strings.CutPrefix(w.Scope, "principal:"); ok {
			sc = runlease.PrincipalScope(p, limit)
		} else {
			sc = runlease.NamedScope(w.Scope, limit)
		}
		scopes = append(scopes, sc.Take(w.Units))
	}
	if len(scopes) > 0 {
		now := r.Now
		e.ex, e.err = runlease.ExplainSlots(ctx, store, runID, scopes, runlease.WithClock(func() time.Time { return now }))
	}
	return e
}

// explainAll explains, by run id, the first MaxExplained runs met in r's
// queues (by scope name, then rank). It fails only when ctx ends: a run
// that cannot be explained says so in its row.
func explainAll(ctx context.Context, store runlease.Store, r *Reading, limits map[string]int) (map[string]explanation, error) {
	out := map[string]explanation{}
	for _, w := range r.Waiters {
		if _, done := out[w.RunID]; done || len(out) >= MaxExplained {
			continue
		}
		out[w.RunID] = explainRun(ctx, store, r, w.RunID, limits)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// scopeOf returns the explanation of scope in e, if any.
func (e explanation) scopeOf(scope string) *runlease.ScopeExplanation {
	if e.ex == nil {
		return nil
	}
	for i := range e.ex.Scopes {
		if e.ex.Scopes[i].Scope == scope {
			return &e.ex.Scopes[i]
		}
	}
	return nil
}

// whyOf says what holds a waiter of scope back, from its run's
// explanation e; found says whether the run was explained at all.
func whyOf(e explanation, found bool, scope string) Why {
	switch {
	case !found:
		return Why{"unknown", "not explained: more than " + strconv.Itoa(MaxExplained) + " runs wait; see its explanation"}
	case slices.Contains(e.noLimit, scope):
		return Why{"unknown", "unknown: no limit given for " + scope + " (serve --limit SCOPE=N, statuspage.WithLimits)"}
	case e.err != nil:
		return Why{"unknown", "cannot explain: " + e.err.Error()}
	}
	se := e.scopeOf(scope)
	if se == nil {
		return Why{"unknown", "unknown"}
	}
	return whyIn(e.ex, *se)
}

// whyIn says what holds a run back in one scope se of its explanation ex:
// with room in se, the claim, all or nothing, still waits for the scopes
// that hold it back, reserving its units in se meanwhile.
func whyIn(ex *runlease.Explanation, se runlease.ScopeExplanation) Why {
	why := whyText(se)
	if se.Queued && se.BlockedBy == "" && !ex.Admissible {
		var held []string
		for _, o := range ex.Scopes {
			if o.BlockedBy != "" {
				held = append(held, o.Scope+" ("+o.BlockedBy+")")
			}
		}
		why.Text = "nothing here: held back in " + strings.Join(held, ", ")
	}
	return why
}

// whyText says what holds a run back in one scope.
func whyText(se runlease.ScopeExplanation) Why {
	if !se.Queued {
		return Why{se.BlockedBy, "no longer queued: admitted or gone since the queue was read"}
	}
	free := max(0, se.Limit-se.Used)
	switch se.BlockedBy {
	case "capacity":
		return Why{"capacity", "capacity: " + strconv.Itoa(se.Used) + " of " + plural(se.Limit, "unit") +
			" in use, " + strconv.Itoa(free) + " free; it asks " + strconv.Itoa(se.Units)}
	case "order":
		return Why{"order", "order: " + strconv.Itoa(free) + " of " + plural(se.Limit, "unit") + " free, " +
			strconv.Itoa(se.Reserved) + " reserved by the " + plural(se.Position, "waiter") + " ahead; it asks " +
			strconv.Itoa(se.Units)}
	case "":
		return Why{"", "nothing now: admitted at its next look"}
	}
	return Why{se.BlockedBy, se.BlockedBy}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// whys is the why column of every waiter of doc, by scope and run.
func whys(doc Document, ex map[string]explanation) map[string]map[string]Why {
	out := map[string]map[string]Why{}
	for _, sc := range doc.Scopes {
		if len(sc.Queue) == 0 {
			continue
		}
		m := make(map[string]Why, len(sc.Queue))
		for _, w := range sc.Queue {
			e, found := ex[w.RunID]
			m[w.RunID] = whyOf(e, found, sc.Scope)
		}
		out[sc.Scope] = m
	}
	return out
}

// explained builds the explanation view of runID from e, judged at now.
func explained(runID string, r *Reading, e explanation) *Explained {
	x := &Explained{RunID: runID, Scopes: []ExplainedScope{}}
	x.Waiting = r.waiting(runID)
	var notes []string
	switch {
	case !x.Waiting:
		notes = append(notes, "run "+runID+" is in no queue: it was admitted, gave up, or never waited")
	case e.err != nil:
		notes = append(notes, "cannot explain: "+e.err.Error())
	}
	if len(e.noLimit) > 0 {
		notes = append(notes, "not explained in "+strings.Join(e.noLimit, ", ")+
			": no limit given (serve --limit SCOPE=N, statuspage.WithLimits)")
	}
	x.Note = strings.Join(notes, "; ")
	if e.ex == nil || e.err != nil {
		x.Summary = summary(x)
		return x
	}
	x.Admissible = e.ex.Admissible
	for _, se := range e.ex.Scopes {
		j := ExplainedScope{Scope: se.Scope, Limit: se.Limit, Units: se.Units, Used: se.Used, Own: se.Own,
			Corrupt: se.Corrupt, QueueLen: se.QueueLen, Queued: se.Queued, Position: se.Position,
			Reserved: se.Reserved, Why: whyIn(e.ex, se), Ahead: []Waiter{}, Holders: []Slot{}}
		if sc := AddQueues(nil, se.Ahead, r.Now); len(sc) == 1 {
			j.Ahead = sc[0].Queue
		}
		if sc := NewScopes(se.Holders, nil, r.Now); len(sc) == 1 {
			j.Holders = sc[0].Slots
		}
		x.Scopes = append(x.Scopes, j)
	}
	x.Summary = summary(x)
	return x
}

// summary says in one line where an explained run stands.
func summary(x *Explained) string {
	var held []string
	for _, se := range x.Scopes {
		if se.Why.BlockedBy != "" {
			held = append(held, se.Scope+" ("+se.Why.BlockedBy+")")
		}
	}
	s := ""
	switch {
	case len(x.Scopes) == 0:
	case len(held) > 0:
		s = "held back in " + strings.Join(held, ", ")
	default:
		s = "nothing holds it back now: it is admitted at its next look"
	}
	if x.Note != "" {
		if s != "" {
			s += "; "
		}
		s += x.Note
	}
	return s
}
