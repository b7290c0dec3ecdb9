package runlease

import (
	"context"
	"errors"
	"slices"
	"time"
)

// maxRenewBatch is the most leases one batched renewal carries.
const maxRenewBatch = 512

// dispatchLocked starts the renewals that are due: the leases of one store
// that can renew many at once ([MultiCASer]) together, in chunks of up to
// maxRenewBatch, and every other lease, and every set of slots, alone. A
// batch takes each lease's write token without waiting, under r.mu: a lease
// with a write in flight (a fenced Write, say) renews alone, on a goroutine
// that waits for the token, so no batch ever waits for a token while
// holding another. r.mu is held.
func (r *Renewer) dispatchLocked(now time.Time, d *dueRenewals) {
	if r.sem == nil {
		r.sem = make(chan struct{}, maxInFlight)
		r.batches = map[*batchJob]struct{}{}
	}
	var singles []*Keeper
	var stores []Store
	groups := map[Store][]dueLease{}
	// A batch writes each key once (MultiCASer refuses two writes of one
	// key): a second Lease of a run, a re-entry's, goes alone.
	type batchedKey struct {
		store Store
		key   string
	}
	batched := make(map[batchedKey]struct{}, len(d.lease))
	for _, dl := range d.lease {
		k := dl.k
		s := k.lease.store
		bk := batchedKey{s, k.lease.key}
		if _, ok := s.(MultiCASer); ok && keyable(s) {
			if _, twice := batched[bk]; !twice && k.lease.tryLock() {
				if groups[s] == nil {
					stores = append(stores, s)
				}
				groups[s] = append(groups[s], dl)
				batched[bk] = struct{}{}
				continue
			}
		}
		singles = append(singles, k)
	}
	for _, s := range stores {
		group := groups[s]
		for len(group) > 0 {
			chunk := group[:min(len(group), maxRenewBatch)]
			group = group[len(chunk):]
			if len(chunk) == 1 {
				chunk[0].k.lease.unlock()
				singles = append(singles, chunk[0].k)
				continue
			}
			r.startBatchLocked(s.(MultiCASer), chunk, now)
		}
	}
	for _, k := range singles {
		r.startLeaseLocked(k, now, slices.Contains(d.chained, k))
	}
	for _, k := range d.chained {
		if k.ks.job == nil { // its lease went into a batch: renew the slots alone
			r.startSlotsLocked(k, now)
		}
	}
	for _, k := range d.slots {
		r.startSlotsLocked(k, now)
	}
}

// startLeaseLocked starts renewing k's lease alone, and with slots its
// slots right after, in the same job. r.mu is held.
func (r *Renewer) startLeaseLocked(k *Keeper, now time.Time, slots bool) {
	st := k.lease.state()
	deadline := k.trustEnd(st, now)
	ctx, cancel := context.WithDeadline(context.WithoutCancel(k.parent), deadline)
	j := &job{cancel: cancel, done: make(chan struct{}), timeLeft: deadline.Sub(now)}
	k.leaseJob = j
	if slots {
		k.ks.job = j
	}
	r.jobs.Add(1)
	go func() {
		defer r.jobs.Done()
		defer close(j.done)
		defer cancel()
		start := time.Now()
		err := r.takeSem(ctx)
		var slotErr error
		if err == nil {
			err = k.lease.renewUnlessRenewed(ctx, st.trustFrom)
			if slots && err == nil {
				slotErr = k.ks.slots.renewKept(ctx)
			}
			<-r.sem
		}
		if slots {
			r.finishSlots(k, j, slotErr)
		}
		r.finishLease(k, j, start, err)
	}()
}

// startBatchLocked starts renewing the leases of group, whose write tokens
// it holds, in one call. The call is bounded by the earliest trust window of
// the group, and cut short once every keeper of the group has ended. r.mu is
// held.
func (r *Renewer) startBatchLocked(m MultiCASer, group []dueLease, now time.Time) {
	deadline := now.Add(time.Hour)
	for _, dl := range group {
		deadline = earliest(deadline, dl.trustEnd)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	b := &batchJob{cancel: cancel, live: len(group)}
	r.batches[b] = struct{}{}
	// A batch's jobs have no done channel: nobody waits for one (Stop
	// waits only for a renewal of the keeper's own).
	backing := make([]job, len(group))
	jobs := make([]*job, len(group))
	leases := make([]*Lease, len(group))
	keepers := make([]*Keeper, len(group))
	for i, dl := range group {
		backing[i] = job{batch: b, timeLeft: deadline.Sub(now)}
		jobs[i] = &backing[i]
		dl.k.leaseJob, leases[i], keepers[i] = jobs[i], dl.k.lease, dl.k
	}
	r.jobs.Add(1)
	go func() {
		defer r.jobs.Done()
		start := time.Now()
		var errs []error
		if err := r.takeSem(ctx); err != nil {
			errs = make([]error, len(leases))
			for i, l := range leases {
				l.unlock()
				errs[i] = err
			}
		} else {
			errs = renewMany(ctx, m, leases)
			<-r.sem
		}
		cancel()
		r.mu.Lock()
		delete(r.batches, b)
		r.mu.Unlock()
		r.finishLeases(keepers, jobs, start, errs)
	}()
}

// takeSem takes a place among the renewals in flight, or fails when ctx
// ends first.
func (r *Renewer) takeSem(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &StorageError{Op: "MetaCAS", Err: ctx.Err()}
	}
}

// finishLease records the outcome of a renewal of k's lease, j, that
// started at start: it reports it, and schedules what comes next — the
// next renewal, a retry, or the end.
func (r *Renewer) finishLease(k *Keeper, j *job, start time.Time, err error) {
	r.finishLeases([]*Keeper{k}, []*job{j}, start, []error{err})
}

// finishLeases is finishLease for the keepers of one call, whose renewals
// jobs[i] ended with errs[i]: Renewer.mu is taken twice for all of them,
// not twice for each.
func (r *Renewer) finishLeases(keepers []*Keeper, jobs []*job, start time.Time, errs []error) {
	running := make([]bool, len(keepers))
	r.mu.Lock()
	// The hook hears of every attempt of a running keeper, the one that
	// found the lease lost included: that call ended the keeper (Lease.lose)
	// before returning here.
	for i, k := range keepers {
		running[i] = k.err == nil || errors.Is(errs[i], ErrLeaseLost) && errors.Is(k.err, ErrLeaseLost)
	}
	r.mu.Unlock()
	for i, k := range keepers {
		if !running[i] {
			continue
		}
		err := errs[i]
		if h := hooksOr(k.o.hooks).Renewed; h != nil {
			h(RenewEvent{RunID: k.lease.RunID(), Fence: k.lease.fence, Latency: time.Since(start), TimeLeft: jobs[i].timeLeft, Err: err})
		}
		if err != nil && !errors.Is(err, ErrLeaseLost) {
			k.o.logger.Debug("runlease: renewal failed; retrying", "run", k.lease.RunID(), "err", err)
		}
	}
	var reports []func()
	r.mu.Lock()
	for i, k := range keepers {
		if k.leaseJob == jobs[i] {
			k.leaseJob = nil
		}
		if k.err != nil {
			continue
		}
		switch err := errs[i]; {
		case err == nil:
			k.leaseWait, k.lastErr = retry{}, nil
		case errors.Is(err, ErrLeaseLost):
			reports = append(reports, r.endLocked(k, err))
		default:
			k.lastErr = err
			k.leaseWait.after(time.Now(), k.o.interval)
		}
		r.rescheduleLocked(k)
	}
	r.mu.Unlock()
	for _, report := range reports {
		report()
	}
}

// startSlotsLocked starts renewing k's slots. r.mu is held.
func (r *Renewer) startSlotsLocked(k *Keeper, now time.Time) {
	_, trustEnd, _ := k.ks.slots.keptState(now)
	ctx, cancel := context.WithDeadline(context.WithoutCancel(k.parent), trustEnd)
	j := &job{cancel: cancel, done: make(chan struct{})}
	k.ks.job = j
	r.jobs.Add(1)
	go func() {
		defer r.jobs.Done()
		defer close(j.done)
		defer cancel()
		err := r.takeSem(ctx)
		if err == nil {
			err = k.ks.slots.renewKept(ctx)
			<-r.sem
		}
		r.finishSlots(k, j, err)
	}()
}

// finishSlots records the outcome of a renewal of k's slots in job j:
// a retry after a fault, the schedule after a success.
func (r *Renewer) finishSlots(k *Keeper, j *job, err error) {
	if err != nil {
		k.o.logger.Debug("runlease: slot renewal failed; retrying", "run", k.lease.RunID(), "err", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if k.ks.job == j {
		k.ks.job = nil
	}
	if k.err == nil {
		if err != nil {
			k.ks.wait.after(time.Now(), k.o.interval)
		} else {
			k.ks.wait = retry{}
		}
		r.rescheduleLocked(k)
	}
}

// rescheduleLocked makes the loop look at k at once. r.mu is held.
func (r *Renewer) rescheduleLocked(k *Keeper) {
	if k.bucket == nil {
		return
	}
	r.queue.moveSoon(k)
	r.poke()
}

// renewUnlessRenewed renews the lease unless a write of it has landed since
// the renewal was planned (trustFrom was observed then): another keeper of
// the lease, or a fenced Write, renewed it meanwhile.
func (l *Lease) renewUnlessRenewed(ctx context.Context, observed time.Time) error {
	if err := l.lock(ctx); err != nil {
		return err
	}
	defer l.unlock()
	if st := l.state(); st.lost == nil && !st.trustFrom.Equal(observed) {
		return nil
	}
	return l.updateLocked(ctx, kindRenew, nil)
}

// renewMany renews leases, which share store m, are distinct, and whose
// write tokens the caller holds, in one MetaCASMany call, and returns each
// lease's outcome. It gives every token back. A lease whose write did not
// apply is resolved on its own, as Renew would (it reads the row back, and
// adopts a row of its own); a fault of the whole call leaves every lease as
// it was, and its next write finds out what landed.
func renewMany(ctx context.Context, m MultiCASer, leases []*Lease) []error {
	defer func() {
		for _, l := range leases {
			l.unlock()
		}
	}()
	type pending struct {
		seen, next string
		untilMS    int64
	}
	errs := make([]error, len(leases))
	pend := make([]pending, len(leases))
	writes := make([]CASWrite, 0, len(leases))
	index := make([]int, 0, len(leases))
	// One start for the whole attempt, taken before any row is stamped:
	// the leases of a batch then share their trust windows, and so their
	// places in the Renewer's schedule (renewer_schedule.go).
	start := time.Now()
	for i, l := range leases {
		l.mu.Lock()
		if l.lost != nil {
			errs[i] = l.lost
			l.mu.Unlock()
			continue
		}
		pend[i].seen = l.seen
		pend[i].next, pend[i].untilMS = l.nextRowLocked(kindRenew)
		l.mu.Unlock()
		writes = append(writes, CASWrite{Key: l.key, Expected: &pend[i].seen, Value: pend[i].next})
		index = append(index, i)
	}
	if len(writes) == 0 {
		return errs
	}
	swapped, err := m.MetaCASMany(ctx, writes)
	for j, i := range index {
		l, p := leases[i], pend[i]
		switch {
		case err != nil:
			if IsOutcomeUnknown(err) {
				l.inDoubt(*writes[j].Expected, p.untilMS)
			}
			errs[i] = l.fault(ctx, err)
		case swapped[j]:
			l.confirm(kindRenew, p.next, p.untilMS, start)
		default:
			errs[i] = l.updateLocked(ctx, kindRenew, nil)
		}
	}
	return errs
}
