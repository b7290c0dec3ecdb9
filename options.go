package runlease

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"
)

// Lease lengths.
const (
	// DefaultTTL is how long a lease or slot is held without renewal when no
	// [WithTTL] option is given.
	DefaultTTL = 10 * time.Minute
	// MinTTL is the shortest TTL [WithTTL] accepts. Below it, ordinary
	// scheduling jitter between two renewals looks like a dead driver, and a
	// takeover mid-flight is worse than a slow recovery.
	MinTTL = 5 * time.Second
	// MaxTTL is the longest TTL [WithTTL] accepts. A run that cannot renew
	// once a day is stuck, and its lease should not outlive the evidence.
	MaxTTL = 24 * time.Hour
)

// Prefixes of the rows this package keeps in a Store.
const (
	LeasePrefix = "runlease:" // a run's lease: runlease:<run id>
	SlotPrefix  = "runslot:"  // a slot: runslot:<scope>:<k>
	// WaitPrefix starts the rows a Postgres store keeps of the keys its
	// subscribers wait on (see [PostgresStore.Subscribe]).
	WaitPrefix = "runwait:"
)

// Option configures [Acquire], [AcquireWait], [ClaimSlots], [Keep], [Peek]
// and the other calls of this package. Each call documents the options it
// takes; an option a call cannot apply makes it fail with
// [ErrInvalidArgument] rather than be ignored (a TTL given to Keep, for
// example, could not change the rows the lease already wrote).
type Option func(*options)

// optionSet records which options a caller gave, so that a call can refuse
// the ones that do not apply to it and tell an explicit zero from a default.
type optionSet uint16

const (
	optTTL optionSet = 1 << iota
	optClock
	optPoll
	optInterval
	optMargin
	optSlots
	optHooks
	optLogger
	optPriority
	optFairShare
)

// Which calls take which options.
const (
	optsAcquire = optTTL | optClock | optHooks | optLogger
	optsWait    = optsAcquire | optPoll
	optsRank    = optPriority | optFairShare
	optsClaim   = optTTL | optClock | optHooks | optLogger | optsRank
	optsQueue   = optsClaim | optPoll
	optsKeep    = optInterval | optMargin | optSlots | optHooks | optLogger
	optsRead    = optClock
)

var optionNames = []struct {
	bit  optionSet
	name string
}{
	{optTTL, "WithTTL"}, {optClock, "WithClock"}, {optPoll, "WithWaitPoll"},
	{optInterval, "KeepInterval"}, {optMargin, "KeepMargin"}, {optSlots, "KeepSlots"},
	{optHooks, "WithHooks"}, {optLogger, "WithLogger"},
	{optPriority, "WithPriority"}, {optFairShare, "WithFairShare"},
}

type options struct {
	set optionSet // the options given

	ttl time.Duration
	now func() time.Time
	// uncertainty is how far now may be from the store's clock.
	uncertainty time.Duration

	poll time.Duration // read by AcquireWait and ClaimSlotsWait only

	// Read by claims of slots: where they rank in a scope's queue.
	priority  int
	principal string
	weight    int

	// Read by Keep only.
	interval, margin time.Duration
	slots            *Slots
	strictSlots      bool
	hooks            *Hooks // nil: none
	logger           *slog.Logger
}

// leaseOptions is what a Lease keeps of the options it was acquired with:
// what its own calls read, and what Keep and claims on it inherit. The
// options only other calls take (a keeper's interval, a claim's rank) are
// not kept, so that a process keeping many leases pays only for these.
type leaseOptions struct {
	ttl, uncertainty time.Duration
	poll             time.Duration
	now              func() time.Time
	hooks            *Hooks
	logger           *slog.Logger
}

func (o options) forLease() leaseOptions {
	return leaseOptions{ttl: o.ttl, uncertainty: o.uncertainty, poll: o.poll,
		now: o.now, hooks: o.hooks, logger: o.logger}
}

// options returns the options a call on the lease starts from; set is
// the options given, which the Lease keeps beside lo.
func (lo leaseOptions) options(set optionSet) options {
	return options{set: set, ttl: lo.ttl, uncertainty: lo.uncertainty, poll: lo.poll,
		now: lo.now, hooks: lo.hooks, logger: lo.logger}
}

func (lo leaseOptions) nowMS() int64 { return lo.now().UnixMilli() }

// WithTTL sets how long the lease or slots stay held without renewal. The
// default is [DefaultTTL]; values outside [MinTTL, MaxTTL] make the call fail
// with [ErrInvalidArgument] before anything is written. Whole milliseconds
// count: the rows store milliseconds.
//
// Acquire, AcquireWait and ClaimSlots take it. A Keeper cannot change the
// TTL of a lease it keeps, so [Keep] refuses it: acquire with the TTL wanted.
func WithTTL(ttl time.Duration) Option {
	return func(o *options) { o.ttl, o.set = ttl, o.set|optTTL }
}

// WithClock sets the clock that stamps and judges expiry, in place of the
// store's clock (see [Clock]) or, for a store without one, the local wall
// clock. Every party sharing a store must judge expiry by the same clock;
// tests use this to move time without sleeping. It must advance at the rate
// of real time for a [Keeper]'s trust window to hold.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		o.now, o.set = now, o.set|optClock
		if o.now == nil { // refused by buildOptions
			o.now = func() time.Time { return time.Time{} }
			o.uncertainty = -1
		}
	}
}

// buildOptions applies opts over the defaults, taking the clock from store
// when it has one and no clock was given. It refuses options outside
// allowed, naming fn, the call that refuses them.
func buildOptions(store Store, opts []Option, allowed optionSet, fn string) (options, error) {
	o := options{ttl: DefaultTTL, poll: DefaultWaitPoll}
	if store == nil {
		return o, invalidArg("store", "nil")
	}
	if !keyable(store) || !keyable(storeIdentity(store)) {
		// Rows are stamped apart per Store value (see lineage.go), which
		// needs a value that keys a map: one that compares, and equals
		// itself (a struct holding a NaN float does not). A pointer
		// always does.
		return o, invalidArg("store", "a %T value cannot be compared: pass a pointer to it", store)
	}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.refuseOutside(allowed, fn); err != nil {
		return o, err
	}
	if o.now == nil {
		o.now = time.Now
		if c, ok := store.(Clock); ok {
			o.now = func() time.Time { t, _ := c.ClockNow(); return t }
			_, o.uncertainty = c.ClockNow()
		}
	}
	if o.ttl < MinTTL || o.ttl > MaxTTL {
		return o, invalidArg("ttl", "%v is outside [%v, %v]", o.ttl, MinTTL, MaxTTL)
	}
	if err := o.checkRank(); err != nil {
		return o, err
	}
	if o.uncertainty < 0 {
		return o, invalidArg("clock", "nil")
	}
	return o, nil
}

// refuseOutside fails when an option outside allowed was given.
func (o options) refuseOutside(allowed optionSet, fn string) error {
	extra := o.set &^ allowed
	if extra == 0 {
		return nil
	}
	var names []string
	for _, n := range optionNames {
		if extra&n.bit != 0 {
			names = append(names, n.name)
		}
	}
	return invalidArg("options", "%s does not take %s", fn, strings.Join(names, ", "))
}

func (o options) nowMS() int64 { return o.now().UnixMilli() }

// stampMS returns the until_ms of a row written now that holds for ttl: the
// instant now + ttl rounded UP to the millisecond, so that the row never
// expires before the attempt that wrote it is ttl old, and above floor, so
// that every row one holder writes differs from every row it wrote before.
func stampMS(now time.Time, ttl time.Duration, floor int64) int64 {
	end := now.Add(ttl)
	ms := end.UnixMilli()
	if end.After(time.UnixMilli(ms)) {
		ms++
	}
	return max(ms, floor+1)
}

// checkName validates a run id, holder or principal: non-empty UTF-8 text
// without NUL, short enough to make a key.
func checkName(arg, s string, maxLen int) error {
	if s == "" {
		return invalidArg(arg, "empty")
	}
	if len(s) > maxLen {
		return invalidArg(arg, "%d bytes long, the limit is %d", len(s), maxLen)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return invalidArg(arg, "contains NUL")
	}
	if !utf8.ValidString(s) {
		return invalidArg(arg, "not valid UTF-8")
	}
	return nil
}

// Longest run id and holder accepted: a run id must leave room for the
// lease prefix inside MaxKeyLen.
const (
	maxRunIDLen  = MaxKeyLen - len(LeasePrefix)
	maxHolderLen = 1024
)

// casResolved is MetaCAS with an unknown outcome resolved by reading the key
// back: our value there means the write landed; the expected value (or
// absence) still there means it did not, and the fault is returned; anything
// else means another writer moved the row, which is a lost race. So a fault
// is never reported as a lost race, nor a lost race as a fault.
func casResolved(ctx context.Context, s Store, key string, expected *string, value string) (bool, error) {
	ok, err := s.MetaCAS(ctx, key, expected, value)
	return resolveCAS(ctx, s, key, expected, value, ok, err)
}

// resolveCAS resolves the outcome of a conditional write of value at key
// (alone or in a batch) that returned ok and err, as casResolved describes.
func resolveCAS(ctx context.Context, s Store, key string, expected *string, value string, ok bool, err error) (bool, error) {
	return resolveByRead(ctx, s, key, ok, err,
		func(cur string, found bool) bool { return found && cur == value },
		func(cur string, found bool) bool {
			return expected == nil && !found || expected != nil && found && cur == *expected
		})
}

// deleteResolved is MetaDelete with an unknown outcome resolved the same
// way: the row gone means the delete landed, the expected row still there
// means it did not, and a row replaced is a lost race.
func deleteResolved(ctx context.Context, s Store, key, expected string) (bool, error) {
	ok, err := s.MetaDelete(ctx, key, expected)
	return resolveByRead(ctx, s, key, ok, err,
		func(_ string, found bool) bool { return !found },
		func(cur string, found bool) bool { return found && cur == expected })
}

// resolveByRead resolves a write to key that returned ok and err. Unless
// err is an unknown outcome, that is the answer. Otherwise it reads key
// back: a row the write would leave (landed) means it applied; the row as
// it was before (unchanged) means it did not, and err stands; anything else
// means another writer moved the row, a lost race.
func resolveByRead(ctx context.Context, s Store, key string, ok bool, err error,
	landed, unchanged func(cur string, found bool) bool) (bool, error) {
	if err == nil || !IsOutcomeUnknown(err) {
		return ok, err
	}
	cur, found, rerr := s.MetaGet(ctx, key)
	switch {
	case rerr != nil:
		return false, errors.Join(err, rerr)
	case landed(cur, found):
		return true, nil
	case unchanged(cur, found):
		return false, err
	}
	return false, nil
}

// keyable reports whether store can key a map: its value compares, and
// equals itself (a struct holding a NaN float does not).
func keyable(store Store) bool {
	return reflect.ValueOf(store).Comparable() && store == store
}
