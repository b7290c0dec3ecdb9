// Package runlease provides run leases and concurrency slots, so that two
// run drivers never advance the same run and no more than a set number of
// runs execute at once, across the processes and machines that share a
// [Store].
//
// A lease is one row, runlease:<run id>, holding {holder, fence, until_ms}.
// Every write is a compare-and-swap against the exact row last read, so a
// driver that stalls past its TTL and is replaced cannot renew, release or
// write through a fence again: its next call fails with [ErrLeaseLost]
// (RUN-E021), and that is the moment it must stop. The fence grows by one at
// every acquisition and never goes backwards for a run id, so systems outside
// the store can refuse writes from an older holder.
//
// Expiry is judged by one clock: the one given with [WithClock], or the local
// wall clock. A lease is held until its until_ms; a row whose until_ms has
// passed may be taken over by anyone.
//
//	store, err := runlease.OpenSQLite("runs.db")
//	if err != nil { … }
//	defer store.Close()
//	lease, err := runlease.Acquire(ctx, store, "run-42", runlease.HolderFor("billing", ""),
//		runlease.WithTTL(30*time.Second))
//	if errors.Is(err, runlease.ErrLeaseLost) { … another driver has the run … }
//	for step := range steps {
//		if err := lease.Renew(ctx); err != nil { return err } // stop: taken over
//		run(step, lease.Fence())
//	}
//	err = lease.Release(ctx)
package runlease

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// Lease is a held run lease. Renew it as the run advances and Release it
// when done; dropping a Lease releases nothing, because a crashed driver must
// leave its lease to expire rather than have it cleaned up by something that
// is no longer running. A Lease is safe for concurrent use.
type Lease struct {
	store  Store
	runID  string
	key    string
	holder string
	fence  uint64
	o      options

	mu    sync.Mutex
	seen  string // the exact row this lease last wrote: what a renewal must present
	until time.Time
	lost  error // sticky once the row is known to belong to someone else
	// released is set once this lease released itself.
	released bool
	// trustFrom is when, on this process's monotonic clock, the last
	// successful write of this lease started: the row's expiry is at least
	// TTL after it, which is what a Keeper's trust window counts from.
	trustFrom time.Time
	// unsure holds rows written by calls whose outcome stayed unknown: any
	// of them may be what the store holds now.
	unsure []string
}

// Acquire takes the lease on runID for holder, or fails with a
// [*LeaseLostError] (matching [ErrLeaseLost]) naming the current holder and
// the time takeover becomes possible, when a live lease is held by another
// holder.
//
// Re-acquiring a lease the same holder already holds succeeds with a new,
// higher fence; a Lease value from the earlier acquisition then fails to
// renew. Taking over an expired or released lease also raises the fence by
// one, so fences never go backwards for a run id. A fence at the largest
// uint64 is refused with [ErrFenceExhausted], never wrapped; a stored row
// that does not parse is refused with a [*CorruptRowError] and left as it
// is. Invalid arguments fail with [ErrInvalidArgument] before anything is
// written. A storage fault is returned as a [*StorageError]; when its outcome
// was unknown, Acquire reads the row back and reports the truth.
func Acquire(ctx context.Context, store Store, runID, holder string, opts ...Option) (*Lease, error) {
	o, err := buildOptions(store, opts)
	if err != nil {
		return nil, err
	}
	return acquireWith(ctx, store, runID, holder, o, true)
}

// acquireWith is Acquire with its options built. tryCreate makes it try to
// create the row before reading it, which saves a round trip for a new run
// and costs one when the row exists.
func acquireWith(ctx context.Context, store Store, runID, holder string, o options, tryCreate bool) (*Lease, error) {
	if err := checkName("runID", runID, maxRunIDLen); err != nil {
		return nil, err
	}
	if err := checkName("holder", holder, maxHolderLen); err != nil {
		return nil, err
	}
	l := &Lease{store: store, runID: runID, key: LeasePrefix + runID, holder: holder, o: o}
	start := time.Now()
	err := l.acquire(ctx, tryCreate)
	if h := o.hooks.Acquired; h != nil {
		h(AcquireEvent{RunID: runID, Holder: holder, Fence: l.fence, Latency: time.Since(start), Err: err})
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

// acquire writes the lease row: create-if-absent first when tryCreate, then
// over the row read, a few times while the row keeps changing under it.
func (l *Lease) acquire(ctx context.Context, tryCreate bool) error {
	// A run id with no row yet is the common case for new runs: creating
	// the row first costs one round trip when it works.
	err := error(errNotWritten)
	if tryCreate {
		err = l.write(ctx, nil, 1)
	}
	for try := 0; err == errNotWritten && try < 8; try++ {
		raw, found, rerr := l.store.MetaGet(ctx, l.key)
		switch {
		case rerr != nil:
			return rerr
		case !found: // released rows are kept, so this is rare: the row was pruned
			err = l.write(ctx, nil, 1)
		default:
			err = l.takeOver(ctx, raw)
		}
	}
	if err == errNotWritten {
		lost, _ := l.lostError(ctx)
		return lost
	}
	return err
}

// errNotWritten is write's report that a conditional write lost its race.
var errNotWritten = &LeaseLostError{Cause: ErrRowChanged}

// takeOver writes the next fence over raw, the row just read, unless a live
// lease of another holder is in it.
func (l *Lease) takeOver(ctx context.Context, raw string) error {
	row, err := decodeRow(raw)
	if err != nil {
		return corruptRow(l.key, raw, err)
	}
	if row.live(l.o.nowMS()) && row.Holder != l.holder {
		return &LeaseLostError{RunID: l.runID, Cause: ErrTakenOver,
			Holder: row.Holder, Fence: row.Fence, Until: row.until()}
	}
	if row.Fence == math.MaxUint64 {
		return fmt.Errorf("%w: run %q is at fence %d", ErrFenceExhausted, l.runID, row.Fence)
	}
	return l.write(ctx, &raw, row.Fence+1)
}

// write stores this lease's row with the given fence, conditional on
// expected, and records it on success. It returns errNotWritten when the
// condition did not hold.
func (l *Lease) write(ctx context.Context, expected *string, fence uint64) error {
	start := time.Now()
	row := leaseRow{Holder: l.holder, Fence: fence, UntilMS: l.o.nowMS() + l.o.ttl.Milliseconds()}
	enc := row.encode()
	ok, err := casResolved(ctx, l.store, l.key, expected, enc)
	if err != nil {
		return err
	}
	if !ok {
		return errNotWritten
	}
	l.fence, l.seen, l.until, l.trustFrom = fence, enc, row.until(), start
	return nil
}

// lostError reads the row to say who holds the lease now, and returns the
// row read ("" when it could not be read). The read only makes the error say
// more; if it fails, the cause is ErrRowChanged.
func (l *Lease) lostError(ctx context.Context) (*LeaseLostError, string) {
	e := &LeaseLostError{RunID: l.runID, Cause: ErrRowChanged}
	raw, found, err := l.store.MetaGet(ctx, l.key)
	if err != nil || !found {
		return e, ""
	}
	if row, err := decodeRow(raw); err == nil {
		e.Holder, e.Fence, e.Until = row.Holder, row.Fence, row.until()
		e.Cause = ErrTakenOver
		if row.Holder == "" {
			e.Cause = ErrReleased
		}
	}
	return e, raw
}

// swap writes next over the row this lease last wrote, and on success makes
// it the row to present next time. A row from an earlier call whose outcome
// stayed unknown counts as this lease's own: if the store holds it, swap
// adopts it and tries again, so a lost reply never turns into a false loss.
func (l *Lease) swap(ctx context.Context, next string, extra []Op, notify bool) error {
	for {
		ok, err := l.condWrite(ctx, next, extra, notify)
		if err != nil {
			if IsOutcomeUnknown(err) && len(l.unsure) < maxUnsure {
				l.unsure = append(l.unsure, next)
			}
			return err
		}
		if ok {
			l.seen, l.unsure = next, l.unsure[:0]
			return nil
		}
		lost, cur := l.lostError(ctx)
		if cur == "" || !slices.Contains(l.unsure, cur) {
			l.lost = lost
			return lost
		}
		l.seen, l.unsure = cur, l.unsure[:0]
	}
}

// condWrite writes next over the row this lease last wrote, with the extra
// ops in the same atomic batch when there are any, waking the run's waiters
// when notify is set and the store can.
func (l *Lease) condWrite(ctx context.Context, next string, extra []Op, notify bool) (bool, error) {
	switch {
	case notify:
		return casNotify(ctx, l.store, l.key, &l.seen, next)
	case len(extra) == 0:
		return casResolved(ctx, l.store, l.key, &l.seen, next)
	}
	ops := append([]Op{Put(l.key, next)}, extra...)
	ok, err := l.store.(Batcher).MetaBatch(ctx, []Cond{IfEquals(l.key, l.seen)}, ops)
	if err == nil || !IsOutcomeUnknown(err) {
		return ok, err
	}
	won, rerr := resolveCAS(ctx, l.store, l.key, &l.seen, next, ok, err)
	if rerr != nil || won {
		return won, rerr
	}
	// Another writer holds the row now. The batch may still have landed
	// before it did, so the user's writes are in doubt: the error says the
	// lease is lost and the outcome unknown, never "nothing written".
	lost, _ := l.lostError(ctx)
	lost.Err = err
	l.lost = lost
	return false, lost
}

// maxUnsure bounds how many writes of unknown outcome a lease remembers.
// More in a row than this means the store has been failing for several
// renewal intervals, by which time the trust window has run out anyway.
const maxUnsure = 8

// state returns what a Keeper needs to know of the lease at once.
func (l *Lease) state() (trustFrom time.Time, lost error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.trustFrom, l.lost
}

// RunID returns the run this lease is for.
func (l *Lease) RunID() string { return l.runID }

// Holder returns the holder string the lease was acquired with.
func (l *Lease) Holder() string { return l.holder }

// Fence returns the lease's fence: a number that grows at every acquisition
// of the run, for systems outside the store to refuse older holders' writes.
func (l *Lease) Fence() uint64 { return l.fence }

// TTL returns how long each acquisition or renewal holds the lease.
func (l *Lease) TTL() time.Duration { return l.o.ttl }

// Expiry returns the until time of the row this lease last wrote, by the
// clock that judges expiry: when another driver may take over if the lease
// is not renewed.
func (l *Lease) Expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// Renew extends the lease to now plus its TTL, keeping the fence.
//
// Renew fails with a [*LeaseLostError] (matching [ErrLeaseLost]) once anyone
// else has written the row — taken over after this driver stalled past its
// TTL, or released — and from then on every call fails the same way without
// touching the store: that is the moment the driver must stop advancing the
// run. A storage fault is returned as is and leaves the lease as it was, so
// Renew may be retried; when the fault's outcome is unknown, Renew reads the
// row back and reports the truth rather than a false loss.
func (l *Lease) Renew(ctx context.Context) error {
	return l.renew(ctx, nil)
}

// renew extends the lease, writing extra in the same atomic batch.
func (l *Lease) renew(ctx context.Context, extra []Op) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return l.lost
	}
	start := time.Now()
	row := leaseRow{Holder: l.holder, Fence: l.fence, UntilMS: l.o.nowMS() + l.o.ttl.Milliseconds()}
	if err := l.swap(ctx, row.encode(), extra, false); err != nil {
		return err
	}
	l.until, l.trustFrom = row.until(), start
	return nil
}

// Release gives the lease up, so the next driver can start at once rather
// than after the TTL. The row is kept as a released tombstone with the same
// fence, so the next acquisition continues above it.
//
// Release is conditional on the row this lease last wrote: a driver whose
// lease was taken over leaves the new holder's lease untouched and gets a
// [*LeaseLostError]. Releasing twice is a no-op. On a storage fault the lease
// is unchanged and Release may be retried; a lease that is never released
// expires after its TTL.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	if l.lost != nil {
		return l.lost
	}
	if err := l.swap(ctx, leaseRow{Fence: l.fence, UntilMS: l.o.nowMS()}.encode(), nil, true); err != nil {
		return err
	}
	l.released = true
	l.lost = &LeaseLostError{RunID: l.runID, Cause: ErrReleased, Fence: l.fence}
	return nil
}

// LeaseInfo describes the lease row of a run, as [Peek] reads it.
type LeaseInfo struct {
	RunID    string
	Found    bool      // a row exists for the run
	Live     bool      // held by someone now: Acquire by another holder would fail
	Released bool      // the last holder released it
	Holder   string    // the holder, empty when released
	Fence    uint64    // the fence of the last acquisition
	Until    time.Time // when the lease expires; takeover is possible from then on
	Corrupt  bool      // the row does not parse (listed by Leases; Peek returns an error)
	Row      string    // the stored row, byte for byte: what ForceRelease is conditional on
}

// Peek reads the lease of runID without changing it, so a status surface can
// say who holds a run and when takeover becomes possible. A run with no row
// has Found false. A row that does not parse is a [*CorruptRowError]. Only
// the [WithClock] option matters to Peek: it judges Live.
func Peek(ctx context.Context, store Store, runID string, opts ...Option) (LeaseInfo, error) {
	info := LeaseInfo{RunID: runID}
	o, err := buildOptions(store, opts)
	if err != nil {
		return info, err
	}
	if err := checkName("runID", runID, maxRunIDLen); err != nil {
		return info, err
	}
	key := LeasePrefix + runID
	raw, found, err := store.MetaGet(ctx, key)
	if err != nil || !found {
		return info, err
	}
	if info = leaseInfo(runID, raw, o.nowMS()); info.Corrupt {
		_, err := decodeRow(raw)
		return info, corruptRow(key, raw, err)
	}
	return info, nil
}
