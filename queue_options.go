package runlease

// WithPriority sets the priority of a claim of slots in the scopes' queues:
// a waiter of higher priority is admitted before every waiter of lower
// priority, whatever their principals or how long they waited. Priorities
// are strict: a steady stream of higher-priority claims holds lower ones
// back for as long as it lasts. The default is 0; values outside
// [-MaxPriority, MaxPriority] are refused with [ErrInvalidArgument].
//
// [ClaimSlots], [Lease.ClaimSlots], [ClaimSlotsWait] and
// [Lease.ClaimSlotsWait] take it.
func WithPriority(priority int) Option {
	return func(o *options) { o.priority, o.set = priority, o.set|optPriority }
}

// WithFairShare names the principal (a tenant, a team, a user) a claim of
// slots is made for, and its weight: among waiters of equal priority,
// principals are admitted in proportion to their weights, so that one
// principal with a thousand queued runs does not hold back another
// principal's first. A principal's k-th waiting run ranks as if it had
// waited (k-1)/weight turns behind that principal's first, and a
// principal's runs are admitted in the order they were queued. Claims that
// name no principal share the principal "" with weight 1. The principal is
// UTF-8 text of at most 256 bytes without NUL, and the weight runs from 1
// to [MaxWeight]; others are refused with [ErrInvalidArgument].
//
// The weight is the claimant's to give, like a scope's limit: hosts that
// give one principal different weights rank its runs by the weight each
// entry was queued with.
func WithFairShare(principal string, weight int) Option {
	return func(o *options) { o.principal, o.weight, o.set = principal, weight, o.set|optFairShare }
}

// weightOr1 is the fair-share weight, 1 when none was given.
func (o options) weightOr1() int {
	if o.set&optFairShare == 0 {
		return 1
	}
	return o.weight
}

func (o options) checkRank() error {
	if o.priority < -MaxPriority || o.priority > MaxPriority {
		return invalidArg("priority", "%d is outside [%d, %d]", o.priority, -MaxPriority, MaxPriority)
	}
	if o.set&optFairShare == 0 {
		return nil
	}
	if o.principal != "" {
		if err := checkName("principal", o.principal, 256); err != nil {
			return err
		}
	}
	if o.weight < 1 || o.weight > MaxWeight {
		return invalidArg("weight", "%d is outside [1, %d]", o.weight, MaxWeight)
	}
	return nil
}
