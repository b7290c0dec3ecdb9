package runlease

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"time"
)

// ClaimSlots claims one slot in each scope for runID, all or nothing, or
// fails with a [*ConcurrencyLimitError] (matching [ErrConcurrencyLimit])
// naming the first scope whose slots are all held. A run refused in any scope
// holds no slot afterwards.
//
// The limit holds under races because slot k of a scope is one row taken by
// compare-and-swap: never count-then-acquire. A slot row belongs to the one
// claim that wrote it: a live row of the same run (an earlier claim, still
// kept or abandoned, or a crashed driver's) is held like any other run's,
// never re-used, so two Slots never trust one row and one's Release never
// frees a slot the other still trusts. A claim whose scope has no room
// beside such rows is refused until they are released or expire. A slot
// whose holder stopped renewing is free again once its TTL has passed. Each
// scope costs one scan and, uncontended, one write, whatever its limit.
//
// When every scope has a free slot but a later scope's slot is taken by a
// racing claimant after an earlier scope's was written, the earlier slots are
// put back as they were before ClaimSlots returns. A slot row that does not
// parse is never overwritten: it counts as one slot in use, and the claim
// takes the others as usual. A queue entry or fair-share mark that does not
// parse holds no place and is never overwritten either (see
// [ClaimSlotsWait]).
// Invalid arguments fail with [ErrInvalidArgument] before anything is
// written; the options are the TTL and the clock, as for [Acquire]. Claim
// slots after acquiring the run's lease, with the same TTL, so that a
// [Keeper] keeping both never trusts the lease longer than the slots.
//
// [Lease.ClaimSlots] claims them through the run's lease, which rules out
// those mismatches and fences the claim by the lease; prefer it. This
// function is not fenced: a driver whose lease was taken over without its
// knowing can still claim free slots for the run beside those its successor
// holds (it never writes over them, nor frees them on its release).
func ClaimSlots(ctx context.Context, store Store, runID string, scopes []Scope, opts ...Option) (*Slots, error) {
	o, err := buildOptions(store, opts, optsClaim, "ClaimSlots")
	if err != nil {
		return nil, err
	}
	if err := checkName("runID", runID, maxHolderLen); err != nil {
		return nil, err
	}
	return claimSlots(ctx, store, runID, scopes, o)
}

// ClaimSlots claims one slot in each scope for the lease's run, all or
// nothing, as the package's [ClaimSlots] does, on the lease's store and with
// its TTL, clock, hooks and logger: the slots cannot outlive the lease
// because of a forgotten [WithTTL] (a crashed driver's slots free when its
// lease does), nor be judged by another clock, and [KeepSlots] takes them.
// A lease that is lost or being released claims nothing and returns its
// loss. On a store that implements [Batcher] (every built-in store does),
// the claim is fenced like [Lease.Write]: it lands in one atomic batch with
// a renewal of the lease, only if the lease row is still the one this lease
// wrote, so a driver whose lease was taken over without its knowing claims
// nothing and gets its [*LeaseLostError] (an unfenced claim by such a driver
// would take slots for a run it no longer drives).
// Such a claim takes at most MaxBatch-1 scopes, refused with
// [ErrInvalidArgument] before anything is read.
//
//	slots, err := lease.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(8)})
//	if errors.Is(err, runlease.ErrConcurrencyLimit) {
//		// every slot is held: release the lease, or wait and try again
//	}
//	keeper, err := runlease.Keep(ctx, lease, runlease.KeepSlots(slots))
//
// It takes [WithPriority] and [WithFairShare], which say where the claim
// ranks among the scopes' waiters ([ClaimSlotsWait]): it is refused while
// waiters ranked ahead of it would not fit beside it.
func (l *Lease) ClaimSlots(ctx context.Context, scopes []Scope, opts ...Option) (*Slots, error) {
	o, err := l.claimStart(opts, optsRank, "Lease.ClaimSlots")
	if err != nil {
		return nil, err
	}
	if _, ok := l.store.(Batcher); ok && len(scopes) > 0 {
		return l.claimFenced(ctx, scopes, o)
	}
	return claimSlots(ctx, l.store, l.RunID(), scopes, o)
}

// claimStart returns the lease's options for a claim of slots, with those
// of opts that fn takes (allowed) in place of the lease's own, or the
// lease's loss: a lease that is lost or being released claims nothing.
func (l *Lease) claimStart(opts []Option, allowed optionSet, fn string) (options, error) {
	var given options
	for _, opt := range opts {
		if opt != nil {
			opt(&given)
		}
	}
	if err := given.refuseOutside(allowed, fn); err != nil {
		return options{}, err
	}
	o := l.o.options(l.optSet)
	o.set = o.set&(optsClaim&^optsRank) | given.set
	o.priority, o.principal, o.weight = given.priority, given.principal, given.weight
	if given.set&optPoll != 0 {
		o.poll = given.poll
	}
	if err := o.checkRank(); err != nil {
		return options{}, err
	}
	l.mu.Lock()
	lost, releasing := l.lost, l.releasing
	l.mu.Unlock()
	switch {
	case lost != nil:
		return options{}, lost
	case releasing:
		return options{}, l.errReleasing()
	}
	return o, nil
}

// claimFenced claims the slots in one atomic batch with a renewal of the
// lease, conditional on the lease row as this lease last saw it: a lease
// that was taken over, even one that does not know it yet, claims nothing.
// Without the fence a superseded driver of the run would take slots for a
// run it no longer drives, beside those its successor holds.
// The lease's unknown outcomes and losses are resolved as for a fenced
// write ([Lease.Write]); a slot taken between the scan and the write makes
// the claim scan again, as an unfenced claim does.
func (l *Lease) claimFenced(ctx context.Context, scopes []Scope, o options) (*Slots, error) {
	if err := checkScopes(scopes); err != nil {
		return nil, err
	}
	if n := claimUnits(scopes); n >= MaxBatch {
		return nil, invalidArg("scopes", "%d units; a claim through a lease takes at most %d (its batch also writes the lease row)", n, MaxBatch-1)
	}
	s := newSlots(l.store, l.RunID(), o)
	for try := 0; ; try++ {
		plans, err := s.planAll(ctx, scopes, nil)
		if err != nil {
			return nil, err
		}
		conds, ops, held := s.claimWrites(scopes, plans)
		err = l.update(ctx, kindWrite, &userBatch{conds: conds, ops: ops})
		switch {
		case err == nil:
			s.held = held
			s.tookOver(held)
			return s, nil
		case IsOutcomeUnknown(err):
			s.gaveUp(held)
			return nil, err
		case errors.Is(err, ErrConditionFailed) && try < claimBatchTries-1:
			// Another claimant took a slot between the scan and the write.
		case errors.Is(err, ErrConditionFailed):
			return nil, &ConcurrencyLimitError{Scope: scopes[0].name, Limit: scopes[0].limit}
		case retryableFault(ctx, err):
			if err := claimBackoff(ctx, try, "MetaBatch"); err != nil {
				return nil, err
			}
		default:
			return nil, err
		}
	}
}

// checkScopes refuses scopes that are invalid or listed twice, and claims
// of more units than one batch writes.
func checkScopes(scopes []Scope) error {
	if n := claimUnits(scopes); n > MaxBatch {
		return invalidArg("scopes", "%d units in all; a claim takes at most %d", n, MaxBatch)
	}
	seen := map[string]bool{}
	for _, sc := range scopes {
		if err := sc.validate(); err != nil {
			return err
		}
		if seen[sc.name] {
			return invalidArg("scopes", "scope %q is listed twice", sc.name)
		}
		seen[sc.name] = true
	}
	return nil
}

// claimSlots is ClaimSlots with its options built and runID checked.
func claimSlots(ctx context.Context, store Store, runID string, scopes []Scope, o options) (*Slots, error) {
	if err := checkScopes(scopes); err != nil {
		return nil, err
	}
	s := newSlots(store, runID, o)
	if len(scopes) == 1 && scopes[0].Units() == 1 {
		if err := s.claimSingle(ctx, scopes[0]); err != nil {
			return nil, err
		}
		return s, nil
	}
	if b, ok := store.(Batcher); ok && len(scopes) > 0 {
		if err := s.claimBatch(ctx, b, scopes); err != nil {
			return nil, err
		}
		return s, nil
	}
	// Read every scope before writing anything, so that a scope at its
	// limit refuses the claim without a single write.
	plans, err := s.planAll(ctx, scopes, nil)
	if err != nil {
		return nil, err
	}
	for i, sc := range scopes {
		for range sc.Units() {
			if err := s.claimOne(ctx, sc, plans[i]); err != nil {
				// Put back with a context of its own: the caller's may be
				// what ended the claim.
				cleanup, cancel := cleanupContext(ctx, takeBackTimeout)
				defer cancel()
				return nil, errors.Join(err, s.rollback(cleanup))
			}
		}
	}
	return s, nil
}

// planAll plans a claim in every scope, ranked at me in their queues (nil:
// a claim that does not wait).
func (s *Slots) planAll(ctx context.Context, scopes []Scope, me *queueEntry) ([][]slotCandidate, error) {
	plans := make([][]slotCandidate, len(scopes))
	for i, sc := range scopes {
		var err error
		if plans[i], err = s.plan(ctx, sc, me); err != nil {
			return nil, err
		}
	}
	return plans, nil
}

// claimRow returns the row a claim of key writes now, its until_ms, and
// the lineage that stamped it. The row carries the claim id, which tells
// it from the rows of every other claim of the run, here or in another
// process; the lineage, the claim's own at key, stamps it above every row
// this claim sent there before (a waiting claim may claim one slot again
// after an admission whose outcome was unknown), so no two of its rows
// are equal either.
func (s *Slots) claimRow(key string) (string, int64, *lineage) {
	lin := lineageOf(s.store, key, s.runID, s.claimID)
	untilMS, _ := lin.stamp(s.o.now(), s.o.ttl, 0)
	return s.row(untilMS), untilMS, lin
}

// claimSingle claims a slot of one scope: a scan, then a conditional write
// per candidate slot until one lands, each all or nothing by itself, so one
// scope needs no batch (whose general form costs a store more than one
// write). When every candidate was taken between the scan and the writes,
// it scans again, as a batched claim does after a lost race, and a fault
// that a retry is expected to clear and that changed nothing is retried
// until ctx ends.
func (s *Slots) claimSingle(ctx context.Context, sc Scope) error {
	for try := 0; ; try++ {
		cands, err := s.plan(ctx, sc, nil)
		if err != nil {
			return err
		}
		err = s.claimOne(ctx, sc, cands)
		var limit *ConcurrencyLimitError
		switch {
		case err == nil:
			return nil
		case retryableFault(ctx, err):
			if err := claimBackoff(ctx, try, "MetaCAS"); err != nil {
				return err
			}
		case errors.As(err, &limit) && try < claimBatchTries-1:
			// Every candidate was taken between the scan and the writes.
		default:
			return err
		}
	}
}

// retryableFault reports whether err is a fault that changed nothing and
// that a retry is expected to clear, with ctx still live: a claim then waits
// (claimBackoff) and reads the scopes again.
func retryableFault(ctx context.Context, err error) bool {
	var se *StorageError
	return errors.As(err, &se) && se.Retryable && !se.Unknown && ctx.Err() == nil
}

// claimBackoff waits before the claim's next try, or returns op's fault
// when ctx ends first.
func claimBackoff(ctx context.Context, try int, op string) error {
	if err := sleepCtx(ctx, jitter(time.Duration(min(try+1, 50))*time.Millisecond)); err != nil {
		return &StorageError{Op: op, Err: err}
	}
	return nil
}

// claimBatchTries bounds how often a batched claim that lost a race to
// another claimant reads the scopes again and retries.
const claimBatchTries = 8

// claimBatch writes one slot of every scope in one atomic batch, conditional
// on each slot still being as the scan found it, so that a claim refused in
// any scope never writes anything, not even briefly. A lost race, or a fault
// that a retry is expected to clear and that changed nothing, reads the
// scopes again and retries (the latter until ctx ends): on a store that
// works, a claim is won or refused.
func (s *Slots) claimBatch(ctx context.Context, b Batcher, scopes []Scope) error {
	for try := 0; ; try++ {
		plans, err := s.planAll(ctx, scopes, nil)
		if err != nil {
			return err
		}
		conds, ops, held := s.claimWrites(scopes, plans)
		ok, err := batchResolved(ctx, b, s.store, conds, ops)
		switch {
		case ok:
			s.held = held
			s.tookOver(held)
			return nil
		case IsOutcomeUnknown(err):
			s.gaveUp(held)
			return err
		case retryableFault(ctx, err):
			if err := claimBackoff(ctx, try, "MetaBatch"); err != nil {
				return err
			}
		case err != nil:
			return err
		case try >= claimBatchTries-1:
			return &ConcurrencyLimitError{Scope: scopes[0].name, Limit: scopes[0].limit}
		}
	}
}

// claimWrites returns the conditions and puts of a batch that claims the
// first candidate slots of every scope, as many as the scope's units, and
// the slots it would hold.
func (s *Slots) claimWrites(scopes []Scope, plans [][]slotCandidate) ([]Cond, []Op, []*heldSlot) {
	n := claimUnits(scopes)
	conds := make([]Cond, 0, n)
	ops := make([]Op, 0, n)
	held := make([]*heldSlot, 0, n)
	start := time.Now()
	for i, sc := range scopes {
		for _, c := range plans[i][:sc.Units()] {
			key := sc.prefix() + strconv.Itoa(c.slot)
			row, untilMS, lin := s.claimRow(key)
			conds, ops = append(conds, Cond{Key: key, Value: c.expected}), append(ops, Put(key, row))
			held = append(held, &heldSlot{scope: sc.name, slot: c.slot, key: key, seen: row,
				untilMS: untilMS, sentMS: untilMS, lin: lin, trustFrom: start, prev: c.expected})
		}
	}
	return conds, ops, held
}

// claimUnits is how many slot rows a claim of scopes writes.
func claimUnits(scopes []Scope) int {
	n := 0
	for _, sc := range scopes {
		n += sc.Units()
	}
	return n
}

// slotCandidate is a slot that a scan found free, and the row to present
// when writing it (nil: absent).
type slotCandidate struct {
	slot     int
	expected *string
}

// takenSlot is a slot row a scan found: the raw row, and whether it is
// free (expired). A row that does not parse is never free.
type takenSlot struct {
	raw  *string
	free bool
}

// claimRank is where a claim that does not wait ranks in a scope's queue:
// where its entry would go if it queued, behind every waiter it ties with.
func (s *Slots) claimRank(sc Scope, st *scopeState) *queueEntry {
	return &queueEntry{Run: s.runID, Principal: s.o.principal, Weight: s.o.weightOr1(),
		Priority: s.o.priority, Units: sc.Units(), EnqMS: math.MaxInt64,
		Tag: rankIn([]*scopeState{st}, s.runID, s.o.principal, s.o.priority)}
}

// plan reads one scope and returns the free slots to try, from slot 0 up.
// It fails when the units the claim asks for, added to those in use (the
// run's own live rows and rows that do not parse included) and those that
// live waiters ranked ahead of me reserve, exceed the limit; me is nil
// for a claim that does not wait, ranked by claimRank. Slots numbered at or
// above the limit (left by a host with a higher limit) count as held, so a
// lowered limit drains.
func (s *Slots) plan(ctx context.Context, sc Scope, me *queueEntry) ([]slotCandidate, error) {
	st, err := readScope(ctx, s.store, sc, s.runID, s.o, false)
	if err != nil {
		return nil, err
	}
	return s.planFrom(sc, st, me)
}

// planFrom is plan on a scope already read.
func (s *Slots) planFrom(sc Scope, st *scopeState, me *queueEntry) ([]slotCandidate, error) {
	if st.above > 0 {
		s.reportLimitMismatch(sc, st.used, st.above)
	}
	if me == nil {
		me = s.claimRank(sc, st)
	}
	units := sc.Units()
	v := judge(st.used, st.queue, me)
	if !v.admits(units, sc.limit) {
		return nil, &ConcurrencyLimitError{Scope: sc.name, Limit: sc.limit, Held: st.used, Ahead: len(v.ahead),
			Reserved: v.reserved, Units: units}
	}
	var out []slotCandidate
	for k := 0; k < sc.limit && len(out) < sc.limit-st.used; k++ {
		t, ok := st.taken[k]
		if !ok {
			out = append(out, slotCandidate{slot: k})
		} else if t.free {
			out = append(out, slotCandidate{slot: k, expected: t.raw})
		}
	}
	if len(out) < units {
		return nil, &ConcurrencyLimitError{Scope: sc.name, Limit: sc.limit, Held: st.used, Units: units}
	}
	// Every claim tries the first free slots. Claims that decide at once
	// then race for the same rows, and all but one are refused and read
	// again: that race is what keeps the queue's order when the read was
	// stale. A claim that tried other rows than one ranked ahead of it,
	// admitted meanwhile, would be admitted beside it over the units a
	// waiter still ahead of both reserves (the simulation's queue-order
	// check finds it in a few hundred schedules of queue-bound).
	return out, nil
}

// reportLimitMismatch tells the hooks and the logger that live slots sit at
// or above this host's limit for the scope: another host claims with a
// higher limit, or the limit was lowered. They are never evicted; the scope
// drains to the lower limit as they are released.
func (s *Slots) reportLimitMismatch(sc Scope, live, above int) {
	if s.o.logger != nil {
		s.o.logger.Warn("runlease: live slots at or above this host's limit; hosts disagree on the limit",
			"scope", sc.name, "limit", sc.limit, "live", live, "above_limit", above)
	}
	if h := hooksOr(s.o.hooks).LimitMismatch; h != nil {
		h(LimitMismatchEvent{Scope: sc.name, Limit: sc.limit, Live: live, AboveLimit: above})
	}
}

// claimOne writes the first candidate slot it can win.
func (s *Slots) claimOne(ctx context.Context, sc Scope, cands []slotCandidate) error {
	for _, c := range cands {
		key := sc.prefix() + strconv.Itoa(c.slot)
		if s.holds(key) {
			continue // won by an earlier unit of this claim
		}
		start := time.Now()
		row, untilMS, lin := s.claimRow(key)
		ok, err := casResolved(ctx, s.store, key, c.expected, row)
		if err != nil {
			if IsOutcomeUnknown(err) {
				rememberOrphan(s.store, s.runID, key, row, untilMS, s.o.nowMS(), lin) // it may land: nobody's
			}
			return err
		}
		if ok {
			h := &heldSlot{scope: sc.name, slot: c.slot, key: key, seen: row,
				untilMS: untilMS, sentMS: untilMS, lin: lin, trustFrom: start, prev: c.expected}
			s.held = append(s.held, h)
			s.tookOver([]*heldSlot{h})
			return nil
		}
		// Another claimant took this slot between the scan and the write.
	}
	return &ConcurrencyLimitError{Scope: sc.name, Limit: sc.limit}
}

// holds reports whether the claim in progress already wrote key.
func (s *Slots) holds(key string) bool {
	for _, h := range s.held {
		if h.key == key {
			return true
		}
	}
	return false
}

// rollback puts the slots written by an unfinished claim back as they were.
// If that fails, the slot is left to expire after its TTL, remembered as a
// row of the run that no Slots trusts (slots_orphans.go). A leftover of
// the run put back is trusted by no Slots either, and is remembered again;
// any other row put back (an expired one, the run's included) is as it
// was, nobody's leftover.
func (s *Slots) rollback(ctx context.Context) error {
	var errs []error
	for _, h := range s.held {
		var err error
		restored := false
		if h.prev == nil {
			_, err = deleteResolved(ctx, s.store, h.key, h.seen)
		} else {
			restored, err = casResolved(ctx, s.store, h.key, &h.seen, *h.prev)
		}
		if err != nil {
			s.gaveUp([]*heldSlot{h})
		}
		if row, derr := decodeRow(deref(h.prev)); restored && derr == nil && h.leftover {
			rememberOrphan(s.store, s.runID, h.key, *h.prev, row.UntilMS, s.o.nowMS(), h.lin)
		}
		errs = append(errs, err)
	}
	s.held = nil
	return errors.Join(errs...)
}

// tookOver forgets, of the rows a claim just wrote over, those the process
// remembered as trusted by no Slots: they are this claim's now.
func (s *Slots) tookOver(held []*heldSlot) {
	for _, h := range held {
		if h.prev != nil {
			h.leftover = forgetOrphan(s.store, s.runID, h.key, *h.prev)
		}
	}
}

// gaveUp remembers the rows of held, which a claim wrote or may have
// written and then gave up, as trusted by no Slots of the process: the row
// last confirmed, and those of its renewals whose outcome is unknown, any
// of which the slot may hold.
func (s *Slots) gaveUp(held []*heldSlot) {
	for _, h := range held {
		s.mu.Lock()
		seen, untilMS, doubt := h.seen, h.untilMS, slices.Clone(h.doubt)
		s.mu.Unlock()
		rememberOrphan(s.store, s.runID, h.key, seen, untilMS, s.o.nowMS(), h.lin)
		for _, d := range doubt {
			rememberOrphan(s.store, s.runID, h.key, s.row(d), d, s.o.nowMS(), h.lin)
		}
	}
}
