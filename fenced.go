package runlease

import (
	"context"
	"strings"
)

// Write applies ops to the caller's own keys in the store if and only if
// this lease still holds, and renews the lease in the same atomic batch: the
// writes land together with the renewal, conditional on the exact row this
// lease last wrote, or not at all. A driver that stalled and was replaced
// gets a [*LeaseLostError] (RUN-E021) and nothing is written: its checkpoint
// cannot land behind its successor's.
//
// The store must implement [Batcher] (both built-in stores do); otherwise,
// and for keys in the library's own namespaces ("runlease:", "runslot:"),
// for no ops or more than MaxBatch-1, or for keys and values a Store
// refuses, Write fails with [ErrInvalidArgument] and writes nothing. Faults
// are handled as by [Lease.Renew]: an unknown outcome is resolved by reading
// the lease row back, since the user's writes landed if and only if the
// renewal did (every row a lease writes differs from every row it wrote
// before, so the row read back says which write landed). Write returns nil
// only when the writes landed. When the lease row is found unchanged, the
// fault is returned and its outcome stays unknown (the batch may still
// land); when it holds an earlier row of this lease's own, the batch did not
// land and never will, and Write sends it again. If the read finds another
// holder's row, the writes may have landed just before the takeover: the
// error then matches both [ErrLeaseLost] and [ErrOutcomeUnknown].
//
// A run's checkpoint, written only while the run is still this driver's:
//
//	err := lease.Write(ctx, runlease.Put("ckpt:"+runID, string(state)))
//	if errors.Is(err, runlease.ErrLeaseLost) {
//		return err // another driver has the run: stop, write nothing more
//	}
func (l *Lease) Write(ctx context.Context, ops ...Op) error {
	if _, ok := l.store.(Batcher); !ok {
		return invalidArg("store", "%T does not implement runlease.Batcher, which fenced writes need", l.store)
	}
	if len(ops) >= MaxBatch {
		return invalidArg("ops", "%d ops; a fenced write takes at most %d", len(ops), MaxBatch-1)
	}
	for _, op := range ops {
		if strings.HasPrefix(op.Key, LeasePrefix) || strings.HasPrefix(op.Key, SlotPrefix) {
			return invalidArg("ops", "key %q is in runlease's own namespace", op.Key)
		}
	}
	if err := CheckBatch(nil, ops); err != nil {
		return err
	}
	return l.update(ctx, kindWrite, ops)
}
