package runlease

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// writeKind says what a conditional write of the lease row does.
type writeKind int

const (
	kindRenew   writeKind = iota // extend the row
	kindWrite                    // extend the row and apply the caller's ops
	kindRelease                  // write a released tombstone
)

// maxAdopt bounds how often one call adopts a row of this lease's own that
// it found in place of the row it expected, and tries again. Each adoption
// means an earlier write of this lease landed after all; more in a row than
// this means the store is misbehaving.
const maxAdopt = 4

// Renew extends the lease to now plus its TTL, keeping the fence.
//
// Renew fails with a [*LeaseLostError] (matching [ErrLeaseLost]) once anyone
// else has written the row — taken over after this driver stalled past its
// TTL, or released — and from then on every call fails the same way without
// touching the store: that is the moment the driver must stop advancing the
// run. A storage fault is returned as is and leaves the lease as it was, so
// Renew may be retried. Once [Lease.Release] has been called, Renew fails
// with [ErrReleased] at once, without asking the store, even when that
// release failed and the row is still held. A fault is never reported as a
// loss: when a write's outcome is unknown, or the row is not the one
// expected, Renew reads it back, and a row of this lease's own (this holder
// at this fence: an earlier write whose reply was lost) is adopted and
// written over.
//
// When ctx ends, Renew returns a fault matching ctx's error, or, when ctx is
// a [Keeper]'s work context that ended with the keeper, the keeper's cause.
func (l *Lease) Renew(ctx context.Context) error {
	return l.update(ctx, kindRenew, nil)
}

// Release gives the lease up, so the next driver can start at once rather
// than after the TTL. The row is kept as a released tombstone with the same
// fence, so the next acquisition continues above it, and the lease's
// keepers end with [ErrKeeperStopped] (RUN-E024): stopped, not lost.
//
// Release is conditional on the row this lease last wrote: a driver whose
// lease was taken over leaves the new holder's lease untouched and gets a
// [*LeaseLostError]. Releasing a released lease (by this holder or by an
// operator) does nothing and succeeds.
//
// Release first stops the lease's keepers (with [ErrKeeperStopped]), and from
// then on the lease can only be released: Renew, Write and Keep fail with
// [ErrReleased] at once, without asking the store, even when the release
// itself failed, because a lease being given up must not be trusted while
// the outcome of its release is in doubt. So on a storage fault the row may
// still be held (or, when the fault's outcome is unknown, released), and
// only Release may follow: retry it, or let the row expire after its TTL.
// A retried Release whose earlier attempt landed (its reply was lost)
// succeeds, unless another holder took the run in between: it then finds
// that holder's row, cannot tell that its own release landed before, and
// returns a [*LeaseLostError] ([ErrTakenOver]) although the lease was
// released. Either way the run is no longer this driver's.
func (l *Lease) Release(ctx context.Context) error {
	if l.isReleased() {
		return nil
	}
	// The keepers end before any call can see the lease being released,
	// so that a call failing with ErrReleased finds them ended, as one
	// finding a loss does. A keeper started meanwhile is ended in turn;
	// once none is left, releasing is set under the same lock that Keep
	// registers under, so no other keeper starts.
	for {
		l.mu.Lock()
		keepers := l.keepers
		l.keepers = nil
		if len(keepers) == 0 {
			l.releasing = true
		}
		l.mu.Unlock()
		if len(keepers) == 0 {
			break
		}
		for _, k := range keepers {
			k.r.end(k, ErrKeeperStopped)
		}
	}
	return l.update(ctx, kindRelease, nil)
}

// errReleasing is what a lease being released answers to calls other than
// Release.
func (l *Lease) errReleasing() error {
	return &LeaseLostError{RunID: l.RunID(), Cause: ErrReleased, Fence: l.fence}
}

func (l *Lease) isReleased() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released
}

// update runs one conditional write of the lease row, with the lease's
// write token held for its whole duration.
func (l *Lease) update(ctx context.Context, kind writeKind, extra *userBatch) error {
	if err := l.lock(ctx); err != nil {
		return err
	}
	defer l.unlock()
	return l.updateLocked(ctx, kind, extra)
}

// lock takes the lease's write token, or returns when ctx ends.
func (l *Lease) lock(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return l.ctxError(ctx, nil)
		}
		l.mu.Lock()
		if !l.writing {
			l.writing = true
			l.mu.Unlock()
			return nil
		}
		if l.writeFree == nil {
			l.writeFree = make(chan struct{})
		}
		free := l.writeFree
		l.mu.Unlock()
		select {
		case <-free: // the token was given back: race for it again
		case <-ctx.Done():
			return l.ctxError(ctx, nil)
		}
	}
}

// tryLock takes the write token if no write is in flight.
func (l *Lease) tryLock() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.writing {
		return false
	}
	l.writing = true
	return true
}

// unlock gives the write token back and wakes whoever waits for it, then
// reports the ends of the keepers a loss found by the write ended.
func (l *Lease) unlock() { l.unlockOn(nil) }

// unlockOn is unlock on a goroutine of Renewer host (nil: not a Renewer's).
// The reports may run hooks of keepers of other Renewers, which host
// counts as its own while they run (Renewer.runHookOn), so that a hook's
// Close of host does not wait for the goroutine running it.
func (l *Lease) unlockOn(host *Renewer) {
	l.mu.Lock()
	l.writing = false
	if l.writeFree != nil {
		close(l.writeFree)
		l.writeFree = nil
	}
	ended := l.ended
	l.ended = nil
	l.mu.Unlock()
	for _, report := range ended {
		report(host)
	}
}

// ctxError is the error of a call whose context ended. A context that a
// Keeper cancelled carries the keeper's reason as its cause, and that reason
// is what the caller must see (a retry loop would otherwise spin on a
// "context canceled" fault); fault, when not nil, is the storage error the
// call met, kept reachable because its outcome may be unknown. Any other
// context's end is a fault that changed nothing, matching ctx's error.
func (l *Lease) ctxError(ctx context.Context, fault error) error {
	if err := l.Err(); err != nil {
		return err
	}
	if cause := context.Cause(ctx); errorsIsAny(cause, ErrLeaseLost, ErrKeeperStopped, ErrSlotLost) {
		if fault != nil && IsOutcomeUnknown(fault) {
			return fmt.Errorf("%w (%w)", cause, fault)
		}
		return cause
	}
	if fault != nil {
		return fault
	}
	return &StorageError{Op: "MetaCAS", Key: l.key, Err: ctx.Err()}
}

// fault returns err, a storage fault of a call on ctx, as the caller must
// see it.
func (l *Lease) fault(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return l.ctxError(ctx, err)
	}
	return err
}

// updateLocked is update with the write token held.
func (l *Lease) updateLocked(ctx context.Context, kind writeKind, extra *userBatch) error {
	for adopted := 0; ; adopted++ {
		l.mu.Lock()
		if l.lost != nil {
			err, released := l.lost, l.released
			l.mu.Unlock()
			if kind == kindRelease && released {
				return nil
			}
			return err
		}
		if l.releasing && kind != kindRelease {
			l.mu.Unlock()
			return l.errReleasing()
		}
		seen := l.seen
		start := time.Now()
		next, untilMS := l.nextRowLocked(kind)
		l.mu.Unlock()

		ok, err := l.condWrite(ctx, kind, seen, next, extra)
		if err == nil && ok {
			l.confirm(kind, next, untilMS, start)
			return nil
		}
		if err != nil && !IsOutcomeUnknown(err) {
			return l.fault(ctx, err) // certainly not applied
		}
		if err != nil && kind != kindRelease {
			l.inDoubt(seen, untilMS)
		}
		cur, found, rerr := l.store.MetaGet(ctx, l.key)
		switch {
		case rerr != nil && err != nil:
			return l.fault(ctx, err)
		case rerr != nil:
			return l.fault(ctx, rerr)
		case found && cur == next && err != nil:
			// Landed: no other writer sends these bytes (see lineage.go).
			// Only a write whose outcome is unknown can be found landed:
			// after a refusal, a row equal to next is not this write.
			l.confirm(kind, next, untilMS, start)
			return nil
		case err != nil && found && cur == seen:
			// Not applied yet. It may still land, while the row is seen:
			// the next call then finds it, as a row of this lease's own.
			return l.fault(ctx, err)
		case found && cur == seen && extra != nil && len(extra.conds) > 0:
			// Refused with the lease row as expected: one of the caller's
			// conditions did not hold.
			return ErrConditionFailed
		}
		if !found {
			return l.lose(&LeaseLostError{RunID: l.RunID(), Cause: ErrRowChanged, Err: err})
		}
		row, derr := decodeRow(cur)
		switch {
		case derr == nil && l.ownRow(row) && adopted < maxAdopt:
			// An earlier write of this lease landed after all (its reply
			// was lost). The write just tried expected seen, so it did not
			// land and never will: the row has moved on from seen for good.
			l.adopt(cur)
			continue
		case derr == nil && row.Holder == "" && row.Fence == l.fence:
			// Released at this lease's fence: by this lease (a release whose
			// reply was lost) or by an operator. Releasing again succeeds.
			released := &LeaseLostError{RunID: l.RunID(), Cause: ErrReleased, Fence: l.fence}
			if kind == kindWrite && err != nil {
				released.Err = err // the batch may have landed before the release
			}
			lost := l.lose(released, cur)
			if kind == kindRelease {
				return nil
			}
			return lost
		}
		lost := lostFrom(l.RunID(), row, derr)
		if kind == kindWrite && err != nil {
			// The batch may have landed before the successor's write: the
			// caller's ops are in doubt, never "not written".
			lost.Err = err
		}
		return l.lose(lost)
	}
}

// ownRow reports whether row, found in place of seen, is one this lease
// wrote: the lease's holder at its fence, stamped as one of its writes in
// doubt. Holder and fence alone do not tell: once a row is pruned, the
// run's fences start over, and the same holder's next acquisition writes
// the pair again. A row of this lease's in the store that it does not know
// of is always one of its writes in doubt, and every write of every Lease
// of its holder and run stamps an until_ms of its own (see lineage.go).
func (l *Lease) ownRow(row leaseRow) bool {
	if row.Holder != l.holder || row.Fence != l.fence {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.doubt, row.UntilMS)
}

// inDoubt records that a write over seen, stamped untilMS, has an unknown
// outcome: it may have landed, or land later, even after this Lease is
// gone, so its lineage is pinned until the row has expired (see
// lineage.go). l.mu is released before the pin takes lineages.mu.
func (l *Lease) inDoubt(seen string, untilMS int64) {
	l.mu.Lock()
	if l.seen == seen {
		l.doubt = append(l.doubt, untilMS)
	}
	l.mu.Unlock()
	l.lineage.pin(l.o.now(), untilMS)
}

// adopt makes cur, a row of this lease's own found on reading back, the row
// the next write presents.
func (l *Lease) adopt(cur string) {
	l.mu.Lock()
	l.seen, l.doubt = cur, l.doubt[:0]
	l.mu.Unlock()
}

// nextRowLocked returns the row a write of kind would write now, and its
// until_ms, and records that it was sent. l.mu is held.
func (l *Lease) nextRowLocked(kind writeKind) (string, int64) {
	if kind == kindRelease {
		return leaseRow{Fence: l.fence, UntilMS: l.o.nowMS()}.encode(), 0
	}
	untilMS := l.stamp(l.sentMS)
	l.sentMS = untilMS
	return leaseRow{Holder: l.holder, Fence: l.fence, UntilMS: untilMS}.encode(), untilMS
}

// userBatch is what a fenced write adds to the lease row's write: the
// caller's conditions and ops, values already in their stored form.
type userBatch struct {
	conds []Cond
	ops   []Op
}

// condWrite writes next over seen, with the caller's conditions and ops in
// the same atomic batch for kindWrite, waking the run's waiters for
// kindRelease when the store can.
func (l *Lease) condWrite(ctx context.Context, kind writeKind, seen, next string, extra *userBatch) (bool, error) {
	switch kind {
	case kindRelease:
		if n, ok := l.store.(Notifier); ok {
			return n.MetaCASNotify(ctx, l.key, &seen, next)
		}
	case kindWrite:
		conds := append([]Cond{IfEquals(l.key, seen)}, extra.conds...)
		ops := append([]Op{Put(l.key, next)}, extra.ops...)
		return l.store.(Batcher).MetaBatch(ctx, conds, ops)
	}
	return l.store.MetaCAS(ctx, l.key, &seen, next)
}

// confirm records a write of kind that landed: row next, stamped untilMS,
// whose attempt started at start.
func (l *Lease) confirm(kind writeKind, next string, untilMS int64, start time.Time) {
	if kind == kindRelease {
		l.lose(&LeaseLostError{RunID: l.RunID(), Cause: ErrReleased, Fence: l.fence}, next)
		return
	}
	l.mu.Lock()
	l.seen, l.untilMS, l.trustFrom, l.doubt = next, untilMS, start, l.doubt[:0]
	l.mu.Unlock()
}

// lose records that the lease is lost, unless it was already, ends its
// keepers with the reason, and returns the error every later call gets.
// tombstone, when not empty, is this lease's own release that landed. The
// caller holds the write token: the keepers end at once, and their ends are
// reported (their Lost hooks run) when the token is given back.
func (l *Lease) lose(lost *LeaseLostError, tombstone ...string) error {
	l.mu.Lock()
	if l.lost != nil {
		err := l.lost
		l.mu.Unlock()
		return err
	}
	l.lost, l.lostReleasing = lost, l.releasing && len(tombstone) > 0
	if len(tombstone) > 0 {
		l.released, l.seen = true, tombstone[0]
	}
	keepers := l.keepers
	l.keepers = nil
	l.mu.Unlock()
	if len(keepers) > 0 {
		ended := make([]func(*Renewer), 0, len(keepers))
		for _, k := range keepers {
			ended = append(ended, k.r.endLaterOn(k, lost))
		}
		l.mu.Lock()
		held := l.writing
		if held {
			l.ended = append(l.ended, ended...)
		}
		l.mu.Unlock()
		if !held { // no write token to wait for
			for _, report := range ended {
				report(nil)
			}
		}
	}
	if len(tombstone) > 0 {
		rememberReleased(l.store, l.key, tombstone[0])
	}
	return lost
}

// addKeeper registers k to be ended when the lease is lost. It returns the
// loss instead when the lease is lost already.
func (l *Lease) addKeeper(k *Keeper) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return l.lost
	}
	if l.releasing {
		return l.errReleasing()
	}
	l.keepers = append(l.keepers, k)
	return nil
}

// removeKeeper forgets k.
func (l *Lease) removeKeeper(k *Keeper) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, kk := range l.keepers {
		if kk == k {
			l.keepers = append(l.keepers[:i], l.keepers[i+1:]...)
			return
		}
	}
}

// lostFrom describes a lease found lost with row stored (derr: it does not
// parse).
func lostFrom(runID string, row leaseRow, derr error) *LeaseLostError {
	e := &LeaseLostError{RunID: runID, Cause: ErrRowChanged}
	if derr != nil {
		return e
	}
	e.Holder, e.Fence, e.Until = row.Holder, row.Fence, row.until()
	e.Cause = ErrTakenOver
	if row.Holder == "" {
		e.Cause = ErrReleased
	}
	return e
}
