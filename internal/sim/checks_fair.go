package sim

import (
	"fmt"
	"sort"
	"time"
)

// fairAdm is one admission to the scope of a mode that checks the fair
// share: whose run it was, which principals had runs waiting, and each
// principal's backlog epoch then.
type fairAdm struct {
	run       string
	principal string
	backlog   map[string]bool
	epoch     map[string]int
}

// fairLog is the record of admissions the fair-share check judges.
type fairLog struct {
	adms []fairAdm
	// epoch counts, per principal, the admissions after which it had
	// nothing left waiting: a stretch is backlogged for a principal only
	// while its epoch stays the same (a principal left idle loses its
	// credit, by design), as in TestFairShareProperties.
	epoch map[string]int
}

// fairAdmission records an admission of run, ranked as rk, to scope, whose
// line holds the live entries queue as the admission's batch applies, and
// checks the fair-share bound (docs/admission.md "Waiting for slots"; start-time fair
// queueing's): over every stretch of admissions at each of which two
// principals i and j both had runs waiting, their admissions divided by
// their weights differ by at most 1/w_i + 1/w_j. A principal has runs
// waiting while it has a live entry, or it is the admitted run's. The
// store's mutex is held.
func (w *World) fairAdmission(scope, run string, rk claimRank, queue []entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	weights := map[string]int{}
	for _, p := range w.mode.Queue.Principals {
		weights[p.Name] = max(p.Weight, 1)
	}
	if w.fair.epoch == nil {
		w.fair.epoch = map[string]int{}
	}
	adm := fairAdm{run: run, principal: rk.principal, backlog: map[string]bool{rk.principal: true}, epoch: map[string]int{}}
	left := false
	for _, e := range queue {
		adm.backlog[e.Principal] = true
		left = left || (e.Principal == rk.principal && e.Run != run)
	}
	for p, n := range w.fair.epoch {
		adm.epoch[p] = n
	}
	w.fair.adms = append(w.fair.adms, adm)
	if !left {
		w.fair.epoch[rk.principal]++
	}
	var names []string
	for p := range weights {
		names = append(names, p)
	}
	sort.Strings(names)
	adms := w.fair.adms
	last := adms[len(adms)-1]
	for _, i := range names {
		for _, j := range names {
			if i >= j {
				continue
			}
			wi, wj := float64(weights[i]), float64(weights[j])
			ni, nj := 0.0, 0.0
			for from := len(adms) - 1; from >= 0; from-- {
				a := adms[from]
				if !a.backlog[i] || !a.backlog[j] || a.epoch[i] != last.epoch[i] || a.epoch[j] != last.epoch[j] {
					break
				}
				switch a.principal {
				case i:
					ni++
				case j:
					nj++
				}
				if d := ni/wi - nj/wj; max(d, -d) > 1/wi+1/wj+1e-9 {
					id := fmt.Sprintf("fair-share|%s|%s|%d", i, j, from)
					if w.seen[id] {
						continue
					}
					w.seen[id] = true
					var seq []string
					for _, b := range adms[from:] {
						seq = append(seq, fmt.Sprintf("%s:%q", b.run, b.principal))
					}
					v := Violation{Check: "fair-share", At: time.Since(w.start), Detail: fmt.Sprintf(
						"in %s, principals %q (weight %v) and %q (weight %v) both had runs waiting at each of the last %d admissions, and got %v and %v of them: %v / %v - %v / %v is past 1/%v + 1/%v (admissions %v)",
						scope, i, wi, j, wj, len(adms)-from, ni, nj, ni, wi, nj, wj, wi, wj, seq)}
					w.violations = append(w.violations, v)
					w.mon.tracef("!! %s", v)
				}
			}
		}
	}
}
