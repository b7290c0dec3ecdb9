package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// leaveTimeout is the bound the library states on what a ClaimSlotsWait
// spends after its context ends, taking its entries out (CONCURRENCY.md:
// it returns no later than its context's end plus the store's time to
// honour it, which the fault store's is none, plus this bound).
const leaveTimeout = 2 * time.Second

// waitRec is one ClaimSlotsWait of the workload.
type waitRec struct {
	o      *op
	a      *actor
	run    string
	specs  []ScopeSpec
	fenced bool // through the driver's lease
	ctx    context.Context
	cancel context.CancelFunc

	ended     bool      // the call returned, or its process died
	dead      bool      // its process died: its calls reach the store no more
	cancelled bool      // the workload cancelled its context
	admitted  bool      // it returned the slots it asked for
	endHi     time.Time // World.hi when it ended
	swept     bool      // the leftovers check ran
	headAt    time.Time // since when it has been at the head of all its queues (zero: it is not)
}

// claimRank is the priority and principal a claim or a wait ranks with.
type claimRank struct {
	principal string
	priority  int
	fence     uint64 // a wait's fence: its lease's, or 0 when unfenced
}

// drawScopes draws a non-empty set of the mode's scopes, a third of them
// taken for a random number of units up to the limit.
func (w *World) drawScopes() []ScopeSpec {
	var specs []ScopeSpec
	for len(specs) == 0 {
		for _, sc := range w.mode.Scopes {
			if w.rng.IntN(2) == 0 {
				if w.rng.IntN(3) == 0 {
					sc.Units = 1 + w.rng.IntN(sc.Limit)
				}
				specs = append(specs, sc)
			}
		}
	}
	return specs
}

// specsText describes the scopes of a claim.
func specsText(specs []ScopeSpec) string {
	parts := make([]string, len(specs))
	for i, sc := range specs {
		parts[i] = fmt.Sprintf("%s(%d)×%d", sc.Name, sc.Limit, sc.units())
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// beginWait starts a ClaimSlotsWait of a: unfenced for a run id of its
// own, or through a's lease for the lease's run. In a mode with a hold
// time, an admitted wait holds its slots for a while, then releases them.
func (w *World) beginWait(a *actor, kind string, l Lease, run string, fence uint64, epoch int) {
	w.beginWaitAs(a, kind, l, run, fence, epoch, nil)
}

// waitRank is the principal and priority of a wait the schedule chose.
type waitRank struct {
	p    Principal
	prio int
	run  string // an unfenced wait's run id, when the schedule chose it
}

// beginWaitAs is beginWait with the principal and priority of as, when
// not nil, rather than drawn.
func (w *World) beginWaitAs(a *actor, kind string, l Lease, run string, fence uint64, epoch int, as *waitRank) {
	q := w.mode.Queue
	fenced := kind == "wait-lease"
	if fenced {
		// As for a claim: a driver waits only right after it saw its
		// lease hold.
		if r, own := w.ownRow(run, a.holder, fence, epoch); !own || !r.live(w.storeNow()) {
			return
		}
	} else {
		w.mu.Lock()
		run = fmt.Sprintf("q%d.%d", a.id, len(w.waits))
		w.mu.Unlock()
		if as != nil && as.run != "" {
			run = as.run
		}
		l, fence = nil, 0
	}
	specs := w.drawScopes()
	if as == nil {
		// Drawn in this order, so that the schedules of a seed stay as
		// they were.
		p := q.Principals[w.rng.IntN(len(q.Principals))]
		as = &waitRank{p: p, prio: q.Priorities[w.rng.IntN(len(q.Priorities))]}
	}
	p := as.p
	spec := WaitSpec{TTL: w.mode.TTL, Priority: as.prio, Principal: p.Name, Weight: p.Weight, Poll: q.Poll}
	d := q.Deadlines[w.rng.IntN(len(q.Deadlines))]
	var hold time.Duration
	if q.Hold > 0 {
		hold = time.Duration(w.rng.Int64N(int64(q.Hold)))
	}
	rec := &waitRec{a: a, run: run, specs: specs, fenced: fenced}
	desc := fmt.Sprintf("ClaimSlotsWait %s %s prio %d principal %q/%d within %v", run, specsText(specs), spec.Priority, p.Name, p.Weight, d)
	if fenced {
		desc = "Lease." + desc
	}
	w.mu.Lock()
	a.wait = rec
	w.waits = append(w.waits, rec)
	w.mu.Unlock()
	w.launch(a, desc, d+leaveTimeout+promptly+hold, func(ctx context.Context, o *op) error {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		w.mu.Lock()
		rec.o, rec.ctx, rec.cancel = o, ctx, cancel
		w.ranks[o.id] = claimRank{principal: p.Name, priority: spec.Priority, fence: fence}
		w.mu.Unlock()
		s, err := w.api.ClaimSlotsWait(ctx, w.lib(), l, run, specs, spec)
		w.waitReturned(rec, s, err)
		if err != nil || hold == 0 {
			return err
		}
		time.Sleep(hold)
		rctx, rcancel := context.WithTimeout(withOp(context.Background(), o.id), callTimeout)
		defer rcancel()
		if err := s.Release(rctx); err != nil {
			return fmt.Errorf("release after holding %v: %w", hold, err)
		}
		w.mu.Lock()
		if a.slots == s {
			a.slots = nil
		}
		w.mu.Unlock()
		return nil
	})
}

// waitReturned judges a ClaimSlotsWait that returned, and records the
// slots it was admitted to.
func (w *World) waitReturned(rec *waitRec, s Slots, err error) {
	snow := w.storeNow()
	w.mu.Lock()
	dead, cancelled := rec.dead, rec.cancelled
	if !dead {
		rec.ended = true
		rec.endHi = later(w.hi, snow)
		if rec.a.wait == rec {
			rec.a.wait = nil
		}
	}
	w.mu.Unlock()
	if dead {
		return // the process died: nobody sees what the call returns
	}
	subject := fmt.Sprintf("op%d", rec.o.id)
	if err != nil {
		// ctx.Err() itself, by identity, whenever the context ended:
		// docs/admission.md "Waiting for slots", and the rule that a context error is
		// never replaced by a library one.
		if cerr := rec.ctx.Err(); cerr != nil && err != cerr {
			w.violate("wait-ctx-err", subject, "ClaimSlotsWait #%d: its context ended (%v, cancelled by the workload: %v) and it returned %v, not ctx.Err() itself (errors.Is: %v)",
				rec.o.id, cerr, cancelled, errText(err), errors.Is(err, cerr))
		}
		w.checkPlaceLeft(rec, snow, err)
		return
	}
	held := s.Held()
	stale := false
	if trusted := s.TrustedUntil(); len(held) < len(rec.specs) && !trusted.After(time.Now()) {
		// Confirmed only after its trust window ran out (a stall longer
		// than the TTL less the margin between the plan and the reply).
		stale = true
		ended := "with no trust window (it holds nothing)"
		if !trusted.IsZero() {
			ended = fmtDur(time.Since(trusted)) + " after its trust window ended"
		}
		w.violate("stale-admission", subject, "ClaimSlotsWait #%d for %s returned admitted %s: it holds %v of %s",
			rec.o.id, rec.run, ended, held, specsText(rec.specs))
	}
	if stale {
		held = nil // judged as a stale admission
	}
	got := map[string]map[string]bool{}
	for _, h := range held {
		if got[h.Scope] == nil {
			got[h.Scope] = map[string]bool{}
		}
		got[h.Scope][h.Key] = true
		raw, ok := w.store.Peek(h.Key)
		if r, _ := decode(raw); !ok || r.Holder != rec.run || !r.live(snow) {
			w.violate("wait-partial", subject, "ClaimSlotsWait #%d for %s returned slot %s, but its row is %q (live %v)",
				rec.o.id, rec.run, h.Key, raw, r.live(snow))
		}
	}
	for _, sc := range rec.specs {
		if n := len(got[sc.Name]); n != sc.units() && !stale {
			w.violate("wait-partial", subject, "ClaimSlotsWait #%d for %s asked %d unit(s) of %s and holds %d: %v",
				rec.o.id, rec.run, sc.units(), sc.Name, n, held)
		}
	}
	w.mu.Lock()
	rec.admitted = true
	a := rec.a
	a.slots, a.slotRun, a.unfenced = s, rec.run, !rec.fenced
	for _, h := range held {
		delete(w.slotLosses, rec.run+"|"+h.Key)
	}
	w.mu.Unlock()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitInFlight returns a's wait that a cancel or a death may still end.
// w.mu is held.
func waitInFlight(a *actor) *waitRec {
	if r := a.wait; r != nil && r.o != nil && !r.ended && !r.dead {
		return r
	}
	return nil
}

// beginCancelWait cancels the context of a's wait: it must return
// ctx.Err() within the stated bound, having taken its entries out.
func (w *World) beginCancelWait(a *actor) {
	w.mu.Lock()
	rec := waitInFlight(a)
	w.mu.Unlock()
	w.launch(a, fmt.Sprintf("cancel the wait #%d", rec.o.id), promptly, func(ctx context.Context, o *op) error {
		w.mu.Lock()
		if !rec.ended {
			rec.cancelled = true
			if b := time.Now().Add(leaveTimeout + promptly); b.Before(rec.o.bound) {
				rec.o.bound = b
			}
		}
		w.mu.Unlock()
		rec.cancel()
		return nil
	})
}

// beginAbandonWait kills the process of a's wait: from now on none of its
// calls reaches the store, and its driver starts over with nothing (its
// lease and slots are left to expire). Its entries must vanish a TTL later.
func (w *World) beginAbandonWait(a *actor) {
	w.mu.Lock()
	rec := waitInFlight(a)
	w.mu.Unlock()
	w.launch(a, fmt.Sprintf("the process of wait #%d dies", rec.o.id), promptly, func(ctx context.Context, o *op) error {
		w.store.cutOff(rec.o.id)
		snow := w.storeNow()
		w.mu.Lock()
		if !rec.ended {
			rec.dead, rec.ended, rec.endHi = true, true, later(w.hi, snow)
			// What is left of the call is no one's: it must still return,
			// but nothing waits for it.
			if b := time.Now().Add(leaveTimeout + promptly); b.Before(rec.o.bound) {
				rec.o.bound = b
			}
		}
		if a.wait == rec {
			a.wait = nil
		}
		a.lease, a.slots, a.lost, a.stale = nil, nil, false, nil
		w.mu.Unlock()
		w.stopAll(a)
		rec.cancel()
		return nil
	})
}

// checkPlaceLeft: a wait that returned an error, having met no fault of
// the store on any of its calls, has taken its place out of the queues
// (docs/admission.md: ctx.Err() "with its place taken out of the queues"); under
// faults its entries may stay until they expire, which observeQueue
// checks.
func (w *World) checkPlaceLeft(rec *waitRec, snow time.Time, err error) {
	for _, c := range w.store.log(rec.o.id) {
		if c.outcome != OK && c.outcome != Slow {
			return
		}
	}
	for _, r := range w.store.Scan(runlease.QueuePrefix) {
		var e entry
		if json.Unmarshal([]byte(r.Value), &e) != nil {
			continue
		}
		w.mu.Lock()
		mine := w.waiterOp[e.Waiter] == rec.o.id
		w.mu.Unlock()
		if mine && e.live(snow) {
			w.violate("wait-kept-place", fmt.Sprintf("op%d", rec.o.id),
				"ClaimSlotsWait #%d for %s returned %v with no fault of the store, and left its live entry %s",
				rec.o.id, rec.run, errText(err), r.Key)
		}
	}
}
