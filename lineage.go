package runlease

import (
	"reflect"
	"runtime"
	"slices"
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
// the acquisitions it begins and wins. A Lease judges a row it cannot tell
// apart (see Lease.ambiguous) by what the holder's other acquisitions did:
// if one won after this Lease did, or one in flight (or failed with an
// unknown outcome) sent the same bytes, the outcome stays unknown; else
// the row is its own.
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

// lineage orders the acquisitions of one store, run and holder: seq
// counts their beginnings and their wins, so a later win has a larger
// number than every win and beginning before it.
type lineage struct {
	mu      sync.Mutex
	seq     uint64
	lastWin uint64               // seq of the latest win
	open    map[uint64][]sentRow // acquisitions begun and not won, with the rows they sent that may land or have landed
}

// sentRow is a row an acquisition sent: the holder is the lineage's.
type sentRow struct {
	fence   uint64
	untilMS int64
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

// begin records that an acquisition begins, and returns its number.
func (c *lineage) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if c.open == nil {
		c.open = map[uint64][]sentRow{}
	}
	c.open[c.seq] = nil
	return c.seq
}

// send records, before it is sent, a row the acquisition numbered begun
// writes; refused, after the store refused it for certain.
func (c *lineage) send(begun, fence uint64, untilMS int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rows, ok := c.open[begun]; ok {
		c.open[begun] = append(rows, sentRow{fence, untilMS})
	}
}

func (c *lineage) refused(begun, fence uint64, untilMS int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rows, ok := c.open[begun]; ok {
		c.open[begun] = slices.DeleteFunc(rows, func(r sentRow) bool { return r == sentRow{fence, untilMS} })
	}
}

// settle records the end of the acquisition numbered begun: won, or failed, with an unknown outcome when unknown (it then stays open: its
// write may land yet). It returns the number of the win, 0 for a failure.
func (c *lineage) settle(begun uint64, won, unknown bool) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if won || !unknown {
		delete(c.open, begun)
	}
	if !won {
		return 0
	}
	c.seq++
	c.lastWin = c.seq
	return c.seq
}

// ambiguity is how a Lease must judge a row it cannot tell apart from
// another acquisition's.
type ambiguity int

const (
	ambiguousOwn     ambiguity = iota // no later acquisition by its holder: the row is its own
	ambiguousUnknown                  // a later one is in flight or failed
)

// ambiguous judges a row of this lease's holder and fence, stamped untilMS
// as one of its writes whose outcome is unknown, that another acquisition
// by the same holder could have written too.
func (l *Lease) ambiguous(untilMS int64) ambiguity {
	c := l.lineage
	if c == nil {
		return ambiguousOwn // the process cannot tell; see lineageOf
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastWin > l.gen {
		// Another acquisition won after this lease did: the order in
		// which acquisitions return is not the order in which their rows
		// landed, so only the store can tell, once the row moves on to
		// one no Lease of the holder is unsure of.
		return ambiguousUnknown
	}
	// An acquisition not won (in flight, or failed with an unknown
	// outcome) that sent these very bytes may have written the row. It
	// records each row before sending it, so a row read back after it
	// landed is always found here; rows it did not send never match, so
	// one such acquisition does not make every later doubt of the live
	// Lease unknown.
	want := sentRow{l.fence, untilMS}
	for _, rows := range c.open {
		if slices.Contains(rows, want) {
			return ambiguousUnknown
		}
	}
	return ambiguousOwn
}
