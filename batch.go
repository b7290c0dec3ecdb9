package runlease

import (
	"context"
	"slices"
)

// Batcher is an optional capability of a Store: several conditions and
// several writes applied all together or not at all, in the shape of etcd's
// Txn(If…).Then(…). Both built-in stores implement it in one transaction
// (one round trip on Postgres). [Lease.Write] needs it, and [ClaimSlots]
// uses it, when present, so that a refused claim never writes anything.
type Batcher interface {
	// MetaBatch applies ops, in order, if and only if every condition holds
	// at one instant, and reports whether it did. A condition that does not
	// hold is not an error: applied is false and nothing was written.
	//
	// Keys and values follow the Store's rules (see [CheckKey] and
	// [CheckValue]); a batch with an invalid key or value, no ops, more than
	// [MaxBatch] conditions or ops, or two ops on one key is refused with
	// [ErrInvalidArgument] before anything is sent. Faults are reported as
	// for the Store's other methods, with Unknown set when the batch may
	// have been applied. The batch must be atomic and isolated with respect
	// to every other call on the store, including single-key calls from
	// other processes.
	MetaBatch(ctx context.Context, conds []Cond, ops []Op) (applied bool, err error)
}

// MaxBatch is the most conditions, and the most ops, one batch may have.
const MaxBatch = 256

// Cond is a condition of a batch: Key holds exactly *Value, or, when Value
// is nil, Key is absent. Make one with [IfEquals] or [IfAbsent].
type Cond struct {
	Key   string
	Value *string
}

// IfEquals is the condition that key holds exactly value.
func IfEquals(key, value string) Cond { return Cond{Key: key, Value: &value} }

// IfAbsent is the condition that key is absent.
func IfAbsent(key string) Cond { return Cond{Key: key} }

// Op is a write of a batch: Key is set to Value, or removed when Delete is
// set (removing an absent key is not an error). Make one with [Put] or
// [Delete].
type Op struct {
	Key    string
	Value  string
	Delete bool
}

// Put is the op that sets key to value.
func Put(key, value string) Op { return Op{Key: key, Value: value} }

// Delete is the op that removes key.
func Delete(key string) Op { return Op{Key: key, Delete: true} }

// CheckBatch returns an [ErrInvalidArgument] error when a batch breaks the
// rules of [Batcher.MetaBatch], and nil otherwise. Batcher implementations
// call it before touching storage.
func CheckBatch(conds []Cond, ops []Op) error {
	if len(ops) == 0 {
		return invalidArg("ops", "a batch needs at least one op")
	}
	if len(conds) > MaxBatch || len(ops) > MaxBatch {
		return invalidArg("batch", "%d conditions and %d ops; the limit is %d each", len(conds), len(ops), MaxBatch)
	}
	for _, c := range conds {
		if err := CheckKey(c.Key); err != nil {
			return err
		}
		if c.Value != nil {
			if err := CheckValue(*c.Value); err != nil {
				return err
			}
		}
	}
	keys := make([]string, 0, len(ops))
	for _, op := range ops {
		if err := CheckKey(op.Key); err != nil {
			return err
		}
		if err := CheckValue(op.Value); err != nil {
			return err
		}
		keys = append(keys, op.Key)
	}
	slices.Sort(keys)
	for i := 1; i < len(keys); i++ {
		if keys[i] == keys[i-1] {
			return invalidArg("ops", "two ops on key %q", keys[i])
		}
	}
	return nil
}

// batchResolved is MetaBatch with an unknown outcome resolved by reading
// back: if every op's key now holds what the op wrote, the batch landed (no
// one else writes those exact values); if every condition still holds, it
// did not, and the fault is returned. Anything else stays a fault.
func batchResolved(ctx context.Context, b Batcher, s Store, conds []Cond, ops []Op) (bool, error) {
	ok, err := b.MetaBatch(ctx, conds, ops)
	if err == nil || !IsOutcomeUnknown(err) {
		return ok, err
	}
	landed := true
	for _, op := range ops {
		v, found, rerr := s.MetaGet(ctx, op.Key)
		if rerr != nil {
			return false, err
		}
		if op.Delete == found || (!op.Delete && v != op.Value) {
			landed = false
			break
		}
	}
	if landed {
		return true, nil
	}
	return false, err
}
