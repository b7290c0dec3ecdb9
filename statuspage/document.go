package statuspage

import (
	"context"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// Reading is one read of a store, every row judged at Now: what runlease
// status and the page both show, before any filter.
type Reading struct {
	Now     time.Time
	Leases  []runlease.LeaseInfo // in run id order
	Slots   []runlease.SlotInfo
	Waiters []runlease.Waiter // by scope, then first first
}

// Read reads the leases of store whose run id starts with run (every lease
// for ""), every slot, and the live waiters of every queue, all judged at
// now. A run id prefix narrows the store's scan itself.
func Read(ctx context.Context, store runlease.Store, run string, now time.Time) (*Reading, error) {
	at := runlease.WithClock(func() time.Time { return now })
	r := &Reading{Now: now}
	var leaseStore runlease.Store = store
	if run != "" {
		leaseStore = prefixStore{store, run}
	}
	var err error
	if r.Leases, err = runlease.Leases(ctx, leaseStore, at); err != nil {
		return nil, err
	}
	if r.Slots, err = runlease.Occupancy(ctx, store, at); err != nil {
		return nil, err
	}
	if r.Waiters, err = runlease.Queues(ctx, store, at); err != nil {
		return nil, err
	}
	return r, nil
}

// prefixStore is a Store whose scans see only the lease rows of run ids
// starting with run: Leases scans LeasePrefix, and reads run ids from the
// keys it gets back, which keep their full names.
type prefixStore struct {
	runlease.Store
	run string
}

func (s prefixStore) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	return s.Store.MetaScan(ctx, prefix+s.run)
}

// Filter chooses the leases of a status document, as runlease status
// --state, --run and --max do, and status.json's state, run and limit.
// Scopes are never filtered.
type Filter struct {
	States map[string]bool // the states kept; empty keeps every state
	Run    string          // a run id prefix
	Max    int             // at most this many leases; 0: all
	Offset int             // how many matching leases to skip first
}

// Apply returns the leases that f keeps, in the order given (run id
// order), and how many match f's states and prefix in all, before Offset
// and Max.
func (f Filter) Apply(leases []runlease.LeaseInfo) (kept []runlease.LeaseInfo, matched int) {
	for _, l := range leases {
		if (len(f.States) > 0 && !f.States[State(l)]) || !strings.HasPrefix(l.RunID, f.Run) {
			continue
		}
		if matched >= f.Offset && (f.Max == 0 || matched < f.Offset+f.Max) {
			kept = append(kept, l)
		}
		matched++
	}
	return kept, matched
}

// NewStatus returns the status document of the leases a [Filter] kept
// (omitted more matching ones after them), and of every scope's slots and
// queue, judged at now: what runlease status --json prints and GET
// status.json serves, built by this one function for both.
func NewStatus(store, table string, now time.Time, leases []runlease.LeaseInfo, omitted int,
	slots []runlease.SlotInfo, waiters []runlease.Waiter, limits map[string]int) Document {
	doc := NewDocument(store, table, now, leases, slots, limits)
	doc.Scopes = AddQueues(doc.Scopes, waiters, now)
	doc.Omitted = omitted
	return doc
}
