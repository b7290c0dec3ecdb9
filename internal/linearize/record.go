// Package linearize checks that a runlease.Store is linearizable: it runs
// random reads and conditional writes against a store from many clients,
// records each call's invocation and response on a clock every client
// shares, and hands the history to porcupine, which searches for a
// sequential order that respects real time and a model of the store.
//
// # The model
//
// The store is a map of independent compare-and-swap registers, one per
// key. A get returns the register's value, or absent; a cas writes a new
// value if and only if the register holds the expected one (or, expecting
// absence, is absent) and says whether it did; a delete removes the value
// if and only if it equals the expected one. Because single-key calls touch
// one register, the history is split by key and each key is checked on its
// own, which keeps the search small ([Check] with partition set). A batch
// (runlease.Batcher) touches several keys at once, so a history with
// batches is checked as one map ([Check] without partition).
//
// # Faults
//
// A call that fails is recorded according to what the failure says about
// its effect:
//
//   - A failed read returned nothing and changed nothing: it is left out.
//   - A write that failed with a [runlease.StorageError] whose Unknown is
//     false certainly changed nothing: it is left out too.
//   - Any other failed write (runlease.ErrOutcomeUnknown, a context error
//     the store could not classify, anything unexpected) may or may not
//     have taken effect, at any instant after its call, even after the
//     client gave up on it. It is recorded as returning at infinity with an
//     unknown output, and the model accepts it either way: applied at some
//     point after its call, or never (which porcupine represents by
//     ordering it after every other operation, where its effect is seen by
//     no one).
//
// Leaving out a call that did change the store would make a correct store
// look broken, never the reverse, so misclassified faults show up as
// failures rather than hide them.
package linearize

import (
	"errors"
	"fmt"
	"strings"

	"github.com/areev/runlease"
)

// Kind names a Store call.
type Kind string

// The calls a history holds.
const (
	Get    Kind = "get"    // MetaGet(Key)
	CAS    Kind = "cas"    // MetaCAS(Key, Expected, Value)
	Delete Kind = "delete" // MetaDelete(Key, *Expected)
	Batch  Kind = "batch"  // MetaBatch(Conds, Ops)
)

// Record is one call and its outcome. Records travel between processes as
// JSON lines, hence the short field names.
type Record struct {
	Proc   int  `json:"p"` // the process that made the call
	Client int  `json:"c"` // the client (goroutine) within the process
	Kind   Kind `json:"k"`

	Key string `json:"key,omitempty"`
	// Expected is the value a cas or delete is conditional on; for a cas,
	// nil means "only if absent".
	Expected *string         `json:"exp,omitempty"`
	Value    string          `json:"v,omitempty"` // the value a cas writes
	Conds    []runlease.Cond `json:"conds,omitempty"`
	Ops      []runlease.Op   `json:"ops,omitempty"`

	Found   bool   `json:"found,omitempty"`   // get: the key was present
	Got     string `json:"got,omitempty"`     // get: its value
	OK      bool   `json:"ok,omitempty"`      // cas, delete, batch: the write happened
	Unknown bool   `json:"unknown,omitempty"` // the write may or may not have happened

	Call   int64 `json:"call"` // clock reading before the call
	Return int64 `json:"ret"`  // clock reading after it returned; ignored when Unknown
}

// Outcome is what a call's error says about its effect.
type Outcome int

const (
	// Known: the call returned normally; its results are the truth.
	Known Outcome = iota
	// Omit: the call failed and certainly changed nothing, so it
	// constrains nothing and is left out of the history.
	Omit
	// Uncertain: the write failed after it may have reached the store.
	Uncertain
)

// Classify returns what err, returned by a call that writes when write is
// set, says about the call's effect. See the package documentation.
func Classify(err error, write bool) Outcome {
	if err == nil {
		return Known
	}
	if !write {
		return Omit
	}
	var se *runlease.StorageError
	if errors.As(err, &se) && !se.Unknown {
		return Omit
	}
	return Uncertain
}

// writes reports whether the record's call can change the store.
func (r *Record) writes() bool { return r.Kind != Get }

// String describes the call and its outcome, for failure messages and
// porcupine's visualization.
func (r *Record) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "p%d/c%d ", r.Proc, r.Client)
	switch r.Kind {
	case Get:
		fmt.Fprintf(&b, "get(%s)", r.Key)
	case CAS:
		fmt.Fprintf(&b, "cas(%s, %s → %q)", r.Key, describe(r.Expected), r.Value)
	case Delete:
		fmt.Fprintf(&b, "delete(%s, %s)", r.Key, describe(r.Expected))
	case Batch:
		parts := make([]string, 0, len(r.Conds)+len(r.Ops))
		for _, c := range r.Conds {
			parts = append(parts, fmt.Sprintf("if %s=%s", c.Key, describe(c.Value)))
		}
		for _, op := range r.Ops {
			if op.Delete {
				parts = append(parts, "del "+op.Key)
			} else {
				parts = append(parts, fmt.Sprintf("put %s=%q", op.Key, op.Value))
			}
		}
		fmt.Fprintf(&b, "batch(%s)", strings.Join(parts, "; "))
	default:
		fmt.Fprintf(&b, "%s?", r.Kind)
	}
	switch {
	case r.Unknown:
		b.WriteString(" → unknown")
	case r.Kind == Get:
		b.WriteString(" → " + describe(ptrIf(r.Got, r.Found)))
	default:
		fmt.Fprintf(&b, " → %v", r.OK)
	}
	return b.String()
}

func describe(v *string) string {
	if v == nil {
		return "absent"
	}
	return fmt.Sprintf("%q", *v)
}

func ptrIf(v string, ok bool) *string {
	if !ok {
		return nil
	}
	return &v
}
