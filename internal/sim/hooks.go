package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// hookPlan is what a keeper's hooks do, once: nothing, or, from one hook,
// Stop it, Release through it, Renew its lease, or Close one of the shared
// Renewers (its own or another's, whose goroutine may be the one running
// the hook: a lease's loss is reported to all its keepers by the renewal
// that found it). The hook runs on whatever goroutine the library runs it
// on (a renewal's, the Renewer's loop, a caller's while its call on the
// lease returns), so each of these must return there, as from any other
// goroutine.
type hookPlan struct {
	act     string // "", "stop", "release", "renew" or "close"
	hook    string // "Lost", "SlotsLost" or "Renewed"
	renewer int    // "close": the shared Renewer closed, from 1
	done    bool   // the hook acted already
}

// planHooks draws what the hooks of rec, a keeper about to start, will do.
// A release is made only from the Lost hook, of a keeper that keeps no
// slots: its driver has lost the lease then, and gives it up; releasing a
// lease or slots the driver still uses is the workload's own business. The
// draw comes from a source of the seed and the keeper's number, not from
// the schedule's, so that every schedule's other choices stay as they were.
func (w *World) planHooks(rec *keeperRec) {
	rng := rand.New(rand.NewPCG(w.seed^0x6a09e667f3bcc909, uint64(rec.id)))
	hooks := []string{"Lost", "SlotsLost", "Renewed"}
	switch rng.IntN(6) {
	case 0:
		rec.hooks = hookPlan{act: "stop", hook: hooks[rng.IntN(3)]}
	case 1:
		rec.hooks = hookPlan{act: "renew", hook: hooks[rng.IntN(3)]}
	case 2:
		if rec.slots == nil {
			rec.hooks = hookPlan{act: "release", hook: "Lost"}
		}
	case 3:
		if w.mode.Shared > 0 {
			rec.hooks = hookPlan{act: "close", hook: hooks[rng.IntN(3)], renewer: 1 + rng.IntN(w.mode.Shared)}
		}
	}
}

// inHook runs what rec's plan says hook does, once, as an operation of its
// driver whose bound the observer checks: a call that waits for the hook's
// own goroutine, or for a write token that goroutine holds, never returns.
func (w *World) inHook(rec *keeperRec, hook string) {
	w.mu.Lock()
	plan, k, a := rec.hooks, rec.k, rec.a
	if plan.act == "" || plan.hook != hook || plan.done || k == nil {
		w.mu.Unlock()
		return
	}
	rec.hooks.done = true
	now := time.Now()
	desc := fmt.Sprintf("%s hook of k%d: %s", hook, rec.id, plan.act)
	if plan.act == "close" {
		desc += fmt.Sprintf(" R%d", plan.renewer)
	}
	o := &op{id: len(w.ops) + 1, desc: desc, a: a, gen: a.gen,
		start: now, bound: now.Add(callTimeout + promptly)}
	w.ops = append(w.ops, o)
	if plan.act == "release" {
		w.releasing[rec.lease] = true
	}
	w.mu.Unlock()
	w.tracef("start #%d d%d %s", o.id, a.id, o.desc)
	ctx, cancel := context.WithTimeout(withOp(context.Background(), o.id), callTimeout)
	defer cancel()
	var err error
	switch plan.act {
	case "stop":
		k.Stop()
	case "renew":
		start := time.Now()
		if err = rec.lease.Renew(ctx); err == nil {
			w.confirm(rec.lease, start)
		}
		w.checkLoss(o.desc, rec.lease, rec.run, rec.holder, rec.fence, err)
		w.checkLossEndedKeepers(o.desc, rec.lease, rec.run, err)
		w.markLost(a, rec.lease, err)
	case "release":
		err = k.Release(ctx)
		w.checkLoss(o.desc, rec.lease, rec.run, rec.holder, rec.fence, err)
		if err == nil {
			w.checkReleased(o.desc, rec.lease, rec.run, rec.holder, rec.fence)
		}
		w.markLost(a, rec.lease, err)
	case "close":
		w.renewers[plan.renewer-1].Close()
	}
	w.tracef("done  #%d d%d %s: %v", o.id, a.id, o.desc, errText(err))
	w.mu.Lock()
	o.done = true
	switch plan.act {
	case "stop", "release":
		rec.stopped = true
	case "close":
		for _, r := range w.keepers {
			if r.renewer == plan.renewer {
				r.stopped = true
			}
		}
	}
	if plan.act == "release" && a.lease == rec.lease {
		a.lost = true // the driver gives the lease up and starts again
	}
	w.mu.Unlock()
}

// endedAt is when rec's keeper ended, as its TrustedUntil tells (never
// later than that moment once it ended), or now while Keep has not
// returned it: a Lost hook may run after the keeper ended, behind another
// keeper's hook that took long, and the loss it reports was judged then.
func (w *World) endedAt(rec *keeperRec) time.Time {
	now := time.Now()
	w.mu.Lock()
	k := rec.k
	w.mu.Unlock()
	if k == nil {
		return now
	}
	if t := k.TrustedUntil(); t.Before(now) {
		return t
	}
	return now
}

// observeTrust judges what TrustedUntil says of rec, a keeper that has
// ended or whose lease a call found lost: that nothing is trusted beyond
// now. A keeper's own renewals may renew its lease after it ended (one in
// flight when it was stopped), which must not revive its trust.
func (w *World) observeTrust(rec *keeperRec, now time.Time) {
	w.mu.Lock()
	lostAt, lost := w.lostAt[rec.lease]
	w.mu.Unlock()
	ended := rec.work.Err() != nil
	if !ended && !lost {
		return
	}
	if trusted := rec.k.TrustedUntil(); trusted.After(now) {
		why := "has ended"
		if !ended {
			why = fmt.Sprintf("lease was reported lost %s ago", fmtDur(now.Sub(lostAt)))
		}
		w.violate("trust-after-end", fmt.Sprintf("%d", rec.id),
			"keeper k%d of %s %s, yet TrustedUntil is %s from now", rec.id, rec.run, why, fmtDur(trusted.Sub(now)))
	}
}
