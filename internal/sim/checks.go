package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// checkLoss: a call that reports a lost lease (other than a trust window
// that ran out) must not do so while the row is still this lease's own.
//
// A lease whose driver began to release it may answer ErrReleased from then
// on: a lease being given up is not to be trusted while the outcome of its
// release is in doubt.
func (w *World) checkLoss(call string, l Lease, run, holder string, fence uint64, err error) {
	w.checkLossAt(call, time.Now(), l, run, holder, fence, err)
}

// checkLossAt is checkLoss of a loss judged at the instant at: a keeper's
// Lost hook may run after the keeper ended, behind another keeper's hook
// that took long.
func (w *World) checkLossAt(call string, at time.Time, l Lease, run, holder string, fence uint64, err error) {
	if errors.Is(err, runlease.ErrTrustExpired) {
		w.checkTrustExpiry(call, at, l, run, err)
		return
	}
	if !errors.Is(err, runlease.ErrLeaseLost) {
		return
	}
	w.mu.Lock()
	releasing := w.releasing[l]
	w.mu.Unlock()
	if releasing && errors.Is(err, runlease.ErrReleased) {
		return
	}
	if r, own := w.ownRow(run, holder, fence, w.epochOf(l)); own {
		w.violate("false-lease-loss", fmt.Sprintf("%s|%s|%d|%s", run, holder, fence, call),
			"%s of %s by %s (fence %d) reported the lease lost while the row is its own (until_ms %d): %v",
			call, run, holder, fence, r.UntilMS, err)
	}
}

// checkTrustExpiry: a trust window cannot have run out sooner than TTL
// minus the margin after a call on the lease that succeeded began.
//
// Only calls that returned at an earlier instant count: the keeper judges its
// trust window, and then reports the end, at one fake instant, and a write
// that lands at that same instant may have landed after the judgement (a
// renewal that waited out a hung one for the lease's token, say). A keeper
// that judged its window run out then was right to: no write had landed in
// time.
func (w *World) checkTrustExpiry(call string, now time.Time, l Lease, run string, err error) {
	var start time.Time
	ok := false
	w.mu.Lock()
	for _, c := range w.confirmed[l] {
		if c.at.Before(now) && (!ok || c.start.After(start)) {
			start, ok = c.start, true
		}
	}
	w.mu.Unlock()
	if end := start.Add(w.mode.TTL - w.mode.Margin()); ok && now.Before(end) {
		w.violate("false-trust-expiry", fmt.Sprintf("%s|%s", run, call),
			"%s of %s reported the trust window run out, %s after a call on the lease that began at t=%s succeeded: %v",
			call, run, fmtDur(time.Since(start)), fmtDur(start.Sub(w.start)), err)
	}
	w.checkLandedTrust(call, now, l, run, err)
}

// confirmation is a call on a lease that succeeded: when it began, and
// when it returned.
type confirmation struct{ start, at time.Time }

// confirm records that a call on l that began at start succeeded.
func (w *World) confirm(l Lease, start time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.confirmed[l] = append(w.confirmed[l], confirmation{start: start, at: time.Now()})
}

// checkReleased: a release of l that returned nil left no live row of its
// own.
func (w *World) checkReleased(call string, l Lease, run, holder string, fence uint64) {
	if r, own := w.ownRow(run, holder, fence, w.epochOf(l)); own && r.live(w.storeNow()) {
		w.violate("release-not-landed", run+"|"+holder, "%s of %s by %s returned nil but its live row is still there", call, run, holder)
	}
}

// checkSlotLoss: a slot reported lost (other than by a trust window that
// ran out) must not still be the run's own.
func (w *World) checkSlotLoss(call string, a *actor, slotRun string, err error) {
	var lost *runlease.SlotLostError
	if !errors.As(err, &lost) || errors.Is(err, runlease.ErrTrustExpired) {
		return
	}
	w.falseSlotLoss(call, a, slotRun, lost.Keys)
}

// falseSlotLoss reports slots called lost whose row is still the run's,
// last written by this driver, and live for more than the margin: another
// claim of the same run may rewrite a row, and a slot whose trust window
// has run out may be given up, so those losses are real.
func (w *World) falseSlotLoss(call string, a *actor, slotRun string, keys []string) {
	for _, key := range keys {
		raw, ok := w.store.Peek(key)
		w.mu.Lock()
		mine := w.writer[key] == a && w.writerGen[key] == a.gen
		w.mu.Unlock()
		if r, _ := decode(raw); ok && r.Holder == slotRun && mine && r.remaining(w.storeNow()) > w.mode.Margin() {
			w.violate("false-slot-loss", slotRun+"|"+key, "%s reported slot %s of %s lost while the row is still the run's own (%s)",
				call, key, slotRun, raw)
		}
	}
}

// onSlotsLost is a keeper's SlotsLost hook: it excuses the slots from the
// limit checker, once the loss is checked to be real.
func (w *World) onSlotsLost(rec *keeperRec, slotRun string, keys []string, err error) {
	if !errors.Is(err, runlease.ErrTrustExpired) {
		w.falseSlotLoss(fmt.Sprintf("keeper k%d (SlotsLost hook)", rec.id), rec.a, slotRun, keys)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range keys {
		w.slotLosses[slotRun+"|"+k] = true
	}
	if _, ok := w.strictLost[rec]; rec.strict && !ok {
		w.strictLost[rec] = time.Now()
	}
}

// checkSlotsFreed: after a release that returned nil, no slot row this
// driver wrote is left live for more than the margin (a slot past its trust
// window may be left to expire).
func (w *World) checkSlotsFreed(call string, a *actor, slotRun string) {
	now := w.storeNow()
	for _, r := range w.store.Scan(runlease.SlotPrefix) {
		w.mu.Lock()
		mine := w.writer[r.Key] == a && w.writerGen[r.Key] == a.gen
		w.mu.Unlock()
		if row, _ := decode(r.Value); row.Holder == slotRun && row.remaining(now) > w.mode.Margin() && mine {
			w.violate("slot-release-left-row", slotRun+"|"+r.Key, "%s of %s returned nil but left its live slot row %s",
				call, slotRun, r.Key)
		}
	}
}

// checkWaitErr: AcquireWait whose context ended returns ctx.Err() itself,
// not a storage fault caused by it.
func (w *World) checkWaitErr(o *op, ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil && err != ctx.Err() && errors.Is(err, ctx.Err()) {
		w.violate("wait-ctx-err", fmt.Sprintf("op%d", o.id), "AcquireWait #%d: its context ended, and it returned %v instead of ctx.Err()", o.id, err)
	}
}

// checkClaimFault: a claim whose batch met an unknown outcome, did not
// apply, and was followed by reads that succeeded and showed another run's
// rows lost a race: it must end won or refused, not as a fault.
func (w *World) checkClaimFault(o *op, slotRun string, err error) {
	if !errors.Is(err, runlease.ErrStorage) {
		return
	}
	log := w.store.log(o.id)
	last := -1
	for i, c := range log {
		if c.outcome != OK && c.outcome != Slow {
			last = i
		}
	}
	if last < 0 {
		if !errors.Is(err, context.DeadlineExceeded) {
			w.violate("claim-fault-on-race", fmt.Sprintf("op%d", o.id), "ClaimSlots #%d got no fault from the store but returned %v", o.id, err)
		}
		return
	}
	c := log[last]
	if c.op != "MetaBatch" || c.applied || (c.outcome != Lost && c.outcome != Unsent) {
		return
	}
	reads := 0
	for _, r := range log[last+1:] {
		if (r.outcome == OK || r.outcome == Slow) && (r.op == "MetaGet" || r.op == "MetaScan") {
			reads++
		}
	}
	moved := ""
	for _, cond := range c.conds {
		v, ok := w.store.Peek(cond.Key)
		if (cond.Value == nil && ok) || (cond.Value != nil && (!ok || v != *cond.Value)) {
			moved = cond.Key
		}
	}
	if reads > 0 && moved != "" {
		w.violate("claim-fault-on-race", fmt.Sprintf("op%d", o.id),
			"ClaimSlots #%d for %s lost a race (its batch did not apply, %s was taken, and %d read(s) after it succeeded) but returned a fault: %v",
			o.id, slotRun, moved, reads, err)
	}
}

// applied is the store's report of every write, at the instant it lands.
// The store's mutex is held.
func (w *World) applied(key string, old, now *string, at time.Time, opID int) {
	w.mu.Lock()
	if opID > 0 && opID <= len(w.ops) {
		w.writer[key] = w.ops[opID-1].a
		w.writerGen[key] = w.ops[opID-1].gen
		w.opWriter[key] = opID
	} else {
		delete(w.writer, key)
		delete(w.writerGen, key)
		delete(w.opWriter, key)
	}
	w.queueWritten(key, now, at, opID)
	w.mu.Unlock()
	switch {
	case strings.HasPrefix(key, runlease.LeasePrefix):
		w.leaseWritten(strings.TrimPrefix(key, runlease.LeasePrefix), old, now, at)
	case strings.HasPrefix(key, runlease.SlotPrefix):
		w.slotWritten(key, old, now, at)
	case now != nil:
		w.mu.Lock()
		w.userValues[*now] = true
		w.mu.Unlock()
	}
}

// leaseWritten checks that fences never go backwards and that each fence
// of a run belongs to one holder only, and that no keeper
// of an older holder still trusts when a new holder is granted the run.
//
// It also checks, by the store's clock at the write, that no holder is
// granted a run while another holder's row is live (at most one holder per
// run at any instant, as judged by the store; in a mode whose store clock
// steps back an expired row may come back to life, so not there), and that
// a release lands only once no keeper of the released lease trusts it
// (Release stops the lease's keepers first).
func (w *World) leaseWritten(run string, old, now *string, at time.Time) {
	if now == nil {
		w.leaseDeleted(run, old, at)
		return
	}
	n, _ := decode(*now)
	w.mu.Lock()
	epoch := w.epoch[run]
	w.mu.Unlock()
	if old != nil {
		o, _ := decode(*old)
		if n.Fence < o.Fence {
			w.violate("fence-backwards", fmt.Sprintf("%s|%d|%d", run, o.Fence, n.Fence),
				"run %s went from %s to %s", run, *old, *now)
		}
		if w.mode.ClockP == 0 && n.Holder != "" && o.Holder != n.Holder && o.live(at) {
			w.violate("live-takeover", fmt.Sprintf("%s|%d", run, n.Fence),
				"%s was granted run %s at fence %d while the row of %s (fence %d) was live for %s more",
				n.Holder, run, n.Fence, o.Holder, o.Fence, fmtDur(o.remaining(at)))
		}
		if n.Holder == "" && o.Holder != "" {
			w.mu.Lock()
			var trusting []int
			for _, r := range w.keepers {
				if r.run == run && r.holder == o.Holder && r.fence == o.Fence && r.epoch == epoch && r.work.Err() == nil {
					trusting = append(trusting, r.id)
				}
			}
			w.mu.Unlock()
			if len(trusting) > 0 {
				w.violate("release-while-trusted", fmt.Sprintf("%s|%d", run, o.Fence),
					"the release of %s by %s (fence %d) landed while its keeper(s) %v still trusted it",
					run, o.Holder, o.Fence, trusting)
			}
		}
	}
	if n.Holder != "" {
		w.mu.Lock()
		id := fmt.Sprintf("%s|%d|%d", run, epoch, n.Fence)
		first, ok := w.fenceHolder[id]
		if !ok {
			w.fenceHolder[id] = n.Holder
		}
		w.mu.Unlock()
		if ok && first != n.Holder {
			w.violate("fence-backwards", id, "run %s gave fence %d to %s after %s had it", run, n.Fence, n.Holder, first)
		}
	}
	if n.Holder == "" {
		return
	}
	w.mu.Lock()
	var stale []*keeperRec
	for _, r := range w.keepers {
		if r.run == run && (r.holder != n.Holder || r.fence != n.Fence || r.epoch != epoch) && r.work.Err() == nil && !r.supersededBy(n, epoch) {
			stale = append(stale, r)
		}
	}
	w.mu.Unlock()
	for _, r := range stale {
		w.violate("exclusive-trust", fmt.Sprintf("grant|%s|%d", run, r.id),
			"%s was granted run %s at fence %d while keeper k%d of %s (fence %d) still trusts it",
			n.Holder, run, n.Fence, r.id, r.holder, r.fence)
	}
}

// leaseDeleted checks the deletion of run's lease row: only Prune deletes
// one, in a mode that prunes, and only a row that held no live lease. The
// run's next lineage begins. The store's mutex is held.
func (w *World) leaseDeleted(run string, old *string, at time.Time) {
	if !w.mode.Prune {
		w.violate("fence-backwards", run+"|delete", "the lease row of %s was deleted", run)
		return
	}
	if old != nil {
		if o, _ := decode(*old); o.live(at) {
			w.violate("pruned-live", run, "the lease row of %s was deleted while %s held it (fence %d) for %s more",
				run, o.Holder, o.Fence, fmtDur(o.remaining(at)))
		}
	}
	w.mu.Lock()
	w.epoch[run]++
	w.mu.Unlock()
}

// slotWritten checks that a claim takes a slot only while fewer than its
// limit of other runs hold live slots of the scope, unless another claim
// of the scope raced it.
func (w *World) slotWritten(key string, old, now *string, at time.Time) {
	if now == nil {
		return
	}
	n, _ := decode(*now)
	if old != nil {
		if o, _ := decode(*old); o.Holder == n.Holder && o.live(at) {
			return // a renewal, not a claim
		}
	}
	scope := slotScope(key)
	w.mu.Lock()
	defer w.mu.Unlock()
	for run, c := range w.claims {
		if run != n.Holder {
			c.interfered[scope] = true
		}
	}
	c := w.claims[n.Holder]
	if c == nil || c.interfered[scope] {
		return
	}
	limit, ok := c.limits[scope]
	if !ok {
		return
	}
	others := 0
	for _, r := range w.store.scanLocked(runlease.SlotPrefix + scope + ":") {
		if slotScope(r.Key) != scope {
			continue
		}
		if row, _ := decode(r.Value); row.Holder != n.Holder && row.live(at) {
			others++
		}
	}
	if others >= limit {
		id := fmt.Sprintf("claim-limit|%s|%s", n.Holder, key)
		if !w.seen[id] {
			w.seen[id] = true
			v := Violation{Check: "claim-limit", At: time.Since(w.start), Detail: fmt.Sprintf(
				"a claim of %s under limit %d took %s while %d other run(s) held live slots of %s", n.Holder, limit, key, others, scope)}
			w.violations = append(w.violations, v)
			w.mon.tracef("!! %s", v)
		}
	}
}

// checkLossEndedKeepers: a call on a lease that reports it lost (other than
// a trust window that ran out, which is one keeper's) has ended every
// keeper of the lease, and cancelled its work context, when it returns.
func (w *World) checkLossEndedKeepers(call string, l Lease, run string, err error) {
	if !errors.Is(err, runlease.ErrLeaseLost) || errors.Is(err, runlease.ErrTrustExpired) {
		return
	}
	w.mu.Lock()
	var running []int
	for _, r := range w.keepers {
		if r.lease == l && r.work != nil && r.work.Err() == nil {
			running = append(running, r.id)
		}
	}
	w.mu.Unlock()
	if len(running) > 0 {
		w.violate("loss-keeper-running", fmt.Sprintf("%s|%v", run, running),
			"%s of %s returned a loss (%v), but the work context of its keeper(s) %v is still live",
			call, run, errText(err), running)
	}
}

// checkClaimRefusal: a claim refused for the limit (not a fault) left no
// slot row it wrote (a claim that is refused in one scope gives back the
// slots it took in the others), and met no write of unknown outcome whose
// read-back showed it had not landed: such a write is a fault, never a
// lost race, so it cannot end in a refusal.
func (w *World) checkClaimRefusal(o *op, slotRun string, err error) {
	if !errors.Is(err, runlease.ErrConcurrencyLimit) || errors.Is(err, runlease.ErrStorage) {
		return
	}
	subject := fmt.Sprintf("op%d", o.id)
	now := w.storeNow()
	log := w.store.log(o.id)
	// restored reports whether value is what key held before the claim
	// first wrote it: another Slots of the same run may hold the slot too,
	// and the rollback puts its row back.
	restored := func(key, value string) bool {
		for _, c := range log {
			if c.op == "MetaCAS" && c.key == key {
				return c.expected != nil && *c.expected == value
			}
		}
		return false
	}
	for _, r := range w.store.Scan(runlease.SlotPrefix) {
		w.mu.Lock()
		mine := w.opWriter[r.Key] == o.id
		w.mu.Unlock()
		if row, _ := decode(r.Value); mine && row.Holder == slotRun && row.live(now) && !restored(r.Key, r.Value) {
			w.violate("refused-claim-kept-slot", subject, "ClaimSlots #%d for %s was refused (%v) but left its live slot row %s",
				o.id, slotRun, errText(err), r.Key)
		}
	}
	for i, c := range log {
		if c.op != "MetaCAS" || c.applied || (c.outcome != Lost && c.outcome != Unsent && c.outcome != Hang && c.outcome != HangApplied) {
			continue
		}
		for _, r := range log[i+1:] {
			if r.op != "MetaGet" || r.key != c.key || (r.outcome != OK && r.outcome != Slow) {
				continue
			}
			if (c.expected == nil && !r.found) || (c.expected != nil && r.found && r.read == *c.expected) {
				w.violate("refusal-on-fault", subject,
					"ClaimSlots #%d for %s was refused (%v), but its write of %s had an unknown outcome (%s) and the read-back found it not applied: a fault",
					o.id, slotRun, errText(err), c.key, c.outcome)
			}
			break
		}
	}
}
