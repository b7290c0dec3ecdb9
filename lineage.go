package runlease

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// A lease row tells a Lease's writes apart from other writers' by holder,
// fence and until_ms only; the row format has no room for more. Several
// Lease values of one holder and run can live in one process (a re-entry
// racing an earlier acquisition or its renewal; a new acquisition after
// [Prune] deleted the row and the run's fences started over at 1), and if
// two of them sent the same bytes, a Lease reading back one of its writes
// of unknown outcome could not tell whether its own write landed or the
// other's did: it could confirm a write that never landed, or take the
// other Lease's row for its own and write over it.
//
// So no two of them ever send the same bytes: every row any Lease of one
// run and holder sends at one fence is stamped with an until_ms above every
// row any of them sent at that fence before (a lineage counts them). Rows
// at different fences differ already, so a new acquisition, at a new
// fence, starts from now+TTL again whatever TTL an earlier Lease used. A
// row read back that equals one this Lease sent is then this Lease's
// write.
//
// A lineage belongs to one Store value: Leases on stores of their own (each
// test its own, with a clock of its own) never push each other's stamps.
// Equal Store values are one store, and so are a Store and the wrappers
// around it that say so with an Unwrap method (see [Store]); a Store value
// that cannot be compared, or is not equal to itself, is refused where
// options are built, so every Store value here can key a map. A process that reaches one database through two Store values, and
// acquires one run through both as one holder, must not rely on them being
// told apart: use one Store value per database, or a holder per Store
// value.
//
// A stamp runs ahead of now+TTL only when another Lease of the holder
// stamped further ahead at the same fence: by a millisecond per write
// beyond one a millisecond, or, when a Lease with a longer TTL shares the
// fence (two acquisitions of the holder racing for it, or one after a
// prune while an earlier Lease at that fence is still referenced), up to
// that Lease's TTL. A row then outlasts its holder's trust, which delays a
// successor and never lets one in early.
//
// A holder names one driver (see [HolderFor]), and a driver's Lease values
// live in its process, so the process sees every writer of its holder's
// rows. A lineage lasts as long as one of its Lease values does (the
// process-wide map holds it weakly), and, after a write of unknown outcome,
// until that write's row has expired, whether or not a Lease value still
// refers to it (a pin holds it): a write still on its way to the store
// then never meets a new lineage of its fence, and once its row has
// expired, a new Lease stamps above it.
//
// lineages.mu is a leaf lock, held only to read or write the map and the
// pins: never across store I/O, hooks or logging.
var lineages = struct {
	mu        sync.Mutex
	m         map[lineageKey]weak.Pointer[lineage]
	pins      map[*lineage]time.Time // the lineages kept alive, and until when
	nextSweep time.Time              // when expired pins are dropped next
}{m: map[lineageKey]weak.Pointer[lineage]{}, pins: map[*lineage]time.Time{}}

// pinSlack is how long a pin outlasts the row it was taken for.
const pinSlack = time.Second

type lineageKey struct {
	store       Store
	key, holder string
	fence       uint64
}

// lineage is the stamp shared by the Lease values of one run, holder and
// fence in this process.
type lineage struct {
	sentMS atomic.Int64 // the largest until_ms any of them sent
}

// lineageOf returns the lineage of the run key, holder and fence on store.
func lineageOf(store Store, key, holder string, fence uint64) *lineage {
	k := lineageKey{store: storeIdentity(store), key: key, holder: holder, fence: fence}
	lineages.mu.Lock()
	defer lineages.mu.Unlock()
	if len(lineages.pins) > 0 {
		// Due, or the clock went back past the last sweep: never in a
		// process, whose readings compare on the monotonic clock, but in
		// each new testing/synctest bubble, whose clock starts over (pins
		// of earlier bubbles would otherwise pile up until it caught up).
		// Only pins whose time has passed go either way.
		if now := time.Now(); now.After(lineages.nextSweep) || now.Before(lineages.nextSweep.Add(-pinSlack)) {
			for c, until := range lineages.pins {
				if now.After(until) {
					delete(lineages.pins, c)
				}
			}
			lineages.nextSweep = now.Add(pinSlack)
		}
	}
	if c := lineages.m[k].Value(); c != nil {
		return c
	}
	c := &lineage{}
	lineages.m[k] = weak.Make(c)
	runtime.AddCleanup(c, forgetLineage, k)
	return c
}

// maxUnwrap bounds how many wrappers storeIdentity looks through.
const maxUnwrap = 16

// storeIdentity returns the store that store wraps, through every Unwrap method
// (see [Store]), or store itself: Store values of one identity are one
// store to the lineages and to the memo of released rows.
func storeIdentity(store Store) Store {
	for range maxUnwrap {
		u, ok := store.(interface{ Unwrap() Store })
		if !ok {
			return store
		}
		inner := u.Unwrap()
		if inner == nil {
			return store
		}
		store = inner
	}
	return store
}

// forgetLineage drops k's entry once its lineage is gone.
func forgetLineage(k lineageKey) {
	lineages.mu.Lock()
	defer lineages.mu.Unlock()
	if wp, ok := lineages.m[k]; ok && wp.Value() == nil {
		delete(lineages.m, k)
	}
}

// stamp returns the until_ms of a row written now that holds for ttl,
// above floor and above every until_ms handed out before, and the largest
// handed out before it.
func (c *lineage) stamp(now time.Time, ttl time.Duration, floor int64) (ms, prev int64) {
	for {
		prev = c.sentMS.Load()
		ms = stampMS(now, ttl, max(floor, prev))
		if c.sentMS.CompareAndSwap(prev, ms) {
			return ms, prev
		}
	}
}

// unstamp hands ms, returned by stamp with prev, back when the row it
// stamped was certainly not written and no stamp was handed out since: as
// if it never had been, so that a retry that follows at once (an
// acquisition's create refused because the row exists) stamps the same.
func (c *lineage) unstamp(ms, prev int64) {
	c.sentMS.CompareAndSwap(ms, prev)
}

// pin keeps c alive, for a write of unknown outcome stamped ms, until that
// write's row has expired: until the clock that stamped it, read as now,
// passes ms (and pinSlack more).
func (c *lineage) pin(now time.Time, ms int64) {
	until := time.Now().Add(time.Duration(ms-now.UnixMilli())*time.Millisecond + pinSlack)
	lineages.mu.Lock()
	if until.After(lineages.pins[c]) {
		lineages.pins[c] = until
	}
	lineages.mu.Unlock()
}

// stamp returns the until_ms of the next row this lease sends: above every
// row it sent, and above every row the holder's other Lease values of the
// run sent at its fence.
func (l *Lease) stamp(floor int64) int64 {
	ms, _ := l.lineage.stamp(l.o.now(), l.o.ttl, floor)
	return ms
}
