package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Censored is the latency of a sample whose outcome never came (no
// takeover, no freed slot) before the test ended. It sorts above every
// real latency.
const Censored = time.Duration(math.MaxInt64)

// Takeover is one liveness sample: a run held by a driver whose process was
// paused past the TTL or killed, and how long after the fault began another
// Acquire of the run returned.
type Takeover struct {
	Fault   Fault
	Run     string
	Fence   uint64 // the faulted holder's fence
	Latency time.Duration
	// Eligible is false when no other child stayed up while the lease
	// could expire (see Takeovers): nobody could take over, so the sample
	// says nothing about the lease.
	Eligible bool
}

// Takeovers measures, for each kill and each pause of at least minPause,
// every run the faulted child held when the fault began: the time from the
// fault to the return of the next Acquire of the run (by fence). A run is
// held by the child when, among the tenures granted before the fault, the
// one with the highest fence is the child's and had not stopped by then.
// slots is the number of child slots. A sample is eligible when, at every
// instant of [fault + upFrom, fault + bound], some other child was up: with
// upFrom a TTL, from when the lease has surely expired until the bound, so
// that a waiting driver could take over. (A waiter paused across the
// expiry takes over as soon as it resumes: its timer has fired.)
func Takeovers(ts []Tenure, faults []Fault, slots int, minPause, upFrom, bound time.Duration) []Takeover {
	gi := indexGrants(ts)
	byRun := map[string][]Tenure{}
	for _, t := range ts {
		byRun[t.Run] = append(byRun[t.Run], t)
	}
	var out []Takeover
	for _, f := range faults {
		if f.Kind == FaultPause && f.Duration() < minPause {
			continue
		}
		eligible := othersUp(faults, f, slots, upFrom, bound)
		for run, list := range byRun {
			var last *Tenure
			for i, t := range list {
				if t.Grant < f.T0 && (last == nil || t.Fence > last.Fence) {
					last = &list[i]
				}
			}
			if last == nil || last.Gen != f.Gen || (last.Stop != 0 && last.Stop <= f.T0) {
				continue
			}
			lat := Censored
			if next := gi.after(run, last.Fence); next != math.MaxInt64 {
				lat = time.Duration(next - f.T0)
			}
			out = append(out, Takeover{Fault: f, Run: run, Fence: last.Fence, Latency: lat, Eligible: eligible})
		}
	}
	slices.SortFunc(out, func(a, b Takeover) int { return cmp.Or(cmp.Compare(a.Fault.T0, b.Fault.T0), cmp.Compare(a.Run, b.Run)) })
	return out
}

// othersUp reports whether, at every instant of [f.T0+from, f.T0+to], some
// child slot other than f's was up: neither paused nor between a kill and
// its replacement's start. Whichever is up when the lease expires can take
// over then.
func othersUp(faults []Fault, f Fault, slots int, from, to time.Duration) bool {
	lo, hi := f.T0+int64(from), f.T0+int64(to)
	downAt := func(slot int, p int64) bool {
		for _, g := range faults {
			end := g.T1
			if end == 0 {
				end = math.MaxInt64 // never came back up
			}
			if g.Slot == slot && g.T0 <= p && p < end {
				return true
			}
		}
		return false
	}
	allDownAt := func(p int64) bool {
		for s := range slots {
			if s != f.Slot && !downAt(s, p) {
				return false
			}
		}
		return true
	}
	// Where every other slot is down is an intersection of unions of
	// intervals [T0, T1): its first point in [lo, hi], if any, is lo or
	// the start of a fault.
	if allDownAt(lo) {
		return false
	}
	for _, g := range faults {
		if g.Slot != f.Slot && lo <= g.T0 && g.T0 <= hi && allDownAt(g.T0) {
			return false
		}
	}
	return true
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// ds, or 0 for none.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// Summary formats the count, p50, p99 and maximum of ds.
func Summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no samples"
	}
	f := func(d time.Duration) string {
		if d == Censored {
			return "never"
		}
		return d.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(ds), f(Percentile(ds, 50)), f(Percentile(ds, 99)), f(Percentile(ds, 100)))
}

// FormatTakeovers formats the samples on one line: for each, the fault and
// how long it kept its process down, the run, the latency, and whether
// another process was up to take over.
func FormatTakeovers(ts []Takeover) string {
	var b strings.Builder
	for _, to := range ts {
		lat := "never"
		if to.Latency != Censored {
			lat = to.Latency.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "[%s %v %s %s %v] ", to.Fault.Kind, to.Fault.Duration().Round(100*time.Millisecond), to.Run, lat, to.Eligible)
	}
	return strings.TrimSpace(b.String())
}

// FormatFaults formats faults on one line, in the order they began: for
// each, its kind, its child slot, when it began (from the first fault)
// and how long it kept the slot down (0 for a kill never replaced), so
// that a slow takeover can be read against what else was down meanwhile.
func FormatFaults(fs []Fault) string {
	sorted := slices.SortedFunc(slices.Values(fs), func(a, b Fault) int { return cmp.Compare(a.T0, b.T0) })
	var b strings.Builder
	for _, f := range sorted {
		fmt.Fprintf(&b, "[%s slot %d +%v for %v] ", f.Kind, f.Slot,
			time.Duration(f.T0-sorted[0].T0).Round(10*time.Millisecond), f.Duration().Round(10*time.Millisecond))
	}
	return strings.TrimSpace(b.String())
}
