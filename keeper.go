package runlease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// CodeKeeperStopped is the code of [ErrKeeperStopped].
const CodeKeeperStopped = "RUN-E024"

// ErrKeeperStopped is a [Keeper]'s Err after it was stopped rather than lost:
// by Stop, Release, its Renewer's Close, or the end of the context it was
// started with (whose cause it then wraps). The lease itself may still be
// held.
var ErrKeeperStopped error = &codedError{CodeKeeperStopped, "keeper stopped"}

// KeepInterval sets how often a [Keeper] renews. The default is a third of
// the TTL. It must leave room for at least two attempts inside the trust
// window: 0 < interval <= (TTL - margin) / 2, or Keep fails with
// [ErrInvalidArgument].
func KeepInterval(d time.Duration) Option {
	return func(o *options) { o.interval = d }
}

// KeepMargin sets how long before the lease can expire a [Keeper] stops
// trusting it when no renewal has succeeded: the holder gives up at
// attempt start + TTL - margin, by its own monotonic clock. The default is
// a tenth of the TTL; the store clock's uncertainty, if any, is added to it.
// It must be in [0, TTL/2], or Keep fails with [ErrInvalidArgument].
func KeepMargin(d time.Duration) Option {
	return func(o *options) { o.margin = d }
}

// KeepSlots makes a [Keeper] renew s beside the lease. A slot lost to
// another run is reported to the hooks and the logger but does not stop the
// run, because the lease is the authority on who may advance it.
func KeepSlots(s *Slots) Option {
	return func(o *options) { o.slots = s }
}

// Keeper renews a lease (and the slots claimed beside it) in the background
// and tells its driver, promptly and with a reason, when it must stop. Its
// health is shaped like a context: Done is closed when the keeper ends, Err
// says why, and Context is a context for the run's work that is cancelled,
// with that reason as its cause, at the same moment.
//
// A Keeper ends when the lease is lost (Err is a [*LeaseLostError]): taken
// over or released by someone else, or — the trust window — when no
// renewal has succeeded by attempt start + TTL - margin of the last one
// that did, which is strictly before any contender may take over. It also
// ends, with [ErrKeeperStopped], when stopped. Transient store faults are
// retried with backoff while the trust window lasts.
//
// A Keeper holds no goroutine of its own: a [Renewer] serves many keepers
// from one loop. Its methods are safe for concurrent use.
type Keeper struct {
	r      *Renewer
	lease  *Lease
	slots  *Slots
	o      options
	parent context.Context // the context Keep was given: its values reach renewals

	// Guarded by r.mu. The work context and the done channel are made on
	// first use, so that a process keeping many leases pays for them only
	// where they are asked for.
	ctx      context.Context // the work context; nil until Context is called
	cancel   context.CancelCauseFunc
	done     chan struct{}      // nil until Done is called, or the keeper ends
	abort    context.CancelFunc // cuts a renewal in flight short; nil when none
	unwatch  func() bool        // stops watching the parent context
	index    int                // position in r.queue; -1 when not queued
	next     time.Time          // when the loop must next look at this keeper
	renewAt  time.Time
	trustEnd time.Time // trust window's end: attempt start + TTL - margin
	backoff  time.Duration
	lastErr  error // the last renewal fault, for ErrTrustExpired
	flying   chan struct{}
	err      error // why it ended; nil while running
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
// was lost, or an error matching [ErrKeeperStopped] when it was stopped.
//
// Err also compares the trust window with the clock at the moment of the
// call, and ends the keeper with [ErrTrustExpired] if it has run out. A
// driver resumed from a pause may run before the keeper's own loop does, so
// the work context may not be cancelled yet: call Err right before each
// side effect that must not happen once the lease is in doubt.
func (k *Keeper) Err() error {
	k.r.mu.Lock()
	if k.err == nil && !time.Now().Before(k.trustEnd) {
		report := k.r.endLocked(k, k.trustExpired())
		k.r.mu.Unlock()
		report()
		k.r.mu.Lock()
	}
	defer k.r.mu.Unlock()
	return k.err
}

// Context returns the context for the run's work: the context Keep was given,
// cancelled when the keeper ends, with context.Cause giving Err.
func (k *Keeper) Context() context.Context {
	k.r.mu.Lock()
	defer k.r.mu.Unlock()
	if k.ctx == nil {
		k.ctx, k.cancel = context.WithCancelCause(k.parent)
		if k.err != nil {
			k.cancel(k.err)
		}
	}
	return k.ctx
}

// Lease returns the kept lease.
func (k *Keeper) Lease() *Lease { return k.lease }

// Slots returns the kept slots, or nil.
func (k *Keeper) Slots() *Slots { return k.slots }

// TrustedUntil returns when, by this process's monotonic clock, the holder
// stops trusting the lease unless a renewal succeeds first.
func (k *Keeper) TrustedUntil() time.Time {
	k.r.mu.Lock()
	defer k.r.mu.Unlock()
	return k.trustEnd
}

// Stop ends the keeper without releasing the lease or the slots: they expire
// after their TTL unless renewed or released by other means. It cuts short a
// renewal in progress and returns once no goroutine of the keeper (or of a
// Renewer it owns) is left. Stopping an ended keeper does nothing.
func (k *Keeper) Stop() {
	k.r.end(k, ErrKeeperStopped)
	k.wait()
}

// Release stops the keeper, then releases the slots and the lease, so the
// next driver can start at once. It returns the first fault of either
// release; a lease lost before is reported as its [*LeaseLostError].
func (k *Keeper) Release(ctx context.Context) error {
	k.Stop()
	var errs []error
	if k.slots != nil {
		errs = append(errs, k.slots.Release(ctx))
	}
	errs = append(errs, k.lease.Release(ctx))
	return errors.Join(errs...)
}

// wait returns once the keeper's renewal in flight, if any, has returned,
// and, for a keeper with a Renewer of its own, once the loop has exited.
func (k *Keeper) wait() {
	k.r.mu.Lock()
	flying := k.flying
	k.r.mu.Unlock()
	if flying != nil {
		<-flying
	}
	if k.r.own {
		k.r.waitIdle()
	}
}

// validate checks the keep options against the lease's TTL and fills in
// the defaults.
func (o *options) validateKeep() error {
	if o.margin == 0 {
		o.margin = o.ttl / 10
	}
	if o.margin < 0 || o.margin > o.ttl/2 {
		return invalidArg("margin", "%v is outside [0, %v] for TTL %v", o.margin, o.ttl/2, o.ttl)
	}
	o.margin += o.uncertainty
	if o.interval == 0 {
		o.interval = o.ttl / 3
	}
	if hi := (o.ttl - o.margin) / 2; o.interval <= 0 || o.interval > hi {
		return invalidArg("interval", "%v is outside (0, %v] for TTL %v and margin %v", o.interval, hi, o.ttl, o.margin)
	}
	if o.logger == nil {
		o.logger = discard
	}
	return nil
}

// jitter returns d scaled by a random factor in [0.75, 1.25), so that many
// keepers retrying after one outage do not retry in step.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + time.Duration(rand.Int64N(int64(d)/2+1))
}

// nextBackoff returns the wait before the next retry after a fault.
func (k *Keeper) nextBackoff() time.Duration {
	switch {
	case k.backoff == 0:
		k.backoff = max(k.o.interval/16, 10*time.Millisecond)
	case k.backoff < k.o.interval/2:
		k.backoff = min(2*k.backoff, k.o.interval/2)
	}
	return jitter(k.backoff)
}

// trustExpired is the loss reported when the trust window runs out.
func (k *Keeper) trustExpired() error {
	cause := errors.New("the renewal in flight did not return in time")
	if k.lastErr != nil {
		cause = fmt.Errorf("last renewal fault: %w", k.lastErr)
	}
	return &LeaseLostError{RunID: k.lease.runID, Cause: ErrTrustExpired, Fence: k.lease.fence, Err: cause}
}
