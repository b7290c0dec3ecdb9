package runlease

import (
	"context"
	"math"
	"slices"
	"time"
)

// Waiter is one live entry of a scope's queue, as [ExplainSlots] and
// [Queues] report it.
type Waiter struct {
	Scope     string
	RunID     string
	Principal string
	Weight    int
	Priority  int
	Units     int
	// Tag is the entry's fair-share start tag: among equal priorities,
	// the smaller tag is admitted first.
	Tag      int64
	Enqueued time.Time // by the clock that judges expiry
	Until    time.Time // when the entry expires unless its waiter renews it
	Position int       // how many live waiters of the scope rank ahead of it
}

// ScopeExplanation is where a run stands in one scope.
type ScopeExplanation struct {
	Scope string
	Limit int
	Units int // the units the run asks of the scope
	// Used is the slots in use, which a claim made now must fit beside:
	// live slot rows of other runs and of the run itself (an earlier
	// claim's, which a new claim never re-uses), and slot rows that do
	// not parse.
	Used     int
	Own      int // how many of Used are the run's own live slot rows
	Corrupt  int // how many of Used are slot rows that do not parse
	QueueLen int // the scope's live waiters
	// Queued says the run has a live entry in the scope's queue; Position
	// is then how many live waiters rank ahead of it, and otherwise how
	// many would rank ahead of a claim made now.
	Queued   bool
	Position int
	Priority int
	Tag      int64
	Ahead    []Waiter // the live waiters ranked ahead, first first
	Reserved int      // the units they wait for
	// Holders lists the live slots, with their runs and expiries, and
	// the slot rows that do not parse (Corrupt set).
	Holders []SlotInfo
	// BlockedBy is "" when the run would be admitted to this scope now,
	// "capacity" when the slots in use leave too few units (the run would
	// wait even with nobody queued ahead), and "order" when units are free but
	// waiters ranked ahead reserve them.
	BlockedBy string
}

// Explanation answers "why is my run not starting?" for one claim.
type Explanation struct {
	RunID  string
	Scopes []ScopeExplanation // in the order of the scopes asked for
	// Admissible says a claim made now would be admitted in every scope.
	Admissible bool
}

// ExplainSlots tells where runID stands in each scope it would claim
// (with the units, priority and fair share given, as for [ClaimSlots]):
// the limit, the units held, the queue and the run's own place in it, who
// is ahead of it and who holds the slots, and what holds it back. It reads
// each scope once and writes nothing. It takes [WithClock], [WithPriority]
// and [WithFairShare]; a queued run is explained at the place it holds,
// whatever those say.
func ExplainSlots(ctx context.Context, store Store, runID string, scopes []Scope, opts ...Option) (*Explanation, error) {
	o, err := buildOptions(store, opts, optClock|optsRank, "ExplainSlots")
	if err != nil {
		return nil, err
	}
	if err := checkName("runID", runID, maxHolderLen); err != nil {
		return nil, err
	}
	if err := checkScopes(scopes); err != nil {
		return nil, err
	}
	states := make([]*scopeState, len(scopes))
	for i, sc := range scopes {
		if states[i], err = readScope(ctx, store, sc, runID, o, true); err != nil {
			return nil, err
		}
	}
	// The run's rank: the place it holds when queued in any scope (a
	// waiter writes one rank to all), else the place a claim would take.
	var me *queueEntry
	for _, st := range states {
		if q := findEntry(st.queue, runID); q != nil {
			e := q.e
			me = &e
			break
		}
	}
	if me == nil {
		me = &queueEntry{Run: runID, Principal: o.principal, Weight: o.weightOr1(), Priority: o.priority,
			EnqMS: math.MaxInt64, Tag: rankIn(states, runID, o.principal, o.priority)}
	}
	ex := &Explanation{RunID: runID, Admissible: true}
	for i, sc := range scopes {
		st := states[i]
		units := sc.Units()
		v := judge(st.used, st.queue, me)
		se := ScopeExplanation{Scope: sc.name, Limit: sc.limit, Units: units, Used: st.used, Own: st.own, Corrupt: st.corrupt,
			QueueLen: len(st.queue), Queued: findEntry(st.queue, runID) != nil, Position: len(v.ahead),
			Priority: me.Priority, Tag: me.Tag, Reserved: v.reserved, Holders: st.slotInfos(sc),
			BlockedBy: v.blockedBy(units, sc.limit)}
		for pos, q := range v.ahead {
			se.Ahead = append(se.Ahead, waiterOf(sc.name, q.e, pos))
		}
		if se.BlockedBy != "" {
			ex.Admissible = false
		}
		ex.Scopes = append(ex.Scopes, se)
	}
	return ex, nil
}

func waiterOf(scope string, e queueEntry, pos int) Waiter {
	return Waiter{Scope: scope, RunID: e.Run, Principal: e.Principal, Weight: e.Weight, Priority: e.Priority,
		Units: e.Units, Tag: e.Tag, Enqueued: time.UnixMilli(e.EnqMS).UTC(), Until: time.UnixMilli(e.UntilMS).UTC(),
		Position: pos}
}

// Queues lists the live waiters of every scope's queue in the store, by
// scope name and then in rank order, for status surfaces. A queue row
// that does not parse fails the call with a [*CorruptRowError]. It takes
// [WithClock].
func Queues(ctx context.Context, store Store, opts ...Option) ([]Waiter, error) {
	o, err := buildOptions(store, opts, optClock, "Queues")
	if err != nil {
		return nil, err
	}
	rows, err := store.MetaScan(ctx, QueuePrefix)
	if err != nil {
		return nil, err
	}
	now := o.nowMS()
	byScope := map[string][]Row{}
	var names []string
	for _, r := range rows {
		scope, _, ok := parseLineKey(r.Key)
		if !ok {
			continue
		}
		if _, seen := byScope[scope]; !seen {
			names = append(names, scope)
		}
		byScope[scope] = append(byScope[scope], r)
	}
	slices.Sort(names)
	var out []Waiter
	for _, name := range names {
		q, err := decodeLine(byScope[name], name, now, nil, nil)
		if err != nil {
			return nil, err
		}
		for pos, e := range q {
			out = append(out, waiterOf(name, e.e, pos))
		}
	}
	return out, nil
}
