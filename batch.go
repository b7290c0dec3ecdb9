package runlease

import "context"

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
