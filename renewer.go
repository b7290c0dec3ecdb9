package runlease

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"
)

// maxInFlight bounds the renewals one Renewer runs at once.
const maxInFlight = 64

// Renewer renews many leases from one loop: each kept lease costs a small
// record and a place in a queue ordered by due time, not a goroutine. A
// renewal in flight runs on a goroutine of its own, at most 64 at once. The
// loop runs only while some lease is kept, so an idle Renewer holds no
// goroutine. The zero Renewer is ready to use; it is safe for concurrent
// use.
type Renewer struct {
	own bool // owned by one Keeper, made by Keep

	mu       sync.Mutex
	queue    keeperQueue
	wake     chan struct{}
	loopDone chan struct{} // closed when the running loop exits; nil when none runs
	slots    chan struct{} // bounds renewals in flight
}

// Keep starts keeping lease: renewing it (and the slots of [KeepSlots]) every
// [KeepInterval] until the lease is lost, the keeper is stopped, or ctx
// ends. The keeper's options default to those lease was acquired with, so
// hooks and logger given to Acquire apply here too.
//
// ctx bounds the keeper, not a single call: when it ends, the keeper stops
// with an error matching [ErrKeeperStopped] that wraps ctx's cause, and the
// work context is cancelled — never silently. Its values reach every
// renewal. Pass a context that lives as long as the run, not a request's.
//
// Keep fails with [ErrInvalidArgument] for bad options, and with the lease's
// [*LeaseLostError] when it is already lost. When the lease's trust window
// has already run out (it was acquired or last renewed more than TTL -
// margin ago), the keeper ends at once with [ErrTrustExpired]: renew the
// lease first.
func (r *Renewer) Keep(ctx context.Context, lease *Lease, opts ...Option) (*Keeper, error) {
	if lease == nil {
		return nil, invalidArg("lease", "nil")
	}
	o := lease.o
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validateKeep(); err != nil {
		return nil, err
	}
	trustFrom, lost := lease.state()
	if lost != nil {
		return nil, lost
	}
	k := &Keeper{r: r, lease: lease, slots: o.slots, o: o, parent: ctx, index: -1}
	k.trustEnd = trustFrom.Add(o.ttl - o.margin)
	k.renewAt = trustFrom.Add(o.interval)
	k.next = earliest(k.renewAt, k.trustEnd)

	unwatch := func() bool { return false }
	if ctx.Done() != nil { // a context that can end: stop with it
		unwatch = context.AfterFunc(ctx, func() {
			r.end(k, errors.Join(ErrKeeperStopped, context.Cause(ctx)))
		})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if k.err == nil { // ctx may have ended already
		k.unwatch = unwatch
		r.push(k)
	}
	return k, nil
}

// Close stops every keeper of the Renewer, as Stop does, and returns once
// its loop has exited. Leases are not released.
func (r *Renewer) Close() {
	r.mu.Lock()
	keepers := append([]*Keeper(nil), r.queue...)
	r.mu.Unlock()
	for _, k := range keepers {
		k.Stop()
	}
	r.waitIdle()
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// push queues k and makes sure the loop runs and sees it. r.mu is held.
func (r *Renewer) push(k *Keeper) {
	heap.Push(&r.queue, k)
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

// waitIdle returns once the loop, if it is running down, has exited.
func (r *Renewer) waitIdle() {
	r.mu.Lock()
	done := r.loopDone
	idle := len(r.queue) == 0
	r.mu.Unlock()
	if idle && done != nil {
		<-done
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
		if len(r.queue) == 0 {
			r.loopDone = nil
			r.mu.Unlock()
			return
		}
		now := time.Now()
		if wait := r.queue[0].next.Sub(now); wait > 0 {
			r.mu.Unlock()
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-wake:
			}
			continue
		}
		reports := r.dispatchDue(now)
		r.mu.Unlock()
		for _, report := range reports {
			report()
		}
	}
}

// dispatchDue handles every keeper whose time has come: it ends those whose
// trust window ran out and starts renewals for the others, batched per store
// where the store can. r.mu is held; the returned funcs run after unlocking.
func (r *Renewer) dispatchDue(now time.Time) []func() {
	var reports []func()
	var due []*Keeper
	for len(r.queue) > 0 && !r.queue[0].next.After(now) {
		k := r.queue[0]
		if !now.Before(k.trustEnd) {
			reports = append(reports, r.endLocked(k, k.trustExpired()))
			continue
		}
		k.next = k.trustEnd // wake for the deadline even if the renewal hangs
		heap.Fix(&r.queue, 0)
		if k.flying == nil {
			due = append(due, k)
		}
	}
	if r.slots == nil {
		r.slots = make(chan struct{}, maxInFlight)
	}
	for _, group := range groupByStore(due) {
		flying := make(chan struct{})
		deadline := group[0].trustEnd
		for _, k := range group {
			k.flying = flying
			deadline = earliest(deadline, k.trustEnd)
		}
		if len(group) == 1 {
			go r.renew(group[0], flying, deadline)
		} else {
			go r.renewGroup(group, flying, deadline)
		}
	}
	return reports
}

// renew runs one renewal of k and schedules the next. deadline is the trust
// window's end: a renewal still running then is of no use.
func (r *Renewer) renew(k *Keeper, flying chan struct{}, deadline time.Time) {
	defer close(flying)
	r.slots <- struct{}{}
	defer func() { <-r.slots }()

	ctx, cancel := context.WithDeadline(context.WithoutCancel(k.parent), deadline)
	defer cancel()
	r.mu.Lock()
	if k.err != nil { // stopped before the renewal began
		r.mu.Unlock()
		return
	}
	k.abort = cancel
	r.mu.Unlock()
	start := time.Now()
	err := k.lease.Renew(ctx)
	r.finish(ctx, k, start, time.Since(start), err)
}

// finish reports a renewal of k that started at start and schedules what
// comes next: the next renewal, a retry, or the end.
func (r *Renewer) finish(ctx context.Context, k *Keeper, start time.Time, latency time.Duration, err error) {
	if err == nil && k.slots != nil {
		k.renewSlots(ctx)
	}
	r.mu.Lock()
	timeLeft := k.trustEnd.Sub(start)
	r.mu.Unlock()
	if h := k.o.hooks.Renewed; h != nil {
		h(RenewEvent{RunID: k.lease.runID, Fence: k.lease.fence, Latency: latency, TimeLeft: timeLeft, Err: err})
	}

	r.mu.Lock()
	k.flying, k.abort = nil, nil
	if k.err != nil { // ended while the renewal ran
		r.mu.Unlock()
		return
	}
	var report func()
	switch {
	case err == nil:
		trustFrom, _ := k.lease.state()
		k.trustEnd = trustFrom.Add(k.o.ttl - k.o.margin)
		k.renewAt = trustFrom.Add(k.o.interval)
		k.backoff, k.lastErr = 0, nil
	case errors.Is(err, ErrLeaseLost):
		report = r.endLocked(k, err)
	default:
		k.lastErr = err
		k.renewAt = time.Now().Add(k.nextBackoff())
		k.o.logger.Debug("runlease: renewal failed; retrying", "run", k.lease.runID, "err", err,
			"retry_in", time.Until(k.renewAt), "trust_left", time.Until(k.trustEnd))
	}
	if report == nil {
		k.next = earliest(k.renewAt, k.trustEnd)
		heap.Fix(&r.queue, k.index)
		r.poke()
	}
	r.mu.Unlock()
	if report != nil {
		report()
	}
}

// renewSlots renews the kept slots and reports any lost.
func (k *Keeper) renewSlots(ctx context.Context) {
	err := k.slots.Renew(ctx)
	var lost *SlotLostError
	if errors.As(err, &lost) {
		k.o.logger.Warn("runlease: slots lost", "run", k.lease.runID, "keys", lost.Keys)
		if h := k.o.hooks.SlotsLost; h != nil {
			h(SlotLossEvent{RunID: k.lease.runID, Err: lost})
		}
	} else if err != nil {
		k.o.logger.Debug("runlease: slot renewal failed", "run", k.lease.runID, "err", err)
	}
}

// end ends k with err unless it has ended already.
func (r *Renewer) end(k *Keeper, err error) {
	r.mu.Lock()
	report := r.endLocked(k, err)
	r.mu.Unlock()
	report()
}

// endLocked ends k: out of the queue, work context cancelled, Done closed.
// r.mu is held; the returned func reports the end and runs after unlocking,
// so hooks and loggers never run under the lock.
func (r *Renewer) endLocked(k *Keeper, err error) func() {
	if k.err != nil {
		return func() {}
	}
	k.err = err
	if k.index >= 0 {
		heap.Remove(&r.queue, k.index)
		r.poke()
	}
	if k.abort != nil {
		k.abort()
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
	return func() {
		if unwatch != nil {
			unwatch()
		}
		if !errors.Is(err, ErrLeaseLost) {
			return
		}
		k.o.logger.Warn("runlease: lease lost; stop advancing the run", "run", k.lease.runID, "err", err)
		if h := k.o.hooks.Lost; h != nil {
			h(LossEvent{RunID: k.lease.runID, Fence: k.lease.fence, Err: err})
		}
	}
}

// keeperQueue is a min-heap of keepers by next.
type keeperQueue []*Keeper

func (q keeperQueue) Len() int           { return len(q) }
func (q keeperQueue) Less(i, j int) bool { return q[i].next.Before(q[j].next) }
func (q keeperQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *keeperQueue) Push(x any) {
	k := x.(*Keeper)
	k.index = len(*q)
	*q = append(*q, k)
}
func (q *keeperQueue) Pop() any {
	old := *q
	k := old[len(old)-1]
	old[len(old)-1] = nil
	k.index = -1
	*q = old[:len(old)-1]
	return k
}
