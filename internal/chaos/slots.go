package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/areev/runlease/internal/history"
)

// Beliefs rebuilds, from the slot competitors' events, the interval over
// which each believed it held its slot: Key is the slot row, Holder the
// competitor's run id, Proc its child's generation.
//
// # What "believe" means
//
// A competitor holds a lease on its own run id, acquired before it claims,
// and a keeper renews both (KeepSlots). Its belief starts when ClaimSlots
// returned (after the claim took effect) and ends at the earliest of: the
// moment it saw its keeper end or began to release; the keeper's
// TrustedUntil; and Cap, the keeper's TrustedUntil as it stood before a
// renewal that failed to renew the slot. The slot row's expiry is stamped
// after the lease write whose start TrustedUntil counts from (the claim
// follows the acquisition; each slot renewal follows its lease renewal), so
// while a belief lasts the row is the competitor's and unexpired, and no
// one else can claim it: two beliefs in one slot, or more than the limit
// at once, are a broken promise. A paused competitor still "feels" it
// holds its slot when it wakes, but that feeling is past TrustedUntil and
// is not counted; it is exactly what the keeper tells it to stop doing.
// For a killed competitor, the belief ends at the earliest of the kill and
// the TrustedUntil reported at the claim.
func Beliefs(events []Event, killed map[int]int64) ([]history.Interval, []string) {
	open := map[string]*history.Interval{} // by run: the claim not yet ended
	trust := map[string]int64{}
	var out []history.Interval
	var problems []string
	for _, ev := range events {
		switch ev.Kind {
		case KindClaim:
			if prev := open[ev.Run]; prev != nil {
				problems = append(problems, fmt.Sprintf("run %s claimed again before its claim at %d ended", ev.Run, prev.Start))
			}
			open[ev.Run] = &history.Interval{Key: ev.Key, Holder: ev.Run, Start: ev.T1, Proc: ev.Gen}
			trust[ev.Run] = ev.Trust
		case KindEnd:
			iv := open[ev.Run]
			if iv == nil {
				problems = append(problems, fmt.Sprintf("run %s ended a claim it never made", ev.Run))
				continue
			}
			iv.End = minNonZero(minNonZero(ev.T0, ev.Trust), ev.Cap)
			out = append(out, *iv)
			delete(open, ev.Run)
		}
	}
	for run, iv := range open {
		kill, ok := killed[iv.Proc]
		if !ok {
			problems = append(problems, fmt.Sprintf("run %s: claim at %d never ended, and its process was not killed", run, iv.Start))
			continue
		}
		iv.End = minNonZero(kill, trust[run])
		out = append(out, *iv)
	}
	slices.SortFunc(out, func(a, b history.Interval) int { return cmp.Compare(a.Start, b.Start) })
	return out, problems
}

// CheckSlots checks the beliefs against a scope limit: never more than
// limit competitors believe at once, never two in one slot, never one in
// two slots. Beliefs that never opened (End <= Start) are left out. It
// returns the peak and a description of each violation.
func CheckSlots(beliefs []history.Interval, limit int) (int, []string) {
	var ivs []history.Interval
	for _, b := range beliefs {
		if b.End > b.Start {
			ivs = append(ivs, b)
		}
	}
	peak, at := history.Peak(ivs)
	var out []string
	if peak > limit {
		out = append(out, fmt.Sprintf("%d competitors believed they held a slot at once (limit %d): %v", peak, limit, at))
	}
	for _, o := range history.Overlaps(ivs, func(iv history.Interval) string { return iv.Key }) {
		out = append(out, "two competitors in one slot: "+o)
	}
	for _, o := range history.Overlaps(ivs, func(iv history.Interval) string { return iv.Holder }) {
		out = append(out, "one competitor in two slots: "+o)
	}
	return peak, out
}

// Snapshot is the parent's view of the slot rows at one instant: which run
// holds each live slot, read by one scan that returned at At.
type Snapshot struct {
	At      int64
	Holders map[string]string // slot key → run
}

// Frees measures, for each kill and each pause of at least minPause, how
// long after the fault each slot the faulted child held (by the last
// snapshot before the fault) was first seen held by no one or by another
// run. gens maps a competitor's run id to its child's generation.
func Frees(snaps []Snapshot, faults []Fault, gens map[string]int, minPause time.Duration) []time.Duration {
	var out []time.Duration
	for _, f := range faults {
		if f.Kind == FaultPause && f.Duration() < minPause {
			continue
		}
		i, _ := slices.BinarySearchFunc(snaps, f.T0, func(s Snapshot, t int64) int { return cmp.Compare(s.At, t) })
		if i == 0 {
			continue // no snapshot before the fault
		}
		for key, run := range snaps[i-1].Holders {
			if g, ok := gens[run]; !ok || g != f.Gen {
				continue
			}
			lat := Censored
			for _, s := range snaps[i:] {
				if s.Holders[key] != run {
					lat = time.Duration(s.At - f.T0)
					break
				}
			}
			out = append(out, lat)
		}
	}
	return out
}
