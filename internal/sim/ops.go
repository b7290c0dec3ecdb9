package sim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/areev/runlease"
)

const (
	callTimeout = 2 * time.Second       // the context of most operations
	promptly    = 50 * time.Millisecond // how long Stop, Close and Keep may take, in fake time
	// takeBack is the bound the library states on what an acquisition
	// whose context ended spends releasing a write it may have landed
	// (Acquire's doc): an acquiring call returns within its context's end
	// plus this.
	takeBack = 500 * time.Millisecond
)

// structural operations change what an actor holds, so they run alone.
var structural = map[string]bool{
	"acquire": true, "acquire-twice": true, "acquire-wait": true, "release": true, "keep": true, "keep-shared": true,
	"stop": true, "keeper-release": true, "abandon": true, "close-renewer": true, "claim": true,
	"slots-release": true, "reenter": true, "release-kept": true, "wait": true, "wait-lease": true, "wait-burst": true,
}

// pruneAges are the olderThan arguments the prune operation passes.
var pruneAges = []time.Duration{0, 0, 800 * time.Millisecond, 3 * time.Second}

// active returns the keepers of a that were neither stopped nor ended.
// w.mu is held.
func (w *World) active(a *actor) []*keeperRec {
	var out []*keeperRec
	for _, r := range w.keepers {
		if r.a == a && !r.stopped && r.work.Err() == nil {
			out = append(out, r)
		}
	}
	return out
}

// keepersOf returns every keeper started on a's current lease. w.mu is
// held.
func (w *World) keepersOf(a *actor) []*keeperRec {
	var out []*keeperRec
	for _, r := range w.keepers {
		if r.a == a && r.lease == a.lease {
			out = append(out, r)
		}
	}
	return out
}

// slotsKept reports whether a live keeper renews a's slots. w.mu is held.
func (w *World) slotsKept(a *actor) bool {
	for _, r := range w.active(a) {
		if r.slots != nil && r.slots == a.slots {
			return true
		}
	}
	return false
}

// validOps lists the operations a may start now. w.mu is held.
func (w *World) validOps(a *actor) []string {
	if a.busy >= 2 || (w.mode.Serial && a.busy > 0) {
		return nil
	}
	var out []string
	add := func(kind string, ok bool) {
		if ok && w.mode.Ops[kind] > 0 && (!structural[kind] || a.busy == 0) {
			out = append(out, kind)
		}
	}
	if a.lost {
		add("abandon", true)
		return out
	}
	act := w.active(a)
	held := a.lease != nil
	add("acquire", !held)
	add("acquire-twice", !held)
	add("acquire-wait", !held)
	add("renew", held)
	add("write", held)
	add("write-keeper-ctx", held && len(w.keepersOf(a)) > 0)
	// A driver that re-entered its run with keepers of the replaced Lease
	// still running gives the run up only once they ended (a call on the
	// replaced Lease ends them): until then they trust the run.
	superseded := false
	for _, r := range act {
		superseded = superseded || r.superseded
	}
	add("release", held && len(act) == 0)
	add("release-kept", held && len(act) > 0 && !superseded)
	add("reenter", held)
	add("renew-stale", a.stale != nil)
	add("write-stale", a.stale != nil)
	keepable := held && len(act) < 2 && (!w.mode.OneKeeper || len(w.keepersOf(a)) == 0)
	add("keep", keepable)
	add("keep-shared", keepable && w.mode.Shared > 0)
	add("stop", len(act) > 0)
	add("keeper-release", len(act) > 0 && !superseded)
	add("abandon", held || a.slots != nil)
	add("close-renewer", w.mode.Shared > 0)
	add("prune", w.mode.Prune)
	kept := w.slotsKept(a)
	add("claim", held && a.slots == nil && len(w.mode.Scopes) > 0)
	add("slots-renew", a.slots != nil && !kept)
	add("slots-release", a.slots != nil && !kept)
	if w.mode.Queue != nil {
		add("wait", a.slots == nil && a.wait == nil)
		add("wait-lease", held && a.slots == nil && a.wait == nil)
		add("cancel-wait", waitInFlight(a) != nil)
		add("abandon-wait", waitInFlight(a) != nil)
		add("wait-burst", a.slots == nil && a.wait == nil)
		add("plant-legacy", true)
		add("plant-ghosts", true)
	}
	return out
}

// startOp starts an operation of a random actor, and reports whether it
// found one to start.
func (w *World) startOp() bool {
	a := w.actors[w.rng.IntN(len(w.actors))]
	w.mu.Lock()
	kinds := w.validOps(a)
	w.mu.Unlock()
	if len(kinds) == 0 {
		return false
	}
	sort.Strings(kinds)
	total := 0.0
	for _, k := range kinds {
		total += w.mode.Ops[k]
	}
	x := w.rng.Float64() * total
	kind := kinds[len(kinds)-1]
	for _, k := range kinds {
		if x -= w.mode.Ops[k]; x < 0 {
			kind = k
			break
		}
	}
	w.begin(a, kind)
	return true
}

// launch runs body as operation desc of a, on a goroutine of its own, and
// records that it must return within limit.
func (w *World) launch(a *actor, desc string, limit time.Duration, body func(ctx context.Context, o *op) error) {
	now := time.Now()
	w.mu.Lock()
	o := &op{id: len(w.ops) + 1, desc: desc, a: a, gen: a.gen, start: now, bound: now.Add(limit)}
	w.ops = append(w.ops, o)
	a.busy++
	w.mu.Unlock()
	w.tracef("start #%d d%d %s", o.id, a.id, desc)
	go func() {
		err := body(withOp(context.Background(), o.id), o)
		w.tracef("done  #%d d%d %s: %v", o.id, a.id, desc, errText(err))
		w.mu.Lock()
		o.done = true
		a.busy--
		w.mu.Unlock()
	}()
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	s := err.Error()
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// setLease records a lease a just acquired, in the run's lineage now: an
// acquisition's row is live when the call returns, so no prune came
// between its write and now.
func (w *World) setLease(a *actor, l Lease) {
	fence := l.Fence()
	w.mu.Lock()
	epoch := w.epoch[l.RunID()]
	a.lease, a.fence, a.epoch, a.run, a.lost, a.shadowed = l, fence, epoch, l.RunID(), false, false
	w.leaseEpoch[l] = epoch
	w.mu.Unlock()
}

// markLost records that a call on a's lease reported it lost.
func (w *World) markLost(a *actor, l Lease, err error) {
	if !errors.Is(err, runlease.ErrLeaseLost) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.lostAt[l]; !ok {
		w.lostAt[l] = time.Now()
	}
	if a.lease == l {
		a.lost = true
	}
}

// begin starts one operation of kind for a.
func (w *World) begin(a *actor, kind string) {
	w.mu.Lock()
	l, fence, epoch, run, slots := a.lease, a.fence, a.epoch, a.run, a.slots
	act := w.active(a)
	w.mu.Unlock()
	ttl := w.mode.TTL
	switch kind {
	case "acquire":
		run := fmt.Sprintf("r%d", w.rng.IntN(w.mode.Runs))
		w.launch(a, "Acquire "+run, callTimeout+takeBack+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			start := time.Now()
			l, err := w.api.Acquire(ctx, w.lib(), run, a.holder, ttl)
			if err == nil {
				w.setLease(a, l)
				w.confirm(l, start)
			}
			return err
		})
	case "acquire-twice":
		run := fmt.Sprintf("r%d", w.rng.IntN(w.mode.Runs))
		w.launch(a, "Acquire "+run+" twice at once", callTimeout+takeBack+promptly, func(ctx context.Context, o *op) error {
			return w.acquireTwice(ctx, o, a, run)
		})
	case "acquire-wait":
		run := fmt.Sprintf("r%d", w.rng.IntN(w.mode.Runs))
		d := []time.Duration{300 * time.Millisecond, time.Second, 3 * time.Second, 8 * time.Second}[w.rng.IntN(4)]
		w.launch(a, fmt.Sprintf("AcquireWait %s within %v", run, d), d+takeBack+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			l, err := w.api.AcquireWait(ctx, w.lib(), run, a.holder, ttl, time.Second)
			if err == nil {
				w.setLease(a, l)
			}
			w.checkWaitErr(o, ctx, err)
			return err
		})
	case "renew":
		w.launch(a, "Renew "+run, callTimeout+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			start := time.Now()
			err := l.Renew(ctx)
			if err == nil {
				w.confirm(l, start)
			}
			w.checkLoss("Renew", l, run, a.holder, fence, err)
			w.checkLossEndedKeepers("Renew", l, run, err)
			w.markLost(a, l, err)
			return err
		})
	case "write", "write-keeper-ctx":
		var work context.Context
		desc := "Write " + run
		if kind == "write-keeper-ctx" { // any keeper of the lease, ended or not
			w.mu.Lock()
			ks := w.keepersOf(a)
			w.mu.Unlock()
			rec := ks[w.rng.IntN(len(ks))]
			work = rec.work
			desc += fmt.Sprintf(" with k%d's context", rec.id)
		}
		w.launch(a, desc, callTimeout+promptly, func(ctx context.Context, o *op) error {
			return w.write(ctx, o, a, l, run, fence, work)
		})
	case "release", "release-kept":
		desc := "Release " + run
		if kind == "release-kept" {
			desc += " with its keepers running"
		}
		w.launch(a, desc, callTimeout+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			w.mu.Lock()
			w.releasing[l] = true
			kept := w.keepersOf(a)
			w.mu.Unlock()
			err := l.Release(ctx)
			w.checkReleaseWait(o, "Release", run, o.start, err)
			// Release stops the lease's keepers first, whatever its outcome.
			for _, r := range kept {
				if r.work.Err() == nil {
					w.violate("release-left-keeper", fmt.Sprintf("%d", r.id),
						"Release #%d of %s returned (%v) with its keeper k%d still running", o.id, run, errText(err), r.id)
				}
			}
			w.checkLoss("Release", l, run, a.holder, fence, err)
			w.checkLossEndedKeepers("Release", l, run, err)
			w.markLost(a, l, err)
			if err == nil {
				w.checkReleased("Release", l, run, a.holder, fence)
				w.mu.Lock()
				a.lease = nil
				w.mu.Unlock()
			}
			return err
		})
	case "reenter":
		// The same holder acquires the run it holds again: it is granted
		// the run at a higher fence, and the Lease it had is replaced, its
		// renewals and fenced writes to be refused from then on.
		w.launch(a, "Acquire "+run+" again (re-entry)", callTimeout+takeBack+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			w.mu.Lock()
			for _, r := range w.keepersOf(a) {
				r.superseded = true
			}
			w.mu.Unlock()
			start := time.Now()
			nl, err := w.api.Acquire(ctx, w.lib(), run, a.holder, ttl)
			if err == nil {
				w.tracef("  #%d re-entered %s at fence %d (the replaced lease's: %d)", o.id, run, nl.Fence(), fence)
				if nl.Fence() <= fence && w.runEpoch(run) == epoch {
					// Two Leases of one holder at one fence: the replaced one
					// is not fenced out, so the checks of a replaced lease
					// do not apply to it.
					w.violate("reentry-same-fence", fmt.Sprintf("op%d", o.id),
						"Acquire #%d re-entered %s at fence %d, not above the fence %d of the lease it replaces",
						o.id, run, nl.Fence(), fence)
				} else {
					w.mu.Lock()
					a.stale, a.staleFence, a.staleEpoch = l, fence, epoch
					w.mu.Unlock()
				}
				w.setLease(a, nl)
				w.confirm(nl, start)
			} else {
				// The re-entry may have landed (an unknown outcome), so the
				// Lease it would replace is given up, as a driver must.
				w.mu.Lock()
				if a.lease == l {
					a.lost = true
				}
				w.mu.Unlock()
			}
			return err
		})
	case "renew-stale", "write-stale":
		w.mu.Lock()
		stale, sfence := a.stale, a.staleFence
		w.mu.Unlock()
		call := "Renew"
		if kind == "write-stale" {
			call = "Write"
		}
		w.launch(a, fmt.Sprintf("%s %s on the lease of fence %d replaced by a re-entry", call, stale.RunID(), sfence), callTimeout+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			run := stale.RunID()
			var err error
			if kind == "write-stale" {
				err = stale.Write(ctx, runlease.Put("ckpt:"+run, fmt.Sprintf("v%d", o.id)))
			} else {
				err = stale.Renew(ctx)
			}
			if err == nil {
				w.violate("stale-lease-wrote", fmt.Sprintf("op%d", o.id),
					"%s #%d on the lease of %s at fence %d succeeded after the same holder was granted the run again",
					call, o.id, run, sfence)
			}
			w.checkLoss(call, stale, run, a.holder, sfence, err)
			w.checkLossEndedKeepers(call, stale, run, err)
			w.markLost(a, stale, err)
			return err
		})
	case "prune":
		olderThan := pruneAges[w.rng.IntN(len(pruneAges))]
		w.launch(a, fmt.Sprintf("Prune older than %v", olderThan), callTimeout+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			runs, err := w.api.Prune(ctx, w.lib(), olderThan)
			w.tracef("  #%d pruned the leases of %v", o.id, runs)
			return err
		})
	case "keep", "keep-shared":
		w.beginKeep(a, kind, l, run, fence, epoch, slots)
	case "stop":
		rec := act[w.rng.IntN(len(act))]
		w.launch(a, fmt.Sprintf("Stop keeper k%d", rec.id), promptly, func(ctx context.Context, o *op) error {
			rec.k.Stop()
			w.mu.Lock()
			rec.stopped = true
			w.mu.Unlock()
			return nil
		})
	case "keeper-release":
		w.beginKeeperRelease(a, act, run, fence)
	case "abandon":
		w.launch(a, "abandon "+run, promptly, func(ctx context.Context, o *op) error {
			w.stopAll(a)
			w.mu.Lock()
			a.lease, a.slots, a.lost, a.stale = nil, nil, false, nil
			a.gen++
			w.mu.Unlock()
			return nil
		})
	case "close-renewer":
		i := 1 + w.rng.IntN(w.mode.Shared)
		w.launch(a, fmt.Sprintf("Close renewer R%d", i), promptly, func(ctx context.Context, o *op) error {
			w.renewers[i-1].Close()
			w.mu.Lock()
			for _, r := range w.keepers {
				if r.renewer == i {
					r.stopped = true
				}
			}
			w.mu.Unlock()
			return nil
		})
	case "claim":
		// A driver claims slots only right after it saw its lease hold, as
		// the docs ask; a stalled driver's claim is not promised anything.
		if r, own := w.ownRow(run, a.holder, fence, epoch); !own || !r.live(w.storeNow()) {
			return
		}
		w.beginClaim(a, run)
	case "wait", "wait-lease":
		w.beginWait(a, kind, l, run, fence, epoch)
	case "wait-burst":
		w.beginBurst(a)
	case "plant-legacy":
		w.plantLegacy(a)
	case "plant-ghosts":
		w.plantGhosts(a)
	case "cancel-wait":
		w.beginCancelWait(a)
	case "abandon-wait":
		w.beginAbandonWait(a)
	case "slots-renew":
		w.launch(a, "Slots.Renew "+slots.RunID(), callTimeout+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			err := slots.Renew(ctx)
			w.checkSlotLoss("Slots.Renew", a, slots.RunID(), err)
			return err
		})
	case "slots-release":
		w.launch(a, "Slots.Release "+slots.RunID(), callTimeout+promptly, func(ctx context.Context, o *op) error {
			ctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			err := slots.Release(ctx)
			if err == nil {
				w.checkSlotsFreed("Slots.Release", a, slots.RunID())
				w.mu.Lock()
				a.slots = nil
				w.mu.Unlock()
			}
			return err
		})
	}
}

// acquireTwice makes two acquisitions of run by a's holder at once, as a
// driver whose two goroutines both start the run would. Each that wins is
// a Lease: the one at the higher fence (of the later lineage) is the
// driver's lease, and the other a stale one that must no longer renew or
// write. One whose outcome is unknown may have left the row at a higher
// fence than the winner's, so the winner's keepers count as superseded.
func (w *World) acquireTwice(ctx context.Context, o *op, a *actor, run string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	type result struct {
		l     Lease
		err   error
		start time.Time
		epoch int
	}
	var res [2]result
	done := make(chan int, 2)
	for i := range res {
		go func() {
			res[i].start = time.Now()
			res[i].l, res[i].err = w.api.Acquire(ctx, w.lib(), run, a.holder, w.mode.TTL)
			if res[i].err == nil {
				res[i].epoch = w.runEpoch(run)
			}
			done <- i
		}()
	}
	<-done
	<-done
	var won []result
	unknown := false
	for _, r := range res {
		if r.err == nil {
			won = append(won, r)
			w.tracef("  #%d was granted %s at fence %d", o.id, run, r.l.Fence())
		} else {
			w.tracef("  #%d one acquisition failed: %v", o.id, errText(r.err))
			unknown = unknown || runlease.IsOutcomeUnknown(r.err)
		}
	}
	if len(won) == 2 {
		older, newer := won[0], won[1]
		if older.epoch > newer.epoch || (older.epoch == newer.epoch && older.l.Fence() > newer.l.Fence()) {
			older, newer = newer, older
		}
		if older.epoch == newer.epoch && older.l.Fence() == newer.l.Fence() {
			w.violate("reentry-same-fence", fmt.Sprintf("op%d", o.id),
				"the two acquisitions of %s by %s in #%d were both granted fence %d", run, a.holder, o.id, newer.l.Fence())
		}
		w.setLease(a, newer.l)
		w.confirm(newer.l, newer.start)
		w.mu.Lock()
		w.leaseEpoch[older.l] = older.epoch
		a.stale, a.staleFence, a.staleEpoch = older.l, older.l.Fence(), older.epoch
		w.mu.Unlock()
		return nil
	}
	if len(won) == 1 {
		w.setLease(a, won[0].l)
		w.confirm(won[0].l, won[0].start)
		w.mu.Lock()
		a.shadowed = unknown
		w.mu.Unlock()
		return nil
	}
	return errors.Join(res[0].err, res[1].err)
}
