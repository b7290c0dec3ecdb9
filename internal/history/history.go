// Package history checks intervals recorded by concurrent holders, possibly
// in several processes, against the rules of leases and slots: no two
// holders of one thing at once, fences in the order of acquisition, and no
// more than a cap of holders at any instant.
//
// # What an interval means
//
// An [Interval] is what one holder believed: that it held Key from Start to
// End. For the checks to be sound (a reported violation is a real one) the
// recorder must take Start after the claim call returned success and End
// before the release call was made, on a clock shared by every recorder
// ([Mono] on one machine).
//
// Why that is sound: the store is linearizable, so the write that took the
// thing took effect at one instant A inside the claim call, and the write
// that gave it back at one instant R inside the release call. The store
// itself held the thing for this holder over [A, R]. Start is read after the
// claim returned, so Start >= A; End is read before the release was called,
// so End <= R. Hence [Start, End] lies inside [A, R], and two recorded
// intervals that overlap prove that two store-side tenures overlapped, which
// the store's compare-and-swap must never allow. The converse does not hold:
// a check on these intervals can miss a violation that happened inside the
// call windows, which is why the tests run many rounds.
//
// Equal instants do not count as an overlap: in truth End of one tenure is
// strictly before the next Start (a round trip separates them), so equality
// can only come from clock resolution.
package history

import (
	"cmp"
	"fmt"
	"slices"
)

// Interval is one holder's tenure of one thing, in [Mono] nanoseconds.
type Interval struct {
	Key    string `json:"key"`             // what was held: a run id, a slot row
	Holder string `json:"holder"`          // who held it
	Fence  uint64 `json:"fence,omitempty"` // the lease fence, 0 for slots
	Start  int64  `json:"start"`           // read after the claim returned
	End    int64  `json:"end"`             // read before the release was called
	Proc   int    `json:"proc"`            // which process recorded it
}

func (iv Interval) String() string {
	return fmt.Sprintf("%s held by %s (proc %d, fence %d) over [%d, %d]",
		iv.Key, iv.Holder, iv.Proc, iv.Fence, iv.Start, iv.End)
}

// Overlaps groups the intervals by group (such as the key held, or the
// holder) and returns a description of each interval that overlaps an
// earlier one of its group, or nil when none does. Every overlapping group
// yields at least one description.
func Overlaps(ivs []Interval, group func(Interval) string) []string {
	var out []string
	for g, list := range groups(ivs, group) {
		slices.SortStableFunc(list, func(a, b Interval) int { return cmp.Compare(a.Start, b.Start) })
		// last is the interval that ends latest among those started so
		// far: if the next one starts before it ends, they overlap.
		last := list[0]
		for _, iv := range list[1:] {
			if iv.Start < last.End {
				out = append(out, fmt.Sprintf("%q: %v overlaps %v by %dns",
					g, iv, last, last.End-iv.Start))
			}
			if iv.End > last.End {
				last = iv
			}
		}
	}
	slices.Sort(out)
	return out
}

// Fences checks the fences of each key's intervals: in the order the
// tenures began, fences must strictly increase; and when contiguous is set,
// they must be exactly 1, 2, … n, so that no acquisition went unrecorded and
// none was counted twice. It returns a description of each violation.
func Fences(ivs []Interval, contiguous bool) []string {
	var out []string
	for key, list := range groups(ivs, func(iv Interval) string { return iv.Key }) {
		slices.SortStableFunc(list, func(a, b Interval) int { return cmp.Compare(a.Start, b.Start) })
		for i := 1; i < len(list); i++ {
			if list[i].Fence <= list[i-1].Fence {
				out = append(out, fmt.Sprintf("key %q: fence %d began after fence %d: %v after %v",
					key, list[i].Fence, list[i-1].Fence, list[i], list[i-1]))
			}
		}
		if !contiguous {
			continue
		}
		byFence := slices.SortedStableFunc(slices.Values(list), func(a, b Interval) int { return cmp.Compare(a.Fence, b.Fence) })
		for i, iv := range byFence {
			if iv.Fence != uint64(i+1) {
				out = append(out, fmt.Sprintf("key %q: fences are not 1..%d: position %d has fence %d (%v)",
					key, len(list), i+1, iv.Fence, iv))
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// Peak returns the largest number of intervals that contain one instant,
// whatever their keys, and the intervals that do at the first such instant.
func Peak(ivs []Interval) (int, []Interval) {
	type event struct {
		at    int64
		delta int // +1 start, -1 end
		i     int
	}
	events := make([]event, 0, 2*len(ivs))
	for i, iv := range ivs {
		events = append(events, event{iv.Start, +1, i}, event{iv.End, -1, i})
	}
	// At equal instants ends go first: touching intervals do not overlap.
	slices.SortFunc(events, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta))
	})
	open := map[int]bool{}
	peak := 0
	var at []Interval
	for _, e := range events {
		if e.delta < 0 {
			delete(open, e.i)
			continue
		}
		open[e.i] = true
		if len(open) > peak {
			peak = len(open)
			at = at[:0]
			for i := range open {
				at = append(at, ivs[i])
			}
		}
	}
	slices.SortFunc(at, func(a, b Interval) int { return cmp.Compare(a.Start, b.Start) })
	return peak, at
}

// groups splits ivs by group, copying them so callers' slices keep their
// order.
func groups(ivs []Interval, group func(Interval) string) map[string][]Interval {
	m := map[string][]Interval{}
	for _, iv := range ivs {
		g := group(iv)
		m[g] = append(m[g], iv)
	}
	return m
}
