package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/areev/runlease/internal/history"
)

// Tenure is one acquisition of a run, rebuilt from a driver's events.
//
// # When a holder may trust its lease
//
// Grant is read after Acquire returned. The store made this driver the
// holder at one instant inside the call, so Grant is no earlier than that.
//
// End is the end of the trusted window: the earliest of the moment the
// driver stopped (it saw the keeper end, or was about to call Release) and
// the keeper's TrustedUntil, on the Mono clock. The keeper promises that
// TrustedUntil, counted from the start of its last successful renewal, is a
// margin before the lease can expire, so before any successor's takeover
// can take effect; Release takes effect inside the call, after End. A
// paused driver cannot move End later: TrustedUntil does not grow while the
// process is stopped, and a driver that resumes and acts before it notices
// the loss acts after End (a "zombie" act, which only fences can stop).
// For a killed driver, End is the earliest of the kill and the largest
// TrustedUntil it reported. So a successor's Grant at or before End is a
// broken promise of the library, whatever the timing.
type Tenure struct {
	Run, Holder string
	Fence       uint64
	Slot, Gen   int
	Call        int64 // Acquire called
	Grant       int64 // Acquire returned
	End         int64 // the trusted window's end; at or before Grant when it never opened
	Stop        int64 // when the driver stopped; 0 when it was killed before it did
}

// Tenures rebuilds the tenures from every child's events. killed gives the
// kill time of each killed child by generation. A tenure of a child that
// exited by itself without an end event is a problem (returned).
func Tenures(events []Event, killed map[int]int64) ([]Tenure, []string) {
	type id struct {
		holder, run string
		fence       uint64
	}
	type acc struct {
		t        Tenure
		trust    int64 // largest TrustedUntil reported
		stopSeen bool
	}
	byID := map[id]*acc{}
	var order []id
	for _, ev := range events {
		k := id{ev.Holder, ev.Run, ev.Fence}
		switch ev.Kind {
		case KindGrant:
			byID[k] = &acc{t: Tenure{Run: ev.Run, Holder: ev.Holder, Fence: ev.Fence, Slot: ev.Slot, Gen: ev.Gen,
				Call: ev.T0, Grant: ev.T1}, trust: ev.Trust}
			order = append(order, k)
		case KindCkpt, KindDown, KindEnd:
			a := byID[k]
			if a == nil {
				continue // checked by the caller's counts: an event before its grant
			}
			a.trust = max(a.trust, ev.Trust)
			if ev.Kind == KindEnd {
				a.t.Stop, a.stopSeen = ev.T0, true
				a.t.End = minNonZero(ev.T0, ev.Trust)
			}
		}
	}
	var out []Tenure
	var problems []string
	for _, k := range order {
		a := byID[k]
		if !a.stopSeen {
			kill, ok := killed[a.t.Gen]
			if !ok {
				problems = append(problems, fmt.Sprintf("run %s fence %d (%s): granted but never ended, and its process was not killed",
					a.t.Run, a.t.Fence, a.t.Holder))
				continue
			}
			a.t.End = minNonZero(kill, a.trust)
		}
		out = append(out, a.t)
	}
	return out, problems
}

func minNonZero(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// grantIndex answers, for a run and a fence f, when the first Acquire that
// got a fence above f returned.
type grantIndex map[string]struct {
	fences []uint64 // ascending
	sufMin []int64  // sufMin[i] = the earliest Grant among fences[i:]
}

func indexGrants(ts []Tenure) grantIndex {
	by := map[string][]Tenure{}
	for _, t := range ts {
		by[t.Run] = append(by[t.Run], t)
	}
	gi := grantIndex{}
	for run, list := range by {
		slices.SortFunc(list, func(a, b Tenure) int { return cmp.Compare(a.Fence, b.Fence) })
		e := gi[run]
		e.fences = make([]uint64, len(list))
		e.sufMin = make([]int64, len(list)+1)
		e.sufMin[len(list)] = math.MaxInt64
		for i := len(list) - 1; i >= 0; i-- {
			e.fences[i] = list[i].Fence
			e.sufMin[i] = min(e.sufMin[i+1], list[i].Grant)
		}
		gi[run] = e
	}
	return gi
}

// after returns the earliest Grant of a fence above f on run, or MaxInt64.
func (gi grantIndex) after(run string, f uint64) int64 {
	e, ok := gi[run]
	if !ok {
		return math.MaxInt64
	}
	i := sort.Search(len(e.fences), func(i int) bool { return e.fences[i] > f })
	return e.sufMin[i]
}

// CheckFences checks that each run's fences are unique and grow in the
// real-time order of acquisitions. The sound form of "in real-time order":
// an Acquire that returned fence g must not have returned before an Acquire
// that got a lower fence f was even called, since the store wrote f before
// g. (Comparing Grant times alone would not be sound: a driver paused
// between the store's write and its Mono reading records a late Grant.)
func CheckFences(ts []Tenure) []string {
	var out []string
	seen := map[string]Tenure{}
	gi := indexGrants(ts)
	for _, t := range ts {
		k := fmt.Sprintf("%s/%d", t.Run, t.Fence)
		if prev, dup := seen[k]; dup {
			out = append(out, fmt.Sprintf("run %s: fence %d granted twice, to %s and %s", t.Run, t.Fence, prev.Holder, t.Holder))
		}
		seen[k] = t
		if later := gi.after(t.Run, t.Fence); later < t.Call {
			out = append(out, fmt.Sprintf("run %s: a fence above %d was granted %v before %s called Acquire and got %d",
				t.Run, t.Fence, ns(t.Call-later), t.Holder, t.Fence))
		}
	}
	slices.Sort(out)
	return out
}

// CheckTrust checks that no two trusted windows [Grant, End] of one run
// overlap: a successor's Grant never falls inside a predecessor's window.
// See [Tenure] for why the windows make this sound.
func CheckTrust(ts []Tenure) []string {
	return history.Overlaps(TrustIntervals(ts), func(iv history.Interval) string { return iv.Key })
}

// TrustIntervals returns the trusted windows that opened, as intervals.
func TrustIntervals(ts []Tenure) []history.Interval {
	var ivs []history.Interval
	for _, t := range ts {
		if t.End > t.Grant {
			ivs = append(ivs, history.Interval{Key: t.Run, Holder: t.Holder, Fence: t.Fence,
				Start: t.Grant, End: t.End, Proc: t.Gen})
		}
	}
	return ivs
}

func ns(d int64) string { return fmt.Sprintf("%.3fs", float64(d)/1e9) }

// Acts counts, by result, the writes begun after their holder's trusted
// window ended (zombie acts: a driver resumed from a pause and acted before
// it noticed the loss) and those begun after a higher fence had been
// granted (stale acts, which a fence must refuse). Writes of tenures not
// in ts are not counted.
func Acts(ts []Tenure, ws []Write) (zombie, stale map[string]int) {
	gi := indexGrants(ts)
	ends := map[string]int64{}
	for _, t := range ts {
		ends[fmt.Sprintf("%s/%d", t.Run, t.Fence)] = t.End
	}
	zombie, stale = map[string]int{}, map[string]int{}
	for _, w := range ws {
		end, ok := ends[fmt.Sprintf("%s/%d", w.Run, w.Fence)]
		if !ok {
			continue
		}
		if w.T0 > end {
			zombie[w.Res]++
		}
		if w.T0 >= gi.after(w.Run, w.Fence) {
			stale[w.Res]++
		}
	}
	return zombie, stale
}
