package sim

import (
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
)

// Outcome is what the fault store does with one call.
type Outcome int

// The outcomes of a call. Writes take any of them; reads take OK, Fail and
// the hangs.
const (
	// OK applies the call and replies.
	OK Outcome = iota
	// Fail changes nothing and reports a fault that is certainly not
	// applied (StorageError.Unknown false).
	Fail
	// Lost applies the call and loses the reply (Unknown true).
	Lost
	// Unsent changes nothing and reports an unknown outcome.
	Unsent
	// Hang blocks until the call's context ends, then reports an unknown
	// outcome without having applied the call.
	Hang
	// HangApplied blocks until the call's context ends, applies the call at
	// that instant, and reports an unknown outcome.
	HangApplied
	// Slow waits a while of fake time (a slow store, not a faulty one),
	// then serves the call as OK; if the call's context ends first, it
	// reports an unknown outcome without having applied the call.
	Slow
	// Stall is Slow for longer than the TTL (a store that stops answering
	// for a while, or a paused process): it waits between one and two of
	// the store's stall lengths, then serves the call as Slow.
	Stall
	// Deaf ignores the call's context (a store whose driver does not
	// watch it): it waits between half and one and a half of the store's
	// stall lengths, however soon the context ends, then serves the call
	// as Slow, applied, with no error.
	Deaf
)

var outcomeNames = [...]string{"ok", "fail", "lost-reply", "unsent-unknown", "hang", "hang-applied", "slow", "stall", "deaf"}

func (o Outcome) String() string { return outcomeNames[o] }

// errInjected is the driver error inside every injected fault, so that a
// checker can tell an injected fault from a context's error.
var errInjected = errors.New("injected fault")

// errCut is the driver error of a call made by an operation whose process
// died (see Store.cutOff).
var errCut = errors.New("the calling process died")

// Rates are the chances of each faulty outcome for one class of call; the
// rest of the time the call is OK.
type Rates struct {
	Fail, Lost, Unsent, Hang, HangApplied, Slow, Stall, Deaf float64
}

func (r Rates) pick(x float64) Outcome {
	for _, c := range []struct {
		p float64
		o Outcome
	}{{r.Fail, Fail}, {r.Lost, Lost}, {r.Unsent, Unsent}, {r.Hang, Hang}, {r.HangApplied, HangApplied}, {r.Slow, Slow}, {r.Stall, Stall}, {r.Deaf, Deaf}} {
		if x < c.p {
			return c.o
		}
		x -= c.p
	}
	return OK
}

// Class sorts calls by what they touch, so a mode can fail one kind of
// write and spare another.
type Class int

// Classes of calls.
const (
	LeaseWrite Class = iota // MetaCAS, MetaDelete or MetaBatch of lease rows only
	UserBatch               // MetaBatch carrying the caller's own keys (fenced writes)
	MultiCAS                // MetaCASMany (batched renewals)
	SlotWrite               // writes of slot rows
	Read                    // MetaGet and MetaScan
	// Resolve is the first single-key call (MetaCAS or MetaGet) on a key
	// whose write a batched compare-and-swap refused: the start of that
	// lease's resolution on its own. A weather that gives this class no
	// faults leaves the call to its own class.
	Resolve
	numClasses
)

// Weather is a set of rates per class: the store's health for a while.
type Weather struct {
	Name  string
	Rates [numClasses]Rates
}

// healthy is the weather of a store that never fails.
var healthy = Weather{Name: "healthy"}

// decider chooses outcomes. The choice for a call depends only on the seed,
// the weather, the call's operation and key, and how many calls of that
// operation and key came before, not on what other goroutines did
// meanwhile, so that schedules replay even where goroutines race.
type decider struct {
	seed  uint64
	count map[string]uint64
}

func (d *decider) draw(op, key string) (x float64, r *rand.Rand) {
	id := op + "\x00" + key
	n := d.count[id]
	d.count[id] = n + 1
	h := fnv.New64a()
	h.Write([]byte(strconv.FormatUint(d.seed, 10) + "\x00" + id + "\x00" + strconv.FormatUint(n, 10)))
	r = rand.New(rand.NewPCG(d.seed, h.Sum64()))
	return r.Float64(), r
}
