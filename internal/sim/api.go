// Package sim is a deterministic simulation harness for runlease: a
// fault-injecting in-memory store, a seeded scheduler that runs a workload of
// concurrent drivers inside a testing/synctest bubble, and checkers that
// judge every step against the library's promises.
//
// The harness reaches the library only through the [API] interface, which a
// test file implements with the real calls, so that changes to option names
// and signatures are made in one place.
package sim

import (
	"context"
	"time"

	"github.com/areev/runlease"
)

// API is the part of runlease the workload drives. Its implementation lives
// beside the test that runs the simulation.
type API interface {
	// Acquire takes the lease on runID for holder with the given TTL.
	Acquire(ctx context.Context, s runlease.Store, runID, holder string, ttl time.Duration) (Lease, error)
	// AcquireWait is Acquire that waits while another holder has the lease.
	AcquireWait(ctx context.Context, s runlease.Store, runID, holder string, ttl, poll time.Duration) (Lease, error)
	// ClaimSlots claims one slot of each scope for runID.
	ClaimSlots(ctx context.Context, s runlease.Store, runID string, scopes []ScopeSpec, ttl time.Duration) (Slots, error)
	// ClaimSlotsWait waits in the queues of scopes until runID holds the
	// units it asks of each, through l (fenced, with the lease's TTL) when
	// l is not nil, and unfenced with spec.TTL otherwise.
	ClaimSlotsWait(ctx context.Context, s runlease.Store, l Lease, runID string, scopes []ScopeSpec, spec WaitSpec) (Slots, error)
	// Prune removes the rows that expired or were released before now -
	// olderThan, and returns the run ids of the lease rows it removed.
	Prune(ctx context.Context, s runlease.Store, olderThan time.Duration) ([]string, error)
	// NewRenewer returns a Renewer to share among keepers.
	NewRenewer() Renewer
	// Keep starts a keeper of l on r, or on a Renewer of its own when r is
	// nil.
	Keep(ctx context.Context, r Renewer, l Lease, spec KeepSpec) (Keeper, error)
	// IsKeeperStopped reports whether err says a keeper was stopped rather
	// than lost.
	IsKeeperStopped(err error) bool
	// SetJitter makes the library draw the random part of its backoff and
	// poll intervals from draw (nil: its own random source), so that a
	// schedule's fake times depend on its seed alone.
	SetJitter(draw func(n int64) int64)
}

// Lease is a held lease.
type Lease interface {
	RunID() string
	Holder() string
	Fence() uint64
	Renew(ctx context.Context) error
	Write(ctx context.Context, ops ...runlease.Op) error
	Release(ctx context.Context) error
}

// Keeper renews a lease in the background.
type Keeper interface {
	Err() error
	Context() context.Context
	TrustedUntil() time.Time
	Stop()
	Release(ctx context.Context) error
}

// Renewer serves many keepers.
type Renewer interface {
	Close()
}

// Slots is the set of slots a run holds.
type Slots interface {
	RunID() string
	Renew(ctx context.Context) error
	Release(ctx context.Context) error
	// Held lists the slots the run believes it holds.
	Held() []HeldSlot
	// TrustedUntil is when the run stops trusting the slots unless a
	// renewal succeeds first.
	TrustedUntil() time.Time
}

// HeldSlot is one slot a Slots value believes it holds.
type HeldSlot struct {
	Scope string
	Key   string
	Until time.Time // the expiry of the row it last wrote, by the store clock
}

// ScopeSpec names a scope and the limit the claiming host enforces.
type ScopeSpec struct {
	Name  string
	Limit int
	// Units is how many units a claim takes (Scope.Take); 0 claims one
	// without calling Take.
	Units int
}

// units is how many units the spec asks for.
func (sc ScopeSpec) units() int { return max(sc.Units, 1) }

// WaitSpec says how a ClaimSlotsWait queues.
type WaitSpec struct {
	TTL       time.Duration // the claim's TTL, for the unfenced form
	Priority  int
	Principal string // passed with WithFairShare when Weight is not 0
	Weight    int
	Poll      time.Duration // WithWaitPoll
}

// KeepSpec says how to keep a lease.
type KeepSpec struct {
	Slots Slots         // kept beside the lease when not nil
	TTL   time.Duration // a TTL option passed to Keep when not zero
	// Strict keeps Slots with KeepSlotsStrict: a kept slot lost ends the
	// keeper.
	Strict bool
	// Lost is called when the keeper loses its lease.
	Lost func(err error)
	// SlotsLost is called with the slot run and keys of lost slots, and the
	// error that reports them.
	SlotsLost func(slotRun string, keys []string, err error)
	// Renewed, when not nil, is called after each renewal attempt of the
	// keeper, with its error.
	Renewed func(err error)
}
