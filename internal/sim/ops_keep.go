package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/areev/runlease"
)

// write is a fenced write of a value no other write uses, through the work
// context of a keeper when work is set.
func (w *World) write(ctx context.Context, o *op, a *actor, l Lease, run string, fence uint64, work context.Context) error {
	endedBefore := work != nil && work.Err() != nil
	if work != nil {
		ctx = context.WithValue(work, opKey{}, o.id)
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	value := fmt.Sprintf("v%d", o.id)
	start := time.Now()
	err := l.Write(ctx, runlease.Put("ckpt:"+run, value))
	if err == nil {
		w.confirm(l, start)
	}
	w.mu.Lock()
	landed := w.userValues[value]
	w.mu.Unlock()
	subject := fmt.Sprintf("op%d", o.id)
	switch {
	case err == nil && !landed:
		w.violate("write-not-landed", subject, "Write #%d of %s by %s (fence %d) returned nil, but %q is in no applied write",
			o.id, run, a.holder, fence, value)
	case err != nil && landed && !runlease.IsOutcomeUnknown(err):
		w.violate("write-landed-reported-not", subject, "Write #%d of %s by %s landed %q but returned an error that rules it out: %v",
			o.id, run, a.holder, value, err)
	}
	if work != nil && work.Err() != nil && errors.Is(err, context.Cause(work)) &&
		errors.Is(err, runlease.ErrTrustExpired) {
		// The keeper whose context the write used ended, its trust window
		// run out, and the write returns that cause, as Keeper.Context
		// promises. The window that ran out is the keeper's, judged when it
		// ended (its Lost hook checked it then), not the lease's now: the
		// lease may have been renewed since, and its other keepers may
		// trust it. The driver still drops the lease, as it must on an
		// error matching ErrLeaseLost.
		w.mu.Lock()
		if a.lease == l {
			a.lost = true
		}
		w.mu.Unlock()
		return err
	}
	w.checkLoss("Write", l, run, a.holder, fence, err)
	w.checkLossEndedKeepers("Write", l, run, err)
	if endedBefore && err != nil && !errors.Is(err, runlease.ErrLeaseLost) && !errors.Is(err, context.Cause(work)) {
		w.violate("ctx-cause", subject, "Write #%d through the work context of an ended keeper returned %v, "+
			"which matches neither ErrLeaseLost nor the keeper's cause (%v)", o.id, err, context.Cause(work))
	}
	w.markLost(a, l, err)
	return err
}

// beginKeep starts a keeper of a's lease, with a's slots if no keeper
// renews them yet.
func (w *World) beginKeep(a *actor, kind string, l Lease, run string, fence uint64, epoch int, slots Slots) {
	ri := 0
	if w.mode.Shared > 0 && (kind == "keep-shared" || w.rng.IntN(2) == 0) {
		ri = 1 + w.rng.IntN(w.mode.Shared)
	}
	w.mu.Lock()
	if w.slotsKept(a) {
		slots = nil
	}
	rec := &keeperRec{id: len(w.keepers) + 1, a: a, lease: l, run: run, holder: a.holder, fence: fence, epoch: epoch, slots: slots, renewer: ri,
		superseded: a.shadowed && a.lease == l}
	w.mu.Unlock()
	w.planHooks(rec)
	spec := KeepSpec{Slots: slots,
		Lost: func(err error) {
			w.tracef("keeper k%d of %s lost: %v", rec.id, run, errText(err))
			w.checkLossAt(fmt.Sprintf("keeper k%d (Lost hook)", rec.id), w.endedAt(rec), l, run, a.holder, fence, err)
			w.inHook(rec, "Lost")
		},
		SlotsLost: func(slotRun string, keys []string, err error) {
			w.onSlotsLost(rec, slotRun, keys, err)
			w.inHook(rec, "SlotsLost")
		},
	}
	if rec.hooks.hook == "Renewed" {
		spec.Renewed = func(error) { w.inHook(rec, "Renewed") }
	}
	if w.mode.KeepTTL > 0 && w.rng.IntN(2) == 0 {
		spec.TTL = w.mode.KeepTTL
	}
	if slots != nil && w.mode.Strict && w.rng.IntN(2) == 0 {
		spec.Strict, rec.strict = true, true
	}
	var r Renewer
	name := "own renewer"
	if ri > 0 {
		r, name = w.renewers[ri-1], fmt.Sprintf("R%d", ri)
	}
	desc := fmt.Sprintf("Keep k%d of %s on %s", rec.id, run, name)
	if slots != nil {
		desc += " with slots"
	}
	if spec.Strict {
		desc += " (strict)"
	}
	if spec.TTL > 0 {
		desc += fmt.Sprintf(" WithTTL(%v)", spec.TTL)
	}
	w.launch(a, desc, promptly, func(ctx context.Context, o *op) error {
		k, err := w.api.Keep(ctx, r, l, spec)
		w.markLost(a, l, err)
		if err != nil {
			return err
		}
		work := k.Context()
		w.mu.Lock()
		rec.k, rec.work = k, work
		w.mu.Unlock()
		// A keeper of a lease whose trust window ran out has ended by the
		// time Keep returns: its row may have expired, and a contender be
		// granted the run, before the Renewer's loop looks at it.
		if trusted := k.TrustedUntil(); rec.work.Err() == nil && !time.Now().Before(trusted) {
			w.violate("trust-late", fmt.Sprintf("keep|%d", rec.id),
				"Keep returned keeper k%d of %s with its work context live, %s after its trust window ended",
				rec.id, run, fmtDur(time.Since(trusted)))
		}
		w.mu.Lock()
		w.keepers = append(w.keepers, rec)
		w.mu.Unlock()
		return nil
	})
}

// stopAll stops every keeper of a not stopped yet.
func (w *World) stopAll(a *actor) {
	w.mu.Lock()
	var recs []*keeperRec
	for _, r := range w.keepers {
		if r.a == a && !r.stopped {
			recs = append(recs, r)
		}
	}
	w.mu.Unlock()
	for _, r := range recs {
		r.k.Stop()
		w.mu.Lock()
		r.stopped = true
		w.mu.Unlock()
	}
}

// beginKeeperRelease stops a's other keepers, then releases through one.
func (w *World) beginKeeperRelease(a *actor, act []*keeperRec, run string, fence uint64) {
	rec := act[w.rng.IntN(len(act))]
	const within = 500 * time.Millisecond
	w.launch(a, fmt.Sprintf("Keeper.Release k%d of %s", rec.id, run), within+promptly, func(ctx context.Context, o *op) error {
		w.mu.Lock()
		var others []*keeperRec
		for _, r := range w.keepers {
			if r.a == a && r != rec && !r.stopped {
				others = append(others, r)
			}
		}
		w.mu.Unlock()
		for _, r := range others {
			r.k.Stop()
			w.mu.Lock()
			r.stopped = true
			w.mu.Unlock()
		}
		ctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		w.mu.Lock()
		w.releasing[rec.lease] = true
		w.mu.Unlock()
		start := time.Now()
		err := rec.k.Release(ctx)
		if rec.slots == nil { // else the error may be the slots' release's
			w.checkReleaseWait(o, "Keeper.Release", rec.run, start, err)
		}
		w.mu.Lock()
		rec.stopped = true
		if rec.slots != nil && a.slots == rec.slots {
			a.slots = nil
		}
		w.mu.Unlock()
		w.checkLoss("Keeper.Release", rec.lease, run, a.holder, rec.fence, err)
		if err == nil {
			w.checkReleased("Keeper.Release", rec.lease, run, a.holder, fence)
			if rec.slots != nil {
				w.checkSlotsFreed("Keeper.Release", a, rec.slots.RunID())
			}
			w.mu.Lock()
			a.lease = nil
			w.mu.Unlock()
		} else {
			w.markLost(a, rec.lease, err)
			w.mu.Lock()
			a.lost = true // the driver gives the lease up and starts again
			w.mu.Unlock()
		}
		return err
	})
}

// beginClaim claims, for the run of a's lease, slots of a random non-empty
// set of the mode's scopes.
func (w *World) beginClaim(a *actor, run string) {
	var specs []ScopeSpec
	for len(specs) == 0 {
		for _, sc := range w.mode.Scopes {
			if w.rng.IntN(2) == 0 {
				if w.mode.Mixed && a.id%2 == 1 {
					sc.Limit++
				}
				specs = append(specs, sc)
			}
		}
	}
	limits := map[string]int{}
	for _, sc := range specs {
		limits[sc.Name] = sc.Limit
	}
	// A claim on a store without batches writes slot by slot and, cut
	// short, puts back what it wrote within the take-back bound.
	w.launch(a, fmt.Sprintf("ClaimSlots %s %v", run, specs), callTimeout+takeBack+promptly, func(ctx context.Context, o *op) error {
		w.mu.Lock()
		a.slotRun = run
		w.claims[run] = &claimRec{limits: limits, interfered: map[string]bool{}}
		if w.mode.Queue != nil {
			w.ranks[o.id] = claimRank{} // a plain claim ranks as principal "" at priority 0
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		s, err := w.api.ClaimSlots(ctx, w.lib(), run, specs, w.mode.TTL)
		var held []HeldSlot
		if err == nil {
			// Held reads the store's clock, which takes the store's
			// mutex: never call it under w.mu, which the store takes
			// while it holds its own (see applied).
			held = s.Held()
		}
		w.mu.Lock()
		delete(w.claims, run)
		if err == nil {
			a.slots, a.unfenced = s, false
			for _, h := range held {
				delete(w.slotLosses, run+"|"+h.Key)
			}
		}
		w.mu.Unlock()
		w.checkClaimFault(o, run, err)
		w.checkClaimRefusal(o, run, err)
		return err
	})
}
