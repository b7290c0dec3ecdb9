package runlease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Lease is a held run lease. Renew it as the run advances and Release it
// when done; dropping a Lease releases nothing, because a crashed driver must
// leave its lease to expire rather than have it cleaned up by something that
// is no longer running.
//
// A Lease is safe for concurrent use. It has at most one write in flight:
// Renew, Write and Release (and a [Keeper]'s renewals) wait for the write
// before them, or for the end of their own context, whichever comes first.
// Reading its state (Expiry, Fence, a keeper's Err) never waits for a write.
type Lease struct {
	store  Store
	key    string
	holder string
	fence  uint64 // fixed at acquisition
	o      leaseOptions
	// lineage stamps the rows of every Lease of this run and holder at
	// this fence in this process, so that no two are equal (see
	// lineage.go). Fixed at acquisition.
	lineage *lineage

	// mu guards the fields below. It is a leaf lock: it is never held
	// across store I/O, hooks, logging, or while taking another lock.
	mu sync.Mutex
	// seen is the row this lease believes the store holds: the row the
	// next write must present. It is this lease's own last write, or a
	// row of its own found on reading back (see ownRow).
	seen string
	// untilMS and trustFrom describe the last write confirmed to have
	// landed: its row's until_ms, and when, on this process's monotonic
	// clock, the attempt that wrote it started. A Keeper's trust window
	// counts from them.
	untilMS   int64
	trustFrom time.Time
	// sentMS is the largest until_ms this lease ever sent, landed or not:
	// every new row stamps a larger one, so no two rows it writes are
	// equal and a read-back can tell which write landed.
	sentMS int64
	// doubt holds the until_ms of every write sent over seen whose
	// outcome is unknown: the rows of this lease's own that may be in the
	// store now (see ownRow). Emptied when seen changes, since a write over
	// an earlier seen can no longer land: rows never repeat.
	doubt     []int64
	lost      error // sticky once the row is known to be someone else's
	released  bool  // the row is released at this lease's fence
	releasing bool  // Release was called: nothing but Release may write
	// lostReleasing: lost is the lease's own release, recorded with its
	// tombstone once releasing was set, so it ends no keeper as a loss
	// (Lease.releaseStops). A loss to others found while Release runs
	// (taken over, released by an operator) leaves it false.
	lostReleasing bool
	// writing is the write token: held by the one write in flight, for its
	// whole duration (lock, tryLock, unlock). A write that must wait for
	// it waits on writeFree, made by the first such waiter and closed when
	// the token is given back, so that its wait can end with its context;
	// a lease nobody waits on never makes one.
	writing bool
	// optSet is the options given to the call that acquired the lease,
	// whose values o keeps (see claimStart). Fixed at acquisition, not
	// guarded by mu: it sits beside the flags above to share their word.
	optSet    optionSet
	writeFree chan struct{}
	keepers   []*Keeper
	// hooking counts the hooks of its keepers running now
	// (Renewer.runHook). A keeper's hook may run on the goroutine of a
	// renewal of another keeper of the lease (a loss is reported to every
	// keeper by the call that found it), so Keeper.Stop waits for no
	// renewal of the lease while one runs.
	hooking atomic.Int32
	// ended are the reports of keepers a loss ended during the write in
	// flight (their Lost hooks): they run once the write token is given
	// back (unlock), so that a hook may call the lease.
	ended []func(host *Renewer)
}

// Acquire takes the lease on runID for holder, or fails with a
// [*LeaseLostError] (matching [ErrLeaseLost] and [ErrTakenOver]) naming the
// current holder and the time takeover becomes possible, when a live lease
// is held by another holder.
//
// Re-acquiring a lease the same holder already holds succeeds with a new,
// higher fence; a Lease value from the earlier acquisition then fails to
// renew. Taking over an expired or released lease also raises the fence by
// one, so fences never go backwards for a run id. A fence at the largest
// uint64 is refused with [ErrFenceExhausted], never wrapped; a stored row
// that does not parse is refused with a [*CorruptRowError] and left as it
// is. Invalid arguments fail with [ErrInvalidArgument] before anything is
// written. A race lost to another acquirer of an expired or released row is
// retried. A storage fault is returned as a [*StorageError]; when its
// outcome was unknown, Acquire reads the row back and reports the truth.
// When it cannot (the read fails too, or the write has not landed yet),
// the fault it returns is one of unknown outcome: the run may be held in
// the holder's name until that row expires, at a fence above the holder's
// other Leases of the run, which then no longer renew. When the fault came
// from the end of ctx, Acquire first releases the row it may have written
// (spending at most half a second past ctx's end): if that release lands,
// the fault returned is one that changed nothing.
//
// Acquire takes the options [WithTTL], [WithClock], [WithHooks] and
// [WithLogger]; the hooks and the logger also serve a [Keeper] of the lease.
// Holder strings must be unique per driver (see [HolderFor]): re-entry by an
// equal holder is allowed by design.
func Acquire(ctx context.Context, store Store, runID, holder string, opts ...Option) (*Lease, error) {
	o, err := buildOptions(store, opts, optsAcquire, "Acquire")
	if err != nil {
		return nil, err
	}
	return acquireWith(ctx, store, runID, holder, o, true, nil)
}

// acquireWith is Acquire with its options built. tryCreate makes it try to
// create the row before reading it, which saves a round trip for a new run
// and costs one when the row exists; known, when not nil, is a row it was
// told the store holds, written over before anything is read.
func acquireWith(ctx context.Context, store Store, runID, holder string, o options, tryCreate bool, known *string) (*Lease, error) {
	if err := checkName("runID", runID, maxRunIDLen); err != nil {
		return nil, err
	}
	if err := checkName("holder", holder, maxHolderLen); err != nil {
		return nil, err
	}
	l := &Lease{store: store, key: LeasePrefix + runID, holder: holder, o: o.forLease(), optSet: o.set}
	start := time.Now()
	err := l.acquire(ctx, tryCreate, known)
	if h := hooksOr(o.hooks).Acquired; h != nil {
		fence := l.fence
		if err != nil {
			fence = 0 // a write taken back (takeBack) set it
		}
		h(AcquireEvent{RunID: runID, Holder: holder, Fence: fence, Latency: time.Since(start), Err: err})
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

// maxAcquireTries bounds how many races in a row Acquire may lose to other
// acquirers of a free row before it reports a fault: on a store that works,
// each lost race means another acquirer won, which makes the row live.
const maxAcquireTries = 1000

// acquire writes the lease row: over known when given, else, when
// tryCreate, over the row this process released last or create-if-absent;
// then over the row read, while the row keeps changing under it.
func (l *Lease) acquire(ctx context.Context, tryCreate bool, known *string) error {
	if known == nil && tryCreate {
		if row, ok := takeReleased(l.store, l.key); ok {
			known = &row // this process released the run last (tombstones.go)
		}
	}
	cur := known // the row last read or told of; nil when absent
	read := known == nil && !tryCreate
	told := known != nil // cur is a row told of, not read
	for try := 0; try < maxAcquireTries; try++ {
		if try >= 8 {
			if err := sleepCtx(ctx, jitter(time.Duration(min(try, 100))*time.Millisecond)); err != nil {
				return &StorageError{Op: "MetaGet", Key: l.key, Err: err}
			}
		}
		if read {
			raw, found, err := l.store.MetaGet(ctx, l.key)
			if err != nil {
				return err
			}
			cur = nil
			if found {
				cur = &raw
			}
		}
		fence := uint64(1)
		if cur != nil {
			row, err := l.claimable(*cur)
			if err != nil && told {
				told, read = false, true // stale news, or a row not free: read the truth
				continue
			}
			if err != nil {
				return err
			}
			fence = row.Fence + 1
		}
		told = false
		next, won, err := l.tryAcquire(ctx, cur, fence)
		if won || err != nil {
			return err
		}
		cur, read = next, next == nil
	}
	return &StorageError{Op: "MetaCAS", Key: l.key, Retryable: true,
		Err: fmt.Errorf("lost the race for a free row %d times in a row", maxAcquireTries)}
}

// claimable decodes raw, the row read, and refuses it when it cannot be
// taken over: a live lease of another holder, a corrupt row, or a fence at
// its maximum.
func (l *Lease) claimable(raw string) (leaseRow, error) {
	row, err := decodeRow(raw)
	if err != nil {
		return row, corruptRow(l.key, raw, err)
	}
	if row.live(l.o.nowMS()) && row.Holder != l.holder {
		return row, &LeaseLostError{RunID: l.RunID(), Cause: ErrTakenOver, refused: true,
			Holder: row.Holder, Fence: row.Fence, Until: row.until()}
	}
	if row.Fence == math.MaxUint64 {
		return row, fmt.Errorf("%w: run %q is at fence %d", ErrFenceExhausted, l.RunID(), row.Fence)
	}
	return row, nil
}

// tryAcquire writes this holder's row at fence over expected (nil: absent).
// It reports whether the row landed; when it did not, it returns the row
// now stored if a read-back found it (nil otherwise: read it again). A
// write of unknown outcome is read back: the row it sent, found, is this
// acquisition's, since no other Lease sends the same bytes (see
// lineage.go).
func (l *Lease) tryAcquire(ctx context.Context, expected *string, fence uint64) (next *string, won bool, err error) {
	start := time.Now()
	lin := lineageOf(l.store, l.key, l.holder, fence)
	untilMS, prev := lin.stamp(l.o.now(), l.o.ttl, 0)
	row := leaseRow{Holder: l.holder, Fence: fence, UntilMS: untilMS}.encode()
	ok, err := l.store.MetaCAS(ctx, l.key, expected, row)
	if (err == nil && !ok) || (err != nil && !IsOutcomeUnknown(err)) {
		lin.unstamp(untilMS, prev) // it never lands
		return nil, false, err
	}
	if err != nil {
		lin.pin(l.o.now(), untilMS) // it may land yet
		raw, found, rerr := l.store.MetaGet(ctx, l.key)
		switch {
		case rerr != nil:
			return nil, false, l.takeBack(ctx, err, fence, lin, row, untilMS)
		case !found && expected == nil, found && expected != nil && raw == *expected:
			// Not applied, or not yet.
			return nil, false, l.takeBack(ctx, err, fence, lin, row, untilMS)
		case !found:
			return nil, false, nil
		case raw != row:
			return &raw, false, nil // another acquirer moved the row
		}
	}
	l.fence, l.lineage, l.seen, l.untilMS, l.sentMS, l.trustFrom = fence, lin, row, untilMS, untilMS, start
	return nil, true, nil
}

// takeBackTimeout bounds how long an acquisition cut short by the end of
// its context spends releasing the row it may have written.
const takeBackTimeout = 500 * time.Millisecond

// takeBack is what an acquisition returns when its write of row, at fence,
// met fault, a fault of unknown outcome, and the read-back could not tell
// whether it landed. While ctx is live that is fault: the caller learns the
// run may be held in its name. When ctx has ended, the caller has gone and
// will not use a lease it never received, so the write is released here if
// it landed (within takeBackTimeout, with ctx's values), and the run is not
// left blocked for a TTL: the fault is then one that changed nothing. A
// write that lands after the release was tried stays unknown.
func (l *Lease) takeBack(ctx context.Context, fault error, fence uint64, lin *lineage, row string, untilMS int64) error {
	cerr := ctxEnded(ctx)
	if cerr == nil {
		return fault
	}
	l.fence, l.lineage, l.seen, l.untilMS, l.sentMS = fence, lin, row, untilMS, untilMS
	cctx, cancel := cleanupContext(ctx, takeBackTimeout)
	defer cancel()
	if l.Release(cctx) != nil {
		return fault
	}
	return &StorageError{Op: "MetaCAS", Key: l.key, Err: cerr}
}

// ctxEnded returns ctx's error, or [context.DeadlineExceeded] once ctx's
// deadline has passed though ctx does not say so yet. A deadline ends a
// context through a timer whose callback runs on a goroutine of its own, so
// a store call that returns at the deadline can find ctx.Err() still nil,
// and find it set a moment later. A caller whose deadline passed during the
// call is owed the context's error all the same, and a write of unknown
// outcome taken back, as surely as when the timer had been quicker; the
// context package itself judges a deadline at or before now as passed.
// Only the decisions that turn on whether the caller has gone use this;
// they are all on paths that already failed.
func ctxEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// sleepCtx waits for d or the end of ctx, whose error it returns.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// RunID returns the run this lease is for.
func (l *Lease) RunID() string { return l.key[len(LeasePrefix):] }

// Holder returns the holder string the lease was acquired with.
func (l *Lease) Holder() string { return l.holder }

// Fence returns the lease's fence: a number that grows at every acquisition
// of the run, for systems outside the store to refuse older holders' writes.
func (l *Lease) Fence() uint64 { return l.fence }

// TTL returns how long each acquisition or renewal holds the lease.
func (l *Lease) TTL() time.Duration { return l.o.ttl }

// Expiry returns the until time of the last row this lease is sure it
// wrote, by the clock that judges expiry: when another driver may take over
// if the lease is not renewed.
func (l *Lease) Expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.UnixMilli(l.untilMS).UTC()
}

// Err returns nil while the lease may still be held, and the
// [*LeaseLostError] that ended it once a call found it lost or released.
// It does no I/O: a lease whose row was taken over is known to be lost only
// once a call has read or failed to write the row.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// leaseState is what a Keeper reads of its lease at once.
type leaseState struct {
	trustFrom time.Time
	untilMS   int64
	lost      error
}

func (l *Lease) state() leaseState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return leaseState{l.trustFrom, l.untilMS, l.lost}
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
// has Found false. A row that does not parse is a [*CorruptRowError]. Peek
// takes one option, [WithClock], which judges Live.
func Peek(ctx context.Context, store Store, runID string, opts ...Option) (LeaseInfo, error) {
	info := LeaseInfo{RunID: runID}
	o, err := buildOptions(store, opts, optsRead, "Peek")
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

// errorsIsAny reports whether err matches any of targets.
func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
