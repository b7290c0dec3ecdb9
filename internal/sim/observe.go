package sim

import (
	"fmt"
	"time"
)

// observe runs the checkers that judge an instant: after synctest.Wait,
// every goroutine of the bubble is blocked, so what they believe and what
// the store holds are seen at one fake instant. fresh is false while a
// store call hangs: the library may then hold a lock across it, so only
// checks that take no library lock run.
func (w *World) observe(fresh bool) {
	now := time.Now()
	w.mu.Lock()
	var keepers []*keeperRec
	for _, r := range w.keepers {
		if r.work.Err() == nil {
			keepers = append(keepers, r)
		}
	}
	var late []*op
	for _, o := range w.ops {
		if !o.done && !o.overdue && now.After(o.bound) && !w.mode.Deaf {
			o.overdue = true
			late = append(late, o)
		}
	}
	w.mu.Unlock()
	for _, o := range late {
		w.violate("op-bound", fmt.Sprintf("op%d", o.id), "#%d d%d %s has not returned %s after it began (bound %s)",
			o.id, o.a.id, o.desc, fmtDur(now.Sub(o.start)), fmtDur(o.bound.Sub(o.start)))
	}
	trusting := map[string]map[string]int{} // run → holder/fence → a keeper trusting it
	for _, r := range keepers {
		w.observeKeeper(r, now, fresh)
		cur, _ := w.leaseRow(r.run)
		w.mu.Lock()
		superseded := r.supersededBy(cur, w.epoch[r.run])
		w.mu.Unlock()
		if r.work.Err() == nil && !superseded {
			id := fmt.Sprintf("%s fence %d lineage %d", r.holder, r.fence, r.epoch)
			if trusting[r.run] == nil {
				trusting[r.run] = map[string]int{}
			}
			trusting[r.run][id] = r.id
		}
	}
	for run, ids := range trusting {
		if len(ids) > 1 {
			w.violate("exclusive-trust", "two|"+run, "keepers of %d different leases trust run %s at once: %v", len(ids), run, ids)
		}
	}
	if fresh {
		w.mu.Lock()
		all := append([]*keeperRec(nil), w.keepers...)
		w.mu.Unlock()
		for _, r := range all {
			w.observeTrust(r, now)
		}
		w.observeSlots()
	}
	w.observeQueue()
}

// observeKeeper judges one keeper whose work context is live.
func (w *World) observeKeeper(r *keeperRec, now time.Time, fresh bool) {
	snow := w.storeNow()
	cur, own := w.ownRow(r.run, r.holder, r.fence, r.epoch)
	w.mu.Lock()
	superseded := r.supersededBy(cur, w.epoch[r.run])
	w.mu.Unlock()
	if !own && !superseded {
		w.violate("exclusive-trust", fmt.Sprintf("row|%d", r.id),
			"keeper k%d of %s (fence %d) still trusts run %s while the row is %q fence %d (live %v)",
			r.id, r.holder, r.fence, r.run, cur.Holder, cur.Fence, cur.live(snow))
	}
	if !fresh {
		return
	}
	trusted := r.k.TrustedUntil()
	if !now.Before(trusted) {
		w.violate("trust-late", fmt.Sprintf("%d", r.id), "keeper k%d's work context is live %s after its trust window ended",
			r.id, fmtDur(now.Sub(trusted)))
	}
	if own {
		rowLeft, trustLeft := cur.remaining(snow), trusted.Sub(now)
		if rowLeft < trustLeft+w.mode.Margin() {
			w.violate("trust-margin", fmt.Sprintf("%d", r.id),
				"keeper k%d of %s trusts for %v more but its row expires in %v: less than the %v margin before it",
				r.id, r.run, trustLeft, rowLeft, w.mode.Margin())
		}
	}
	w.mu.Lock()
	lostAt, lost := w.lostAt[r.lease]
	slotLostAt, slotLost := w.strictLost[r]
	w.mu.Unlock()
	if slotLost {
		w.violate("strict-slot-kept", fmt.Sprintf("%d", r.id),
			"keeper k%d of %s keeps its slots with KeepSlotsStrict, a slot was reported lost %s ago, yet its work context is live",
			r.id, r.run, fmtDur(now.Sub(slotLostAt)))
	}
	if lost || w.rng.IntN(3) == 0 {
		if err := r.k.Err(); err == nil && lost {
			w.violate("trust-after-loss", fmt.Sprintf("%d", r.id),
				"keeper k%d of %s: a call on its lease reported the lease lost %s ago, yet Err() is nil",
				r.id, r.run, fmtDur(now.Sub(lostAt)))
		}
	}
}

// observeSlots counts, per scope, the runs that believe they hold one of
// its slots: a kept Slots while its keeper trusts, one renewed by hand
// while the row it last wrote has not expired and its driver's lease on
// the run is still its own (a driver whose lease is gone is a stalled one,
// to which nothing is promised). Slots whose loss a hook
// reported are excused.
func (w *World) observeSlots() {
	snow := w.storeNow()
	type belief struct {
		a     *actor
		s     Slots
		fence uint64
		epoch int
		kept  bool
		mine  bool // the driver's lease on the slots' run is still its own
		// free is set for slots of an unfenced ClaimSlotsWait: no lease
		// vouches for them, so they count while their rows have not expired.
		free bool
	}
	w.mu.Lock()
	var beliefs []belief
	for _, a := range w.actors {
		if a.slots != nil {
			beliefs = append(beliefs, belief{a: a, s: a.slots, fence: a.fence, epoch: a.epoch, kept: w.slotsKept(a), free: a.unfenced})
		}
	}
	w.mu.Unlock()
	for i := range beliefs {
		b := &beliefs[i]
		_, b.mine = w.ownRow(b.s.RunID(), b.a.holder, b.fence, b.epoch)
	}
	// A run's units in a scope are those of the Slots of it that believes
	// it holds the most there: two Slots of one run share its rows.
	believers := map[string]map[string][]string{} // scope → run → keys
	for _, b := range beliefs {
		keys := map[string][]string{}
		for _, h := range b.s.Held() {
			w.mu.Lock()
			excused := w.slotLosses[b.s.RunID()+"|"+h.Key]
			w.mu.Unlock()
			if !excused && (b.kept || ((b.mine || b.free) && h.Until.After(snow))) {
				keys[h.Scope] = append(keys[h.Scope], h.Key)
			}
		}
		for scope, ks := range keys {
			if believers[scope] == nil {
				believers[scope] = map[string][]string{}
			}
			if len(ks) > len(believers[scope][b.s.RunID()]) {
				believers[scope][b.s.RunID()] = ks
			}
		}
	}
	for _, sc := range w.mode.Scopes {
		limit := sc.Limit
		if w.mode.Mixed {
			limit++
		}
		units := 0
		for _, ks := range believers[sc.Name] {
			units += len(ks)
		}
		if runs := believers[sc.Name]; units > limit {
			w.violate("slot-limit", sc.Name, "%d units of %s (limit %d) are believed held by %d runs with no loss reported: %v",
				units, sc.Name, limit, len(runs), runs)
		}
	}
}
