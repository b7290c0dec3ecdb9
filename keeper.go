package runlease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
)

// CodeKeeperStopped is the code of [ErrKeeperStopped].
const CodeKeeperStopped = "RUN-E024"

// ErrKeeperStopped is a [Keeper]'s Err after it was stopped rather than lost:
// by Stop, Release, its Renewer's Close, or the end of the context it was
// started with (whose cause it then wraps). The lease itself may still be
// held.
var ErrKeeperStopped error = &codedError{CodeKeeperStopped, "keeper stopped"}

// stoppedError is a keeper's Err after the context it was started with
// ended: it matches [ErrKeeperStopped] and the context's cause, and says
// both on one line.
type stoppedError struct{ cause error }

// keeperStopped is the reason a keeper ends with when the context it was
// started with ends with cause.
func keeperStopped(cause error) error { return &stoppedError{cause} }

func (e *stoppedError) Error() string {
	if e.cause == nil {
		return ErrKeeperStopped.Error()
	}
	return ErrKeeperStopped.Error() + ": " + strings.ReplaceAll(e.cause.Error(), "\n", "; ")
}

// Code returns [CodeKeeperStopped].
func (e *stoppedError) Code() string { return CodeKeeperStopped }

func (e *stoppedError) Unwrap() []error { return []error{ErrKeeperStopped, e.cause} }

// MinKeepInterval is the shortest interval [KeepInterval] accepts: shorter
// ones would only load the store.
const MinKeepInterval = 100 * time.Millisecond

// KeepInterval sets how often a [Keeper] renews. The default is a third of
// the TTL. It must be at least [MinKeepInterval] and leave room for at least
// two attempts inside the trust window: interval <= (TTL - margin) / 2, or
// Keep fails with [ErrInvalidArgument].
func KeepInterval(d time.Duration) Option {
	return func(o *options) { o.interval, o.set = d, o.set|optInterval }
}

// KeepMargin sets how long before the lease can expire a [Keeper] stops
// trusting it when no renewal has succeeded: the holder gives up at
// attempt start + TTL - margin, by its own monotonic clock, and when the
// clock that judges expiry reaches the row's expiry - margin. The default is
// a tenth of the TTL; the store clock's uncertainty, if any, is added to it
// (and to an explicit 0). It must be in [0, TTL/2], or Keep fails with
// [ErrInvalidArgument].
func KeepMargin(d time.Duration) Option {
	return func(o *options) { o.margin, o.set = d, o.set|optMargin }
}

// KeepSlots makes a [Keeper] renew s beside the lease, retrying faults as
// it does for the lease. A slot lost — taken by another run, or not renewed
// within its trust window — is dropped from s (Held no longer lists it) and
// reported to Hooks.SlotsLost and the logger, with the reason; the run goes
// on, because the lease is the authority on who may advance it. Use
// [KeepSlotsStrict] when the limit must be hard.
//
// s must belong to the lease's run, with a TTL no shorter than the lease's
// (claim the slots with the same TTL), or Keep fails with
// [ErrInvalidArgument]. To keep slots admitted after the keeper started
// (waited for under the kept lease), use [Keeper.ClaimSlotsWait] or the
// method [Keeper.KeepSlots].
func KeepSlots(s *Slots) Option {
	return func(o *options) { o.slots, o.strictSlots, o.set = s, false, o.set|optSlots }
}

// KeepSlotsStrict is [KeepSlots] for a hard limit: a kept slot lost, taken
// or not renewed within its trust window, also ends the keeper, whose Err
// is then a [*SlotLostError] (matching [ErrSlotLost] and its Cause) and whose
// work context is cancelled with it, before any other run can take the slot
// by expiry. The keeper trusts only a whole claim: it ends as well when a
// slot of s is released through s, or was lost before Keep, or is found
// lost by the run's own [Slots.Renew] (which reports the loss to its caller
// rather than to the hook).
func KeepSlotsStrict(s *Slots) Option {
	return func(o *options) { o.slots, o.strictSlots, o.set = s, true, o.set|optSlots }
}

// Keeper renews a lease (and the slots claimed beside it) in the background
// and tells its driver, promptly and with a reason, when it must stop. Its
// health is shaped like a context: Done is closed when the keeper ends, Err
// says why, and Context is a context for the run's work that is cancelled,
// with that reason as its cause, at the same moment.
//
// A Keeper ends when the lease is lost (Err is a [*LeaseLostError]): taken
// over or released by someone else — found by the keeper's renewal or by any
// call on the Lease, such as a fenced Write — or, the trust window, when no
// write of the lease has succeeded by attempt start + TTL - margin of the
// last one that did, which is strictly before any contender may take over.
// It also ends, with [ErrKeeperStopped], when stopped. Transient store
// faults are retried with backoff while the trust window lasts.
//
// A Keeper keeps at most one [Slots] beside its lease: given to Keep
// ([KeepSlots], [KeepSlotsStrict]), or taken over later by a running
// keeper ([Keeper.KeepSlots], [Keeper.KeepSlotsStrict], and
// [Keeper.ClaimSlotsWait], which waits for admission while the keeper
// keeps the lease).
//
// A Keeper holds no goroutine of its own: a [Renewer] serves many keepers
// from one loop. Its methods are safe for concurrent use, and none of them
// waits for the store but Release and ClaimSlotsWait.
type Keeper struct {
	r      *Renewer
	lease  *Lease
	o      keepOptions
	parent context.Context // the context Keep was given: its values reach renewals

	// Guarded by r.mu. The work context and the done channel are made on
	// first use, so that a process keeping many leases pays for them only
	// where they are asked for. ks is set at most once, from nil, and
	// never while or after the keeper ends: by Keep before the keeper is
	// registered, or by keepSlots.
	ks        *keptSlots      // the slots kept beside the lease; nil when none
	ctx       context.Context // the work context; nil until Context is called
	cancel    context.CancelCauseFunc
	done      chan struct{} // nil until Done is called, or the keeper ends
	unwatch   func() bool   // stops watching the parent context
	bucket    *bucket       // where r.queue holds it, by when the loop must next look at it; nil when not queued
	index     int           // its position in bucket; -1 when not queued
	leaseJob  *job          // the lease renewal in flight, if any
	leaseWait retry
	lastErr   error     // the last renewal fault, for ErrTrustExpired
	err       error     // why it ended; nil while running
	endedAt   time.Time // when it ended; its trust ended then at the latest
}

// keptSlots is what a Keeper keeps of the slots it renews beside its
// lease: a record of its own, so that a keeper of a lease alone pays for a
// pointer. Its slots and strict are fixed when it is made; its job and
// wait are guarded by Renewer.mu.
type keptSlots struct {
	slots  *Slots
	strict bool
	job    *job // the slot renewal in flight, if any
	wait   retry
}

// keepOptions is what a Keeper reads of its options, kept apart from the
// options a call takes so that a process keeping many leases pays for no
// more than these.
type keepOptions struct {
	ttl, interval, margin time.Duration
	hooks                 *Hooks // nil: none
	logger                *slog.Logger
}

// retry is the backoff state of one kind of renewal after faults.
type retry struct {
	at      time.Time // when to try again; zero: on schedule
	backoff time.Duration
}

// closedChan is the Done channel of a keeper that ended before anyone asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Keep starts keeping lease on a [Renewer] of its own, which runs one
// goroutine while the keeper runs. To keep many leases, share a Renewer.
// See [Renewer.Keep].
func Keep(ctx context.Context, lease *Lease, opts ...Option) (*Keeper, error) {
	return (&Renewer{own: true}).Keep(ctx, lease, opts...)
}

// Done returns a channel that is closed when the keeper ends.
func (k *Keeper) Done() <-chan struct{} {
	k.r.mu.Lock()
	defer k.r.mu.Unlock()
	if k.done == nil {
		k.done = make(chan struct{})
	}
	return k.done
}

// Err returns nil while the keeper runs, and afterwards why it ended: a
// [*LeaseLostError] (matching [ErrLeaseLost] and its cause) when the lease
// was lost, a [*SlotLostError] when a slot kept with [KeepSlotsStrict] was,
// or an error matching [ErrKeeperStopped] when it was stopped.
//
// Err also judges the trust window at the moment of the call, by the
// monotonic clock and by the clock that judges expiry, and ends the keeper
// with [ErrTrustExpired] if it has run out. A driver resumed from a pause
// may run before the keeper's own loop does, so the work context may not be
// cancelled yet: call Err right before each side effect that must not
// happen once the lease is in doubt.
func (k *Keeper) Err() error {
	r := k.r
	r.mu.Lock()
	if k.err == nil && k.parent.Err() != nil {
		// Keep's context ended, and its watch has not run yet.
		end := r.endLocked(k, keeperStopped(context.Cause(k.parent)))
		r.mu.Unlock()
		end()
		r.mu.Lock()
	}
	if k.err == nil {
		reason, report := r.lossLocked(k, time.Now())
		var end func()
		if reason != nil {
			end = r.endLocked(k, reason)
		}
		if report != nil || end != nil {
			r.mu.Unlock()
			if report != nil { // slots lost: reported even when the keeper runs on
				report()
			}
			if end != nil {
				end()
			}
			r.mu.Lock()
		}
	}
	defer r.mu.Unlock()
	return k.err
}

// Context returns the context for the run's work: the context Keep was given
// (its values and deadline), cancelled when the keeper ends, with
// context.Cause giving Err, whatever ended it. When the context Keep was
// given ends, the keeper ends with [ErrKeeperStopped] wrapping its cause,
// and only then is the work context cancelled (Err and Context end the
// keeper at once when they find that context ended; otherwise its end
// follows at once, on a goroutine of the context's). Calls on the lease made
// with the work context after the keeper ended return that cause.
func (k *Keeper) Context() context.Context {
	r := k.r
	r.mu.Lock()
	if k.ctx == nil {
		// Not a child of the parent's cancellation, which would cancel it
		// with the parent's cause rather than the keeper's.
		k.ctx, k.cancel = context.WithCancelCause(workParent{context.WithoutCancel(k.parent), k.parent})
		if k.err != nil {
			k.cancel(k.err)
		}
	}
	ctx := k.ctx
	var end func()
	if k.err == nil && k.parent.Err() != nil {
		end = r.endLocked(k, keeperStopped(context.Cause(k.parent)))
	}
	r.mu.Unlock()
	if end != nil {
		end()
	}
	return ctx
}

// workParent is the parent of a keeper's work context: the values of the
// context Keep was given and its deadline, not its cancellation, which
// reaches the work context by ending the keeper.
type workParent struct {
	context.Context // without cancel
	parent          context.Context
}

func (p workParent) Deadline() (time.Time, bool) { return p.parent.Deadline() }

// Lease returns the kept lease.
func (k *Keeper) Lease() *Lease { return k.lease }

// Slots returns the kept slots, or nil.
func (k *Keeper) Slots() *Slots {
	k.r.mu.Lock()
	defer k.r.mu.Unlock()
	if k.ks == nil {
		return nil
	}
	return k.ks.slots
}

// KeepSlots makes the running keeper renew s beside its lease, as the
// option [KeepSlots] does for a keeper started with slots: a slot lost is
// dropped from s and reported to Hooks.SlotsLost and the logger, and the
// keeper runs on. It is how a driver keeps slots it waited for while the
// keeper kept the lease ([Lease.ClaimSlotsWait] on the keeper's Context),
// with no gap in the lease's renewals; [Keeper.ClaimSlotsWait] does both.
//
// The keeper looks at s at once: a slot due for renewal is renewed right
// away, and none waits for the keeper's next renewal of the lease past its
// trust window. From then on the keeper owns s: [Keeper.Release] releases
// it with the lease, and Slots returns it.
//
// It fails, and the keeper does not take s (the caller still holds the
// slots, and must keep, renew or release them), when:
//   - s is nil, belongs to another run, or has a TTL shorter than the
//     lease's: [ErrInvalidArgument], as for Keep;
//   - the keeper keeps other slots already, or keeps s in the other mode:
//     [ErrInvalidArgument]. A keeper keeps one Slots (claim every scope a
//     run needs in one call); passing the Slots it keeps, in the mode it
//     keeps them, does nothing and returns nil;
//   - the keeper has ended (its lease lost, its trust window run out,
//     stopped or released, or the context Keep was given ended): its Err.
func (k *Keeper) KeepSlots(s *Slots) error { return k.keepSlots(s, false) }

// KeepSlotsStrict is [Keeper.KeepSlots] for a hard limit, as the option
// [KeepSlotsStrict] is: from the moment it returns nil, a slot of s lost,
// not renewed within its trust window, or released through s ends the
// keeper with a [*SlotLostError], and TrustedUntil is never later than the
// slots' own. It fails as KeepSlots does, and also, taking nothing and
// leaving the keeper running, with the [*SlotLostError] of s when the claim
// is no longer whole: a slot of it was lost, ran out or was released
// before the call.
func (k *Keeper) KeepSlotsStrict(s *Slots) error { return k.keepSlots(s, true) }

// keepSlots hands s to the running keeper, kept strictly or not.
func (k *Keeper) keepSlots(s *Slots, strict bool) error {
	if err := checkKeptSlots(s, k.lease, k.o.ttl); err != nil {
		return err
	}
	// Err ends the keeper, with its reason, when Keep's context ended or
	// its trust window ran out and nothing has ended it yet.
	if err := k.Err(); err != nil {
		return err
	}
	r := k.r
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case k.err != nil: // ended since
		return k.err
	case k.ks != nil && k.ks.slots == s && k.ks.strict == strict:
		return nil
	case k.ks != nil && k.ks.slots == s:
		return invalidArg("slots", "the keeper keeps these slots already, strict=%v", k.ks.strict)
	case k.ks != nil:
		return invalidArg("slots", "the keeper keeps other slots already: claim every scope in one call")
	}
	if strict {
		// Checked and registered in one hold of s's lock: a slot given
		// up by s from then on ends the keeper (Slots.endStrict), and
		// one given up before refuses.
		if broken := s.keepStrict(k, time.Now()); broken != nil {
			return broken
		}
	}
	k.ks = &keptSlots{slots: s, strict: strict}
	r.rescheduleLocked(k) // look at once: the slots may be due already
	return nil
}

// errKeeperEnded is the cause a wait of ClaimSlotsWait is cut short with
// when its keeper ends.
var errKeeperEnded = errors.New("keeper ended")

// ClaimSlotsWait waits for slots as [Lease.ClaimSlotsWait] does for the
// kept lease, while the keeper keeps the lease however long the wait
// takes, and hands the slots admitted to the keeper (as
// [Keeper.KeepSlots] does) before it returns them: the keeper renews them
// from then on, and Release releases them.
//
// The wait ends when ctx ends, returning its error, or when the keeper
// ends (lease lost, trust window run out, stopped, or the context Keep was
// given ended), returning the keeper's Err; either way it first takes its
// place out of the queues. The run is not admitted under a lease the
// keeper lost: on a store that implements [Batcher] the admission is
// fenced by the lease, so a driver whose lease was taken over is admitted
// nowhere, and slots admitted as the keeper ends are released before
// ClaimSlotsWait returns the keeper's Err. It fails at once with the
// keeper's Err when the keeper has ended, and with [ErrInvalidArgument]
// when it keeps slots already.
//
// With no scopes it returns an empty Slots at once, which the keeper does
// not take: it stays free to keep the slots of a later call.
//
// It takes the options of Lease.ClaimSlotsWait. The slots are kept as
// Keeper.KeepSlots keeps them; for a hard limit, wait with
// Lease.ClaimSlotsWait on the keeper's Context, then hand the slots over
// with [Keeper.KeepSlotsStrict], releasing them if it fails.
func (k *Keeper) ClaimSlotsWait(ctx context.Context, scopes []Scope, opts ...Option) (*Slots, error) {
	if err := k.Err(); err != nil {
		return nil, err
	}
	k.r.mu.Lock()
	busy := k.ks != nil
	k.r.mu.Unlock()
	if busy {
		return nil, invalidArg("slots", "the keeper keeps slots already: claim every scope in one call")
	}
	wait, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(k.Context(), func() { cancel(errKeeperEnded) })
	defer stop()
	s, err := k.lease.ClaimSlotsWait(wait, scopes, opts...)
	if err != nil {
		if kerr := k.Err(); kerr != nil && context.Cause(wait) == errKeeperEnded {
			return nil, kerr
		}
		return nil, err
	}
	if len(scopes) == 0 {
		// Nothing claimed, nothing to keep: the keeper stays free to
		// take the slots of a later call.
		return s, nil
	}
	if err := k.KeepSlots(s); err != nil {
		// Admitted as the keeper ended (or another call handed it
		// slots meanwhile): the slots are nobody's, so they go back now.
		cleanup, cancel := cleanupContext(ctx, leaveTimeout)
		defer cancel()
		if rerr := s.Release(cleanup); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		return nil, err
	}
	return s, nil
}

// slotJob returns the slot renewal in flight, if any. r.mu is held.
func (k *Keeper) slotJob() *job {
	if k.ks == nil {
		return nil
	}
	return k.ks.job
}

// TrustedUntil returns when, by this process's monotonic clock, the holder
// stops trusting the lease unless a renewal succeeds first. Once the keeper
// has ended (stopped, released, lost, or its trust window run out), or its
// lease is known to be lost, it is never later than that moment, a time
// that has passed, as [Slots.TrustedUntil] is after a loss: the keeper
// trusts nothing from then on. With [KeepSlotsStrict] it is never later
// than the kept slots' own [Slots.TrustedUntil] either: the keeper ends
// when either runs out.
func (k *Keeper) TrustedUntil() time.Time {
	k.r.mu.Lock()
	ended, endedAt, ks := k.err != nil, k.endedAt, k.ks
	k.r.mu.Unlock()
	now := time.Now()
	st := k.lease.state()
	end := k.trustEnd(st, now)
	switch {
	case ended:
		end = earliest(end, endedAt)
	case st.lost != nil, k.parent.Err() != nil:
		// Lost, and the keeper about to end (Lease.lose ends it right
		// after recording the loss); or Keep's context ended, and its
		// watch has not ended the keeper yet (Err would). Either way no
		// trust is left.
		end = earliest(end, now)
	}
	if ks != nil && ks.strict {
		if slots := ks.slots.TrustedUntil(); !slots.IsZero() {
			end = earliest(end, slots)
		}
	}
	return end
}

// Stop ends the keeper without releasing the lease or the slots: they expire
// after their TTL unless renewed or released by other means. It cuts short
// the keeper's renewal in flight and waits for it to return, and, for a
// keeper with a Renewer of its own, for the Renewer's goroutine to exit. A
// renewal the keeper's lease shares with other leases of a Renewer (a
// batch) is not waited for: it is cut short once none of its keepers runs,
// and records its outcome on the Lease, whose next call waits for it (or for
// that call's context). Stopping an ended keeper ends nothing more; a keeper
// stopped after its lease was found lost, before the loss reached it, ends
// with the loss (Err, and its Lost hook), not [ErrKeeperStopped].
//
// Stop, and so Release, may be called from a hook of the keeper or of
// another keeper of its lease. Called while a hook of a keeper of its lease
// runs, Stop ends the keeper but waits neither for its lease renewal in
// flight nor for its Renewer's goroutine, since the goroutine running the
// hook may be either (a loss is reported to every keeper of the lease by
// the call that found it, which may be this keeper's renewal); that
// goroutine exits once the hook returns. No hook runs while its goroutine holds the lease's
// write token, so a hook may also call the lease (Renew, Release).
func (k *Keeper) Stop() {
	k.r.end(k, ErrKeeperStopped)
	hooking := k.lease.hooking.Load() > 0
	k.r.mu.Lock()
	var waits []chan struct{}
	for _, j := range []*job{k.leaseJob, k.slotJob()} {
		// A hook of a keeper of the lease may run on the goroutine of
		// this keeper's lease renewal, never on that of a slot renewal
		// alone, which reports to no hook: while a hook runs, only the
		// latter is waited for.
		if j != nil && j.batch == nil && !(hooking && j == k.leaseJob) {
			waits = append(waits, j.done)
		}
	}
	k.r.mu.Unlock()
	for _, w := range waits {
		<-w
	}
	if k.r.own && !hooking {
		k.r.waitIdle()
	}
}

// Release stops the keeper, then releases the slots and the lease, so the
// next driver can start at once. It returns the first fault of either
// release; a lease lost before is reported as its [*LeaseLostError]: taken
// over, or released by someone else (an operator's [ForceRelease], found
// by a renewal or any call on the lease), though [Lease.Release] alone
// succeeds on a lease released by an operator. A lease this driver released
// itself (with [Lease.Release]) is not lost: releasing it again succeeds.
// Each release waits for a write of its lease or slots in flight, or for
// ctx. Afterwards the keeper's Err is [ErrKeeperStopped] (RUN-E024), unless
// it had ended before for another reason. Release may be called from one
// of the keeper's hooks (see Stop).
func (k *Keeper) Release(ctx context.Context) error {
	lost := k.lease.lostToOthers()
	k.Stop()
	if lost == nil {
		// Found by the renewal Stop waited for: that call may have read
		// the operator's release back, which Lease.Release then accepts.
		lost = k.lease.lostToOthers()
	}
	var errs []error
	// Read after Stop: the keeper has ended, so it takes no slots from
	// now on, and these are all it took.
	if s := k.Slots(); s != nil {
		errs = append(errs, s.Release(ctx))
	}
	err := k.lease.Release(ctx)
	if err == nil && lost != nil {
		err = lost // released by someone else before, which Lease.Release accepts
	}
	errs = append(errs, err)
	return errors.Join(errs...)
}

// lostToOthers returns the lease's loss when it is known to be lost other
// than by a release of its own: its Release was never called.
func (l *Lease) lostToOthers() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.releasing {
		return nil
	}
	return l.lost
}

// releaseStops reports whether err, a loss of the lease about to end one of
// its keepers, is the driver's own release, which stops the keeper rather
// than losing it: a release (ErrReleased) found once Release was called,
// either the release's own tombstone or the answer of a lease being
// released (errReleasing). Two Releases of one
// lease may overlap: while the first ends the keepers one by one, the
// second finds none left, releases the row and records the lease as
// released, and the keepers the first has not reached yet may meanwhile
// find that release (their Renewer's look, Err, a renewal's answer). A loss
// to others is a loss whenever it is found: recorded before Release was
// called, or found while it ran (taken over, the row changed, released by
// an operator), and so is a trust window run out, which is the keeper's
// own.
func (l *Lease) releaseStops(err error) bool {
	if !errors.Is(err, ErrReleased) {
		return false // taken over, row changed, trust run out: a loss
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.releasing && (l.lost == nil || l.lostReleasing)
}

// validateKeep checks the keep options against the lease's TTL and fills
// in the defaults.
func (o *options) validateKeep(lease *Lease) error {
	if o.set&optMargin == 0 {
		o.margin = o.ttl / 10
	}
	if o.margin < 0 || o.margin > o.ttl/2 {
		return invalidArg("margin", "%v is outside [0, %v] for TTL %v", o.margin, o.ttl/2, o.ttl)
	}
	o.margin += o.uncertainty
	if o.set&optInterval == 0 {
		o.interval = o.ttl / 3
	}
	if hi := (o.ttl - o.margin) / 2; o.interval < MinKeepInterval || o.interval > hi {
		return invalidArg("interval", "%v is outside [%v, %v] for TTL %v and margin %v",
			o.interval, MinKeepInterval, hi, o.ttl, o.margin)
	}
	if o.set&optSlots != 0 {
		if err := checkKeptSlots(o.slots, lease, o.ttl); err != nil {
			return err
		}
	}
	if o.logger == nil {
		o.logger = discard
	}
	return nil
}

// checkKeptSlots checks that s may be kept beside lease, whose TTL is ttl:
// the same run's, with a TTL no shorter.
func checkKeptSlots(s *Slots, lease *Lease, ttl time.Duration) error {
	switch {
	case s == nil:
		return invalidArg("slots", "nil")
	case s.runID != lease.RunID():
		return invalidArg("slots", "slots of run %q cannot be kept with the lease of run %q", s.runID, lease.RunID())
	case s.o.ttl < ttl:
		return invalidArg("slots", "slot TTL %v is shorter than the lease's %v: claim them with the lease's TTL", s.o.ttl, ttl)
	}
	return nil
}

// jitter returns d scaled by a random factor in [0.75, 1.25), so that many
// keepers retrying after one outage do not retry in step.
func jitter(d time.Duration) time.Duration {
	draw := rand.Int64N
	if f := jitterDraw.Load(); f != nil {
		draw = *f
	}
	return d*3/4 + time.Duration(draw(int64(d)/2+1))
}

// jitterDraw, when set, replaces rand.Int64N in jitter: it is the only
// randomness of leases, keepers and slots, and a test that replays a seeded
// schedule sets it to a source of that seed.
var jitterDraw atomic.Pointer[func(n int64) int64]

// after schedules the next try after a fault at now, and returns when.
func (w *retry) after(now time.Time, interval time.Duration) time.Time {
	switch {
	case w.backoff == 0:
		w.backoff = max(interval/16, 10*time.Millisecond)
	case w.backoff < interval/2:
		w.backoff = min(2*w.backoff, interval/2)
	}
	w.at = now.Add(jitter(w.backoff))
	return w.at
}

// trustEnd returns when, by the monotonic clock, the keeper stops trusting a
// lease in state st: margin before the row can expire, judged both from the
// start of the last write that landed and by the clock that judges expiry.
func (k *Keeper) trustEnd(st leaseState, now time.Time) time.Time {
	end := st.trustFrom.Add(k.o.ttl - k.o.margin)
	left := time.Duration(st.untilMS-k.lease.o.nowMS())*time.Millisecond - k.o.margin
	return earliest(end, now.Add(left))
}

// trustExpired is the loss reported when the trust window runs out.
func (k *Keeper) trustExpired() error {
	cause := errors.New("no renewal landed in time")
	if k.lastErr != nil {
		cause = fmt.Errorf("last renewal fault: %w", k.lastErr)
	}
	return &LeaseLostError{RunID: k.lease.RunID(), Cause: ErrTrustExpired, Fence: k.lease.fence, Err: cause}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
