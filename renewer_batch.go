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
// batch takes no write token here: it takes them once it has a place among
// the renewals in flight (runBatch). r.mu is held.
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
			if _, twice := batched[bk]; !twice {
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
	var ks *keptSlots // read here, under r.mu, for the job's goroutine
	if slots {
		ks = k.ks
		ks.job = j
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
			err = k.lease.renewUnlessRenewed(ctx, st.trustFrom, r)
			if slots && err == nil {
				slotErr = ks.slots.renewKept(ctx)
			}
			<-r.sem
		}
		if slots {
			r.finishSlots(k, j, slotErr)
		}
		r.finishLease(k, j, start, err)
	}()
}

// batchMember is one lease of a batched renewal.
type batchMember struct {
	k        *Keeper
	j        *job      // its keeper's job: a member of the batch
	trustEnd time.Time // its keeper's trust window end, as the look found it
	observed time.Time // the lease's trustFrom then: a write landed since renewed it
	locked   bool      // the batch holds the lease's write token
}

// startBatchLocked starts renewing the leases of group in one call. The call
// is bounded by the earliest trust window of the group, and cut short once
// every keeper of the group has ended. r.mu is held.
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
	members := make([]batchMember, len(group))
	for i, dl := range group {
		backing[i] = job{batch: b, timeLeft: dl.trustEnd.Sub(now)}
		dl.k.leaseJob = &backing[i]
		members[i] = batchMember{k: dl.k, j: &backing[i], trustEnd: dl.trustEnd, observed: dl.k.lease.state().trustFrom}
	}
	// With a place in flight free, the batch takes it and its tokens now,
	// before the leases renewed alone in this pass start: a second keeper
	// of a member's lease then finds it renewed, rather than racing the
	// batch for the token and leaving the member to renew alone.
	placed := false
	select {
	case r.sem <- struct{}{}:
		placed = true
		lockMembers(members)
	default:
	}
	r.jobs.Add(1)
	go func() {
		defer r.jobs.Done()
		r.runBatch(ctx, m, b, members, placed)
	}()
}

// lockMembers takes the write token of each member's lease that is free,
// without waiting.
func lockMembers(members []batchMember) {
	for i := range members {
		members[i].locked = members[i].k.lease.tryLock()
	}
}

// runBatch renews the leases of members, batch b, in one call on ctx; when
// placed, the batch holds its place in flight and the tokens of members
// locked already.
//
// It takes its place among the renewals in flight before it takes any
// lease's write token, so a batch waiting for a place holds no lease: a
// Release or a fenced Write of a member goes ahead meanwhile. Each member's
// token is given back, and its outcome recorded (its keeper rescheduled, its
// trust window moved on), as soon as the batched call's reply tells it. A
// member the batch cannot settle (its token was busy, or the store refused
// its write) renews alone, each on a goroutine of its own bounded by its own
// keeper's trust window, so that one member's hung read-back or write holds
// up no other member.
func (r *Renewer) runBatch(ctx context.Context, m MultiCASer, b *batchJob, members []batchMember, placed bool) {
	start := time.Now()
	errs := make([]error, len(members))
	var alone []bool
	var err error
	if !placed {
		if err = r.takeSem(ctx); err == nil {
			lockMembers(members)
		}
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	} else {
		alone = renewMany(ctx, m, members, errs, r)
		<-r.sem
	}
	b.cancel()
	r.mu.Lock()
	delete(r.batches, b)
	r.mu.Unlock()
	keepers := make([]*Keeper, 0, len(members))
	jobs := make([]*job, 0, len(members))
	settled := make([]error, 0, len(members))
	for i, mb := range members {
		if alone != nil && alone[i] {
			r.renewAlone(mb, start)
			continue
		}
		keepers, jobs, settled = append(keepers, mb.k), append(jobs, mb.j), append(settled, errs[i])
	}
	r.finishLeases(keepers, jobs, start, settled)
}

// renewAlone renews the lease of mb, a member of a batch that could not
// settle it, as a lease renewed alone is: on a goroutine of its own, which
// takes a place in flight, then the lease's write token, then renews it
// unless a write landed since the batch was planned. It waits for each no
// longer than its keeper's trust window, and is cut short when its keeper
// ends.
func (r *Renewer) renewAlone(mb batchMember, start time.Time) {
	ctx, cancel := context.WithDeadline(context.WithoutCancel(mb.k.parent), mb.trustEnd)
	r.mu.Lock()
	mb.j.cancel = cancel
	if mb.j.detached {
		cancel() // its keeper ended meanwhile
	}
	r.mu.Unlock()
	r.jobs.Add(1) // the batch's goroutine is counted: r.jobs is not zero
	go func() {
		defer r.jobs.Done()
		defer cancel()
		err := r.takeSem(ctx)
		if err == nil {
			err = mb.k.lease.renewUnlessRenewed(ctx, mb.observed, r)
			<-r.sem
		}
		r.finishLease(mb.k, mb.j, start, err)
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
//
// A keeper whose renewal nobody waits for (a batch's member) is
// rescheduled before any hook runs: a hook may take long (it may call its
// lease, whose store may hang), and one keeper's hook must not hold up the
// next renewal of another keeper of the batch (CONCURRENCY.md, rule 2). A
// renewal of its own is finished after its keeper's hook, so that Stop,
// which waits for it, returns only once its hook has run.
func (r *Renewer) finishLeases(keepers []*Keeper, jobs []*job, start time.Time, errs []error) {
	running := make([]bool, len(keepers))
	var reports []func()
	r.mu.Lock()
	for i, k := range keepers {
		// The hook hears of every attempt of a running keeper, the one
		// that found the lease lost included: that call ended the keeper
		// (Lease.lose) before returning here.
		running[i] = k.err == nil || errors.Is(errs[i], ErrLeaseLost) && errors.Is(k.err, ErrLeaseLost)
		if jobs[i].done == nil {
			reports = r.settleLocked(k, jobs[i], errs[i], reports)
		}
	}
	r.mu.Unlock()
	for i, k := range keepers {
		if !running[i] {
			continue
		}
		err := errs[i]
		if h := hooksOr(k.o.hooks).Renewed; h != nil {
			ev := RenewEvent{RunID: k.lease.RunID(), Fence: k.lease.fence, Latency: time.Since(start), TimeLeft: jobs[i].timeLeft, Err: err}
			r.runHook(k, func() { h(ev) })
		}
		if err != nil && !errors.Is(err, ErrLeaseLost) {
			k.o.logger.Debug("runlease: renewal failed; retrying", "run", k.lease.RunID(), "err", err)
		}
	}
	r.mu.Lock()
	for i, k := range keepers {
		if jobs[i].done != nil {
			reports = r.settleLocked(k, jobs[i], errs[i], reports)
		}
	}
	r.mu.Unlock()
	for _, report := range reports {
		report()
	}
}

// settleLocked records that k's lease renewal j ended with err, and
// schedules what comes next: the next renewal, a retry, or the end, whose
// report it appends to reports. r.mu is held.
func (r *Renewer) settleLocked(k *Keeper, j *job, err error, reports []func()) []func() {
	if k.leaseJob == j {
		k.leaseJob = nil
		if k.ks != nil && k.ks.job == j {
			k.ks.job = nil // its slots, renewed right after it (finishSlots)
		}
	}
	if k.err != nil {
		return reports
	}
	switch {
	case err == nil:
		k.leaseWait, k.lastErr = retry{}, nil
	case errors.Is(err, ErrLeaseLost):
		reports = append(reports, r.endLocked(k, err))
	default:
		k.lastErr = err
		k.leaseWait.after(time.Now(), k.o.interval)
	}
	r.rescheduleLocked(k)
	return reports
}

// startSlotsLocked starts renewing k's slots. r.mu is held.
func (r *Renewer) startSlotsLocked(k *Keeper, now time.Time) {
	ks := k.ks // read here, under r.mu, for the job's goroutine
	_, trustEnd, _ := ks.slots.keptState(now)
	ctx, cancel := context.WithDeadline(context.WithoutCancel(k.parent), trustEnd)
	j := &job{cancel: cancel, done: make(chan struct{})}
	ks.job = j
	r.jobs.Add(1)
	go func() {
		defer r.jobs.Done()
		defer close(j.done)
		defer cancel()
		err := r.takeSem(ctx)
		if err == nil {
			err = ks.slots.renewKept(ctx)
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
	// Slots renewed in the job of their lease (startLeaseLocked) stay in
	// flight until the lease's outcome is settled too (settleLocked): a
	// look at k in between would find its lease in flight and its slots
	// due, and renew them again at once, alone, out of step with the
	// lease.
	if k.ks.job == j && k.leaseJob != j {
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
// the lease, or a fenced Write, renewed it meanwhile. It runs on a
// goroutine of Renewer host.
func (l *Lease) renewUnlessRenewed(ctx context.Context, observed time.Time, host *Renewer) error {
	if err := l.lock(ctx); err != nil {
		return err
	}
	defer l.unlockOn(host)
	if st := l.state(); st.lost == nil && !st.trustFrom.Equal(observed) {
		return nil
	}
	return l.updateLocked(ctx, kindRenew, nil)
}

// renewMany renews the leases of members, which share store m and are
// distinct, in one MetaCASMany call on ctx, and puts each lease's outcome in
// errs. It gives each token the batch holds back as soon as that lease's
// outcome is known, before it looks at the next member's. It returns, by
// member, those it left to renew alone: a lease whose token the batch could
// not take (a write of it was in flight), and a lease whose write
// the store refused, which must be resolved by reads and writes of that
// lease alone (Renew would read the row back, and adopt a row of its own). A
// lease a write renewed since the batch was planned is renewed already; a
// fault of the whole call leaves every lease as it was, and its next write
// finds out what landed. It runs on a goroutine of Renewer host.
func renewMany(ctx context.Context, m MultiCASer, members []batchMember, errs []error, host *Renewer) (alone []bool) {
	type pending struct {
		seen, next string
		untilMS    int64
	}
	alone = make([]bool, len(members))
	pend := make([]pending, len(members))
	writes := make([]CASWrite, 0, len(members))
	index := make([]int, 0, len(members))
	// One start for the whole attempt, taken before any row is stamped:
	// the leases of a batch then share their trust windows, and so their
	// places in the Renewer's schedule (renewer_schedule.go).
	start := time.Now()
	for i, mb := range members {
		l := mb.k.lease
		if !mb.locked {
			// Never wait for a token while holding others (CONCURRENCY.md,
			// rule 3).
			alone[i] = true
			continue
		}
		l.mu.Lock()
		switch {
		case l.lost != nil:
			errs[i] = l.lost
		case !l.trustFrom.Equal(mb.observed):
			// Renewed since the batch was planned (a fenced Write, or
			// another keeper of the lease).
		default:
			pend[i].seen = l.seen
			pend[i].next, pend[i].untilMS = l.nextRowLocked(kindRenew)
			l.mu.Unlock()
			writes = append(writes, CASWrite{Key: l.key, Expected: &pend[i].seen, Value: pend[i].next})
			index = append(index, i)
			continue
		}
		l.mu.Unlock()
		l.unlockOn(host)
	}
	if len(writes) == 0 {
		return alone
	}
	swapped, err := m.MetaCASMany(ctx, writes)
	for j, i := range index {
		l, p := members[i].k.lease, pend[i]
		switch {
		case err != nil:
			if IsOutcomeUnknown(err) {
				l.inDoubt(*writes[j].Expected, p.untilMS)
			}
			errs[i] = l.fault(ctx, err)
		case swapped[j]:
			l.confirm(kindRenew, p.next, p.untilMS, start)
		default:
			// Refused, certainly not applied: the row is not the one the
			// lease last saw. Nothing is in doubt, so the token may go
			// back before the lease finds out why.
			alone[i] = true
		}
		l.unlockOn(host)
	}
	return alone
}
