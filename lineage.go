package runlease

import (
	"reflect"
	"runtime"
	"sync"
	"weak"
)

// A lease row tells a Lease's writes apart from other writers' by holder,
// fence and until_ms only. Once [Prune] deletes a run's row, the run's
// fences start over at 1, and a new acquisition by the same holder writes
// rows that an older Lease value of that holder could also have sent: two
// writes stamped in one millisecond are equal byte for byte. A Lease that
// reads back such a row after a write of unknown outcome cannot tell from
// the row whether its own write landed or the new acquisition's did.
//
// A holder names one driver, and a driver's Lease values live in its
// process, so the process can tell: it counts, per store, run and holder,
// the acquisitions it begins. A Lease judges a row it cannot tell apart
// (see Lease.ambiguous) by whether an acquisition of the same holder began
// after its own: if none did, the row is its own; if a later one won, the
// Lease is superseded; if a later one is in flight or failed, the outcome
// stays unknown.
//
// The count lives in a lineage shared by the Lease values of one store,
// run and holder, and lasts as long as one of them does: the process-wide
// map holds it weakly. lineages.mu and lineage.mu are leaf locks, held only
// to read or write what they guard: never across store I/O, hooks or
// logging, and never one inside the other.
var lineages = struct {
	mu sync.Mutex
	m  map[lineageKey]weak.Pointer[lineage]
}{m: map[lineageKey]weak.Pointer[lineage]{}}

type lineageKey struct {
	store  any // the Store value, a pointer: its identity
	key    string
	holder string
}

// lineage counts the acquisitions of one store, run and holder.
type lineage struct {
	mu    sync.Mutex
	gen   uint64 // the latest acquisition begun
	won   bool   // it succeeded
	fence uint64 // at this fence, when won
}

// lineageOf returns the lineage of key and holder on store, or nil for a
// store whose identity the process cannot know (it is not a pointer).
func lineageOf(store Store, key, holder string) *lineage {
	if reflect.ValueOf(store).Kind() != reflect.Pointer {
		return nil
	}
	k := lineageKey{store: store, key: key, holder: holder}
	lineages.mu.Lock()
	defer lineages.mu.Unlock()
	if c := lineages.m[k].Value(); c != nil {
		return c
	}
	c := &lineage{}
	lineages.m[k] = weak.Make(c)
	runtime.AddCleanup(c, forgetLineage, k)
	return c
}

// forgetLineage drops k's entry once its lineage is gone.
func forgetLineage(k lineageKey) {
	lineages.mu.Lock()
	defer lineages.mu.Unlock()
	if wp, ok := lineages.m[k]; ok && wp.Value() == nil {
		delete(lineages.m, k)
	}
}

// begin records that an acquisition begins, and returns its generation.
func (c *lineage) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.won, c.fence = false, 0
	return c.gen
}

// win records that the acquisition of generation gen won fence.
func (c *lineage) win(gen, fence uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		c.won, c.fence = true, fence
	}
}

// ambiguity is how a Lease must judge a row it cannot tell apart from
// another acquisition's.
type ambiguity int

const (
	ambiguousOwn        ambiguity = iota // no later acquisition by its holder: the row is its own
	ambiguousSuperseded                  // a later acquisition by its holder won: the lease is lost
	ambiguousUnknown                     // a later one is in flight or failed
)

// ambiguous judges a row of this lease's holder and fence, stamped as one
// of its writes whose outcome is unknown, that a later acquisition by the
// same holder could have written too. It returns the fence that
// acquisition won, for ambiguousSuperseded.
func (l *Lease) ambiguous() (ambiguity, uint64) {
	c := l.lineage
	if c == nil {
		return ambiguousOwn, 0 // the process cannot tell; see lineageOf
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.gen == l.gen:
		return ambiguousOwn, 0
	case c.won:
		return ambiguousSuperseded, c.fence
	}
	return ambiguousUnknown, 0
}
