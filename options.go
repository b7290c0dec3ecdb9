package runlease

import (
	"context"
	"errors"
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
)

// Option configures [Acquire], [ClaimSlots], [Peek] and [Occupancy].
type Option func(*options)

type options struct {
	ttl time.Duration
	now func() time.Time
}

// WithTTL sets how long the lease or slots stay held without renewal. The
// default is [DefaultTTL]; values outside [MinTTL, MaxTTL] make the call fail
// with [ErrInvalidArgument] before anything is written. Whole milliseconds
// count: the rows store milliseconds.
func WithTTL(ttl time.Duration) Option {
	return func(o *options) { o.ttl = ttl }
}

// WithClock sets the clock that stamps and judges expiry, in place of the
// local wall clock. Every party sharing a store must judge expiry by the
// same clock; tests use this to move time without sleeping.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

func buildOptions(opts []Option) (options, error) {
	o := options{ttl: DefaultTTL, now: time.Now}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.ttl < MinTTL || o.ttl > MaxTTL {
		return o, invalidArg("ttl", "%v is outside [%v, %v]", o.ttl, MinTTL, MaxTTL)
	}
	if o.now == nil {
		return o, invalidArg("clock", "nil")
	}
	return o, nil
}

func (o options) nowMS() int64 { return o.now().UnixMilli() }

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
	if err == nil || !IsOutcomeUnknown(err) {
		return ok, err
	}
	cur, found, rerr := s.MetaGet(ctx, key)
	switch {
	case rerr != nil:
		return false, errors.Join(err, rerr)
	case found && cur == value:
		return true, nil
	case expected == nil && !found, expected != nil && found && cur == *expected:
		return false, err
	}
	return false, nil
}

// deleteResolved is MetaDelete with an unknown outcome resolved the same
// way: the row gone or replaced means it is no longer the expected row.
func deleteResolved(ctx context.Context, s Store, key, expected string) (bool, error) {
	ok, err := s.MetaDelete(ctx, key, expected)
	if err == nil || !IsOutcomeUnknown(err) {
		return ok, err
	}
	cur, found, rerr := s.MetaGet(ctx, key)
	switch {
	case rerr != nil:
		return false, errors.Join(err, rerr)
	case found && cur == expected:
		return false, err
	case !found:
		return true, nil
	}
	return false, nil
}
