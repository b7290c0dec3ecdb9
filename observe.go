package runlease

import (
	"log/slog"
	"time"
)

// Hooks are callbacks through which a program feeds its own metrics and
// traces (Prometheus, OpenTelemetry, …) without this package depending on
// them. Every field may be nil. Callbacks run synchronously on the goroutine
// that did the work, so they must be quick and must not block; they may be
// called concurrently.
type Hooks struct {
	// Acquired is called after every Acquire that got past argument
	// checks, with its outcome: Err is nil on success, a *LeaseLostError
	// when another holder has the lease, or a fault.
	Acquired func(AcquireEvent)
	// Renewed is called after every renewal attempt a Keeper makes.
	Renewed func(RenewEvent)
	// Lost is called once when a Keeper's lease is lost, with the reason.
	Lost func(LossEvent)
	// SlotsLost is called once for each loss of slots a Keeper renews:
	// taken by other runs, or not renewed within their trust window (the
	// error's Cause says which). The run goes on, because the lease is the
	// authority, unless the slots were kept with KeepSlotsStrict.
	SlotsLost func(SlotLossEvent)
	// LimitMismatch is called when ClaimSlots finds live slots numbered at
	// or above its own limit for a scope: hosts disagree on the limit, or
	// it was lowered. Nothing is evicted; the scope drains as runs end.
	LimitMismatch func(LimitMismatchEvent)
	// SlotsRequeued is called when a waiter of ClaimSlotsWait loses its
	// place in the queues (it stalled past its TTL, or its entries were
	// removed) and queues again at the back.
	SlotsRequeued func(RequeueEvent)
}

// RequeueEvent describes a waiter that lost its place in the queues.
type RequeueEvent struct {
	RunID  string
	Scopes []string
	Waited time.Duration // how long it had held the place it lost
	Reason string
}

// LimitMismatchEvent describes a scope whose live slots disagree with the
// claiming host's limit.
type LimitMismatchEvent struct {
	Scope      string
	Limit      int // this host's limit
	Live       int // slots in use in the scope: live slot rows (the claiming run's own included) and rows that do not parse
	AboveLimit int // how many live slot rows are numbered at or above Limit
}

// AcquireEvent describes one Acquire.
type AcquireEvent struct {
	RunID   string
	Holder  string
	Fence   uint64 // the fence acquired; 0 on failure
	Latency time.Duration
	Err     error
}

// RenewEvent describes one renewal attempt by a Keeper.
type RenewEvent struct {
	RunID   string
	Fence   uint64
	Latency time.Duration
	// TimeLeft is how long the holder's trust window still had to run when
	// the attempt started: how close the lease came to being given up.
	TimeLeft time.Duration
	Err      error // nil on success
}

// LossEvent describes the loss of a kept lease. Err is a *LeaseLostError
// whose Cause says why; errors.Is(Err, ErrTakenOver) and the like tell the
// reasons apart.
type LossEvent struct {
	RunID string
	Fence uint64
	Err   error
}

// SlotLossEvent describes slots a kept run lost.
type SlotLossEvent struct {
	RunID string
	Err   *SlotLostError
}

// WithHooks sets callbacks for metrics: [Acquire] reports to Acquired, and a
// [Keeper] started on the lease reports renewals and losses (unless its own
// options set other hooks).
//
// [Acquire], [AcquireWait], [ClaimSlots], [ClaimSlotsWait] and [Keep] take
// it. [Lease.ClaimSlots] and [Lease.ClaimSlotsWait] report to the hooks the
// lease was acquired with and refuse it, as the calls that report to no
// hook ([Peek], [Leases], [Occupancy], …) do, with [ErrInvalidArgument].
func WithHooks(h Hooks) Option {
	// One copy per option value, shared by every lease and keeper made
	// with it: a process keeping many leases pays for a pointer each.
	p := &h
	return func(o *options) { o.hooks, o.set = p, o.set|optHooks }
}

// noHooks stands for hooks never given.
var noHooks Hooks

// hooksOr returns *h, or no hooks when h is nil.
func hooksOr(h *Hooks) *Hooks {
	if h == nil {
		return &noHooks
	}
	return h
}

// WithLogger sets the logger to which a [Keeper] reports renewal faults
// (Debug) and losses (Warn), and [ClaimSlots] reports hosts that disagree
// on a scope's limit (Warn). The default logs nothing. The calls that take
// [WithHooks] take it, and the others refuse it, in the same way.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger, o.set = l, o.set|optLogger }
}

// discard is the logger used when none is given.
var discard = slog.New(slog.DiscardHandler)
