package runlease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// maxInFlight bounds the renewals one Renewer runs at once.
const maxInFlight = 64

// Renewer renews many leases from one loop: each kept lease costs a small
// record and a place in a queue ordered by due time, not a goroutine. A
// renewal in flight runs on a goroutine of its own, at most 64 at once, and
// leases of one store that can renew many at once ([MultiCASer]) are renewed
// together in one call. The loop runs only while some lease is kept, so an
// idle Renewer holds no goroutine. The zero Renewer is ready to use; it is
// safe for concurrent use. See CONCURRENCY.md for who owns which state.
type Renewer struct {
	own bool // owned by one Keeper, made by Keep

	// mu guards the fields below and every Keeper's fields marked so. It
	// is never held across store I/O, hooks or logging; while holding it,
	// the loop may take a Lease's or Slots' leaf lock to read its state.
	mu       sync.Mutex
	queue    schedule
	wake     chan struct{}
	loopDone chan struct{} // closed when the running loop exits; nil when none runs
	batches  map[*batchJob]struct{}
	sem      chan struct{} // bounds renewals in flight
	jobs     sync.WaitGroup
	hooking  atomic.Int32 // hooks of its keepers running now, and of others' keepers on its goroutines (runHookOn)
}

// job is one renewal in flight for a keeper: alone, or as a member of a
// batch that renews several leases in one call.
type job struct {
	cancel   context.CancelFunc // cuts a job of its own, or a batch member renewing alone, short
	done     chan struct{}      // closed when the job has returned; nil in a batch, which nobody waits for
	batch    *batchJob          // the batch it belongs to, or nil
	detached bool               // its keeper ended: it no longer counts in batch.live
	timeLeft time.Duration      // trust left when it was dispatched
}

// batchJob is one batched renewal in flight. It is cut short once every
// keeper it renews for has ended.
type batchJob struct {
	cancel context.CancelFunc
	live   int
}

// Keep starts keeping lease: renewing it (and the slots of [KeepSlots]) every
// [KeepInterval] until the lease is lost, the keeper is stopped, or ctx
// ends. The keeper's hooks and logger default to those lease was acquired
// with. Keep takes the options [KeepInterval], [KeepMargin], [KeepSlots] or
// [KeepSlotsStrict], [WithHooks] and [WithLogger]; any other (a TTL or a
// clock, which could not change the rows the lease already wrote) makes it
// fail with [ErrInvalidArgument].
//
// ctx bounds the keeper, not a single call: when it ends, the keeper stops
// with an error matching [ErrKeeperStopped] that wraps ctx's cause, and the
// work context is cancelled — never silently. Its values reach every
// renewal of the lease made on its own; a batched renewal, one call that
// renews the leases of many keepers ([MultiCASer]), carries none of them.
// Pass a context that lives as long as the run, not a request's.
//
// Keep fails with [ErrInvalidArgument] for bad options, and with the lease's
// [*LeaseLostError] when it is already lost. When the lease's trust window
// has already run out (it was acquired or last renewed more than TTL -
// margin ago), the keeper has ended with [ErrTrustExpired] by the time Keep
// returns (Done closed, work context cancelled): renew the lease first.
// Several keepers may keep one lease; they share its renewals.
func (r *Renewer) Keep(ctx context.Context, lease *Lease, opts ...Option) (*Keeper, error) {
	if lease == nil {
		return nil, invalidArg("lease", "nil")
	}
	o := lease.o.options(0)
	o.set = 0
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.refuseOutside(optsKeep, "Keep"); err != nil {
		return nil, err
	}
	if err := o.validateKeep(lease); err != nil {
		return nil, err
	}
	k := &Keeper{r: r, lease: lease, parent: ctx, index: -1,
		o: keepOptions{ttl: o.ttl, interval: o.interval, margin: o.margin, hooks: o.hooks, logger: o.logger}}
	strict := o.slots != nil && o.strictSlots
	if o.slots != nil {
		k.ks = &keptSlots{slots: o.slots, strict: strict}
	}
	if err := lease.addKeeper(k); err != nil {
		return nil, err
	}
	if strict {
		o.slots.addStrict(k)
	}
	unwatch := func() bool { return false }
	if ctx.Done() != nil { // a context that can end: stop with it
		unwatch = context.AfterFunc(ctx, func() {
			r.end(k, keeperStopped(context.Cause(ctx)))
		})
	}
	r.mu.Lock()
	// Ended already (its lease lost, a strictly kept slot given up, or
	// ctx ended, while it was being registered): the end's own clean-up
	// may have run before a registration landed, so both are undone
	// again here (each is a no-op when already undone).
	report, end := func() {}, func() {
		unwatch()
		lease.removeKeeper(k)
		if strict {
			o.slots.removeStrict(k)
		}
	}
	if k.err == nil { // not lost, nor ctx ended, already
		k.unwatch = unwatch
		now := time.Now()
		var reason error
		if ctx.Err() != nil {
			// ctx ended already: the keeper ends now, not when the
			// watch's goroutine runs.
			end = r.endLocked(k, keeperStopped(context.Cause(ctx)))
		} else if reason, report = r.lossLocked(k, now); reason != nil {
			// Its trust window ran out before it started (or a strictly
			// kept slot is lost): it ends before Keep returns, so its work
			// context is never live while a contender may be granted the
			// run, however late the loop runs.
			end = r.endLocked(k, reason)
		} else {
			end = func() {}
			r.push(k) // the loop looks at it at once: a renewal may be due
		}
	}
	r.mu.Unlock()
	if report != nil {
		report()
	}
	end()
	return k, nil
}

// Close stops every keeper of the Renewer, as Stop does, cuts short every
// renewal in flight, and returns once its goroutines have exited. Leases are
// not released. The Renewer may be used again afterwards. Called while a
// hook runs that is one of its keepers' or runs on one of its goroutines
// (a lease's loss found by its renewal is reported to every keeper of the
// lease, on any Renewer), from the hook say, Close waits for nothing: the
// goroutine running the hook may be the Renewer's own.
func (r *Renewer) Close() {
	r.mu.Lock()
	keepers := r.queue.all()
	r.mu.Unlock()
	for _, k := range keepers {
		r.end(k, ErrKeeperStopped)
	}
	r.mu.Lock()
	for b := range r.batches {
		b.cancel()
	}
	r.mu.Unlock()
	if r.hooking.Load() > 0 {
		return
	}
	r.jobs.Wait()
	r.waitIdle()
}

// push queues k to be looked at at once, and makes sure the loop runs and
// sees it. r.mu is held.
func (r *Renewer) push(k *Keeper) {
	r.queue.addSoon(k)
	if r.loopDone == nil {
		r.wake = make(chan struct{}, 1)
		r.loopDone = make(chan struct{})
		go r.loop(r.wake, r.loopDone)
		return
	}
	r.poke()
}

// poke wakes the loop to look at the queue again. r.mu is held.
func (r *Renewer) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// waitIdle returns once the loop, if it is running down, has exited, and
// every renewal in flight has returned.
func (r *Renewer) waitIdle() {
	r.mu.Lock()
	done := r.loopDone
	idle := r.queue.len() == 0
	r.mu.Unlock()
	if idle && done != nil {
		<-done
	}
	if idle {
		r.jobs.Wait()
	}
}

// loop sleeps until the earliest keeper is due, handles every keeper due
// by then, and exits when no keeper is left.
func (r *Renewer) loop(wake <-chan struct{}, done chan struct{}) {
	defer close(done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		first, ok := r.queue.first()
		if !ok {
			r.loopDone = nil
			r.mu.Unlock()
			return
		}
		now := time.Now()
		if wait := first.Sub(now); wait > 0 { // first is zero for "at once"
			r.mu.Unlock()
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-wake:
			}
			continue
		}
		if reports := r.dueLocked(now); len(reports) > 0 {
			// Reports run hooks, which may take long (a hook may call
			// the store, or stop its keeper): on a goroutine of their
			// own, so that the loop goes on ending the other keepers
			// whose trust runs out meanwhile.
			r.jobs.Add(1)
			go func() {
				defer r.jobs.Done()
				for _, report := range reports {
					report()
				}
			}()
		}
		r.mu.Unlock()
	}
}

// dueLocked handles every keeper whose time has come: it ends those whose
// lease is lost or whose trust window ran out, and starts the renewals that
// are due. r.mu is held; the returned funcs run after unlocking, so hooks
// and loggers never run under the lock.
func (r *Renewer) dueLocked(now time.Time) []func() {
	var reports []func()
	var d dueRenewals
	for due := r.queue.takeDue(now); due != nil; due = r.queue.takeDue(now) {
		for _, k := range due {
			report, end := r.lookLocked(k, now, &d)
			if report != nil {
				reports = append(reports, report)
			}
			if end != nil {
				reports = append(reports, end)
			}
		}
	}
	r.dispatchLocked(now, &d)
	return reports
}

// dueRenewals are the renewals one pass of the loop found due: leases,
// slots alone, and slots to renew right after their lease (chained).
type dueRenewals struct {
	lease          []dueLease
	slots, chained []*Keeper
}

// dueLease is a lease renewal found due, with the end of its keeper's trust
// window as the look found it, which bounds the renewal.
type dueLease struct {
	k        *Keeper
	trustEnd time.Time
}

// lookLocked handles k, which is due and out of the queue: it ends k when
// its lease is lost or its trust window ran out, and otherwise adds the
// renewals due to d and queues k again for its next look. It returns what
// must run after unlocking: report, and end when k ended. r.mu is held.
func (r *Renewer) lookLocked(k *Keeper, now time.Time, d *dueRenewals) (report, end func()) {
	st := k.lease.state()
	next := k.trustEnd(st, now)
	reason, report := r.lossInLocked(k, now, st, next)
	if reason != nil {
		return report, r.endLocked(k, reason)
	}
	leaseNow := false
	if due := k.leaseDueAt(st); k.leaseJob != nil {
		// in flight: look again when the trust window ends
	} else if !now.Before(due) {
		d.lease, leaseNow = append(d.lease, dueLease{k, next}), true
	} else {
		next = earliest(next, due)
	}
	if k.ks != nil {
		from, trustEnd, any := k.ks.slots.keptState(now)
		due := from.Add(k.o.interval)
		if !k.ks.wait.at.IsZero() {
			due = k.ks.wait.at
		}
		switch {
		case !any:
		case k.ks.job != nil:
			// In flight: look again when the slots' trust window ends
			// (below), whether or not the store ever answers the
			// renewal, so a strict keeper ends in time.
		case leaseNow && (now.Before(due) || !trustEnd.Before(next)):
			// Renew the slots right after the lease, in the same job,
			// so that they stay in step with it: unless they are due
			// already and their trust ends before the lease's (slots
			// handed to the keeper as the lease fell due), when waiting
			// for the lease's write could let them lapse.
			d.chained = append(d.chained, k)
		case !now.Before(due):
			d.slots = append(d.slots, k)
		default:
			next = earliest(next, earliest(due, trustEnd))
		}
		if any {
			next = earliest(next, trustEnd)
		}
	}
	r.queue.add(k, next)
	return report, nil
}

// leaseDueAt returns when the lease in state st is next due for renewal.
func (k *Keeper) leaseDueAt(st leaseState) time.Time {
	if !k.leaseWait.at.IsZero() {
		return k.leaseWait.at
	}
	return onBeat(st.trustFrom.Add(k.o.interval), k.o.interval)
}

// onBeat moves due back to the last beat at or before it: beats are the
// multiples of interval/8 on the wall clock, so leases kept with one
// interval by one Renewer come due at the same instants and go out in one
// batched call, whenever each was acquired or last renewed. A lease renews
// at most an eighth of its interval early. Only the phase is read from the
// wall clock: the result is due moved back on its monotonic reading, so a
// step of the wall clock can misalign a beat, never delay a renewal.
func onBeat(due time.Time, interval time.Duration) time.Time {
	beat := int64(interval / 8)
	if beat <= 0 {
		return due
	}
	return due.Add(-time.Duration(((due.UnixNano() % beat) + beat) % beat))
}

// lossLocked returns why k must end now, if it must: its lease lost, its
// trust window run out, or, kept strictly, a slot lost. Slot losses are
// reported by the returned func, which runs after unlocking; it is nil when
// there are none. r.mu is held.
func (r *Renewer) lossLocked(k *Keeper, now time.Time) (error, func()) {
	st := k.lease.state()
	return r.lossInLocked(k, now, st, k.trustEnd(st, now))
}

// lossInLocked is lossLocked given the state of k's lease, st, and the
// end of its trust window, trustEnd. r.mu is held.
func (r *Renewer) lossInLocked(k *Keeper, now time.Time, st leaseState, trustEnd time.Time) (error, func()) {
	var report func() // nil: nothing to report
	if st.lost != nil {
		return st.lost, report
	}
	if !now.Before(trustEnd) {
		return k.trustExpired(), report
	}
	if k.ks == nil {
		return nil, report
	}
	lost := k.ks.slots.takeLosses(now)
	if lost != nil {
		report = func() {
			k.o.logger.Warn("runlease: slots lost", "run", k.lease.RunID(), "keys", lost.Keys, "cause", lost.Cause)
			if h := hooksOr(k.o.hooks).SlotsLost; h != nil {
				r.runHook(k, func() { h(SlotLossEvent{RunID: k.lease.RunID(), Err: lost}) })
			}
		}
	}
	if !k.ks.strict {
		return nil, report
	}
	// Kept strictly, any slot of the claim given up ends the keeper: one
	// just lost, and one whose loss was reported before this keeper
	// started or to another caller (the run's own Slots.Renew).
	if broken := k.ks.slots.brokenErr(); broken != nil {
		return broken, report
	}
	return nil, report
}

// end ends k with err unless it has ended already.
func (r *Renewer) end(k *Keeper, err error) {
	r.endLater(k, err)()
}

// endLater ends k with err unless it has ended already, and returns the
// report of the end (its Lost hook), for the caller to run once it holds
// nothing a hook may need: Lease.lose runs it once the lease's write token
// is given back.
func (r *Renewer) endLater(k *Keeper, err error) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endLocked(k, err)
}

// endLaterOn is endLater whose report is run later on a goroutine of
// Renewer host (nil: not a Renewer's), given to the report.
func (r *Renewer) endLaterOn(k *Keeper, err error) func(host *Renewer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endLockedOn(k, err)
}

// runHook runs call, a hook of k. Stop and Close called while it runs
// (from the hook itself, say) wait for nothing: the goroutine running the
// hook may be the very renewal or loop they would wait for.
func (r *Renewer) runHook(k *Keeper, call func()) { r.runHookOn(k, nil, call) }

// runHookOn is runHook on a goroutine of Renewer host (nil: not a
// Renewer's, or r's own), which counts the hook as one of its own too: a
// lease's loss found by host's renewal is reported to every keeper of the
// lease, and host's Close called from such a hook must not wait for the
// goroutine running it.
func (r *Renewer) runHookOn(k *Keeper, host *Renewer, call func()) {
	k.lease.hooking.Add(1)
	r.hooking.Add(1)
	if host != nil && host != r {
		host.hooking.Add(1)
	}
	defer func() {
		k.lease.hooking.Add(-1)
		r.hooking.Add(-1)
		if host != nil && host != r {
			host.hooking.Add(-1)
		}
	}()
	call()
}

// endLocked ends k: out of the queue, its renewals in flight cut short,
// work context cancelled, Done closed. r.mu is held; the returned func
// reports the end and runs after unlocking.
func (r *Renewer) endLocked(k *Keeper, err error) func() {
	report := r.endLockedOn(k, err)
	return func() { report(nil) }
}

// endLockedOn is endLocked whose report is told the Renewer whose goroutine
// runs it (nil: none's).
func (r *Renewer) endLockedOn(k *Keeper, err error) func(host *Renewer) {
	if k.err != nil {
		return func(*Renewer) {}
	}
	switch {
	case errors.Is(err, ErrKeeperStopped):
		// Stopped after its lease was found lost to others, before the
		// loss reached it (a hook of another keeper of the lease may stop
		// it meanwhile): the loss is why it ended. The driver's own
		// release is no loss (lostToOthers).
		if lost := k.lease.lostToOthers(); lost != nil {
			err = lost
		}
	case k.lease.releaseStops(err):
		// The driver's own release, found before that release stopped
		// the keeper (two Releases overlapping): Release stops it.
		err = ErrKeeperStopped
	}
	k.err, k.endedAt = err, time.Now()
	if k.bucket != nil {
		r.queue.remove(k)
		r.poke()
	}
	for _, j := range []*job{k.leaseJob, k.slotJob()} {
		r.detachLocked(j)
	}
	if k.cancel != nil {
		k.cancel(err)
	}
	if k.done == nil {
		k.done = closedChan
	} else {
		close(k.done)
	}
	unwatch := k.unwatch
	// The slots it keeps now are all it ever keeps: an ended keeper takes
	// none (keepSlots).
	ks := k.ks
	return func(host *Renewer) {
		if unwatch != nil {
			unwatch()
		}
		k.lease.removeKeeper(k)
		if ks != nil && ks.strict {
			ks.slots.removeStrict(k)
		}
		if !errors.Is(err, ErrLeaseLost) {
			return
		}
		k.o.logger.Warn("runlease: lease lost; stop advancing the run", "run", k.lease.RunID(), "err", err)
		if h := hooksOr(k.o.hooks).Lost; h != nil {
			r.runHookOn(k, host, func() { h(LossEvent{RunID: k.lease.RunID(), Fence: k.lease.fence, Err: err}) })
		}
	}
}

// detachLocked cuts j short for a keeper that ended: a job of its own at
// once, a batch once none of its keepers runs. r.mu is held.
func (r *Renewer) detachLocked(j *job) {
	switch {
	case j == nil || j.detached:
	case j.batch == nil:
		j.cancel()
	default:
		j.detached = true
		if j.cancel != nil { // a member renewing alone, after the batch
			j.cancel()
		}
		if j.batch.live--; j.batch.live == 0 {
			j.batch.cancel()
		}
	}
}
