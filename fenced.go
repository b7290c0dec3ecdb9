package runlease

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
)

// Write applies ops to the caller's own keys in the store if and only if
// this lease still holds, and renews the lease in the same atomic batch: the
// writes land together with the renewal, conditional on the exact row this
// lease last wrote, or not at all. A driver that stalled and was replaced
// gets a [*LeaseLostError] (RUN-E021) and nothing is written: its checkpoint
// cannot land behind its successor's.
//
// Values are bytes: any value up to [MaxValueLen] bytes that is UTF-8 text
// without NUL, and does not start with [BinaryValuePrefix], is stored as it
// is, and any other value (protobuf, gob, compressed state) up to
// [MaxBinaryValueLen] bytes is stored in a text envelope, base64 behind
// that prefix, that every store keeps. [Lease.Read] and [DecodeValue]
// return it byte for byte.
//
// The store must implement [Batcher] (both built-in stores do); otherwise,
// and for keys in the library's own namespaces ("runlease:", "runslot:"),
// for no ops or more than MaxBatch-1, or for keys a Store refuses, Write
// fails with [ErrInvalidArgument] and writes nothing. Faults are handled as
// by [Lease.Renew]: an unknown outcome is resolved by reading the lease row
// back, since the user's writes landed if and only if the renewal did (every
// row a lease writes differs from every row it wrote before, so the row read
// back says which write landed). Write returns nil only when the writes
// landed. When the lease row is found unchanged, the fault is returned and
// its outcome stays unknown (the batch may still land); when it holds an
// earlier row of this lease's own, the batch did not land and never will,
// and Write sends it again. If the read finds another holder's row, the
// writes may have landed just before the takeover: the error then matches
// both [ErrLeaseLost] and [ErrOutcomeUnknown]. Once [Lease.Release] has
// been called, Write fails with [ErrReleased] at once and writes nothing,
// without asking the store, even when that release failed.
//
// A run's checkpoint, written only while the run is still this driver's:
//
//	err := lease.Write(ctx, runlease.Put("ckpt:"+runID, string(state)))
//	if errors.Is(err, runlease.ErrLeaseLost) {
//		return err // another driver has the run: stop, write nothing more
//	}
func (l *Lease) Write(ctx context.Context, ops ...Op) error {
	return l.WriteIf(ctx, nil, ops...)
}

// WriteIf is [Lease.Write] with conditions on the caller's own keys, checked
// in the same atomic batch: the ops land, with the renewal, only if the
// lease holds and every condition holds. A condition's value is compared
// with what [Lease.Write] stored, so binary values can be compared too.
//
// When the lease holds but a condition does not, WriteIf returns
// [ErrConditionFailed] (RUN-E025): nothing was written and the lease was not
// renewed. A checkpoint advanced only from the one it was computed from:
//
//	prev, _, err := lease.Read(ctx, "ckpt:"+runID)
//	…
//	err = lease.WriteIf(ctx, []runlease.Cond{runlease.IfEquals("ckpt:"+runID, prev)},
//		runlease.Put("ckpt:"+runID, next))
//
// At most MaxBatch-1 conditions; keys follow the rules of Write's.
func (l *Lease) WriteIf(ctx context.Context, conds []Cond, ops ...Op) error {
	if _, ok := l.store.(Batcher); !ok {
		return invalidArg("store", "%T does not implement runlease.Batcher, which fenced writes need", l.store)
	}
	if len(ops) >= MaxBatch || len(conds) >= MaxBatch {
		return invalidArg("ops", "%d ops and %d conditions; a fenced write takes at most %d of each", len(ops), len(conds), MaxBatch-1)
	}
	b := &userBatch{conds: make([]Cond, len(conds)), ops: make([]Op, len(ops))}
	for i, c := range conds {
		if err := checkUserKey(c.Key); err != nil {
			return err
		}
		b.conds[i] = c
		if c.Value != nil {
			v, err := encodeValue(*c.Value)
			if err != nil {
				return err
			}
			b.conds[i].Value = &v
		}
	}
	for i, op := range ops {
		if err := checkUserKey(op.Key); err != nil {
			return err
		}
		b.ops[i] = op
		if !op.Delete {
			v, err := encodeValue(op.Value)
			if err != nil {
				return err
			}
			b.ops[i].Value = v
		}
	}
	if err := CheckBatch(b.conds, b.ops); err != nil {
		return err
	}
	return l.update(ctx, kindWrite, b)
}

// Read returns the value of one of the caller's own keys, as a fenced write
// stored it (decoded byte for byte; see [DecodeValue]), and found false when
// the key is absent, only if this lease held at the instant of the read: the
// lease row is read after the key and must still be a row of this lease's
// own, and no other driver can write the key through a fenced write without
// replacing that row first. When it is not, Read returns the
// [*LeaseLostError] of the loss, and every later call fails the same way,
// as after [Lease.Renew].
//
// Read waits for a write of the lease in flight (or for ctx), and does not
// renew the lease. It judges ownership, not the trust window: a driver about
// to act on what it read checks its [Keeper]'s Err as before any side effect.
// Faults are returned as they are and leave the lease as it was.
func (l *Lease) Read(ctx context.Context, key string) (value string, found bool, err error) {
	if err := checkUserKey(key); err != nil {
		return "", false, err
	}
	if err := l.lock(ctx); err != nil {
		return "", false, err
	}
	defer l.unlock()
	l.mu.Lock()
	lost, releasing, seen := l.lost, l.releasing, l.seen
	l.mu.Unlock()
	switch {
	case lost != nil:
		return "", false, lost
	case releasing:
		return "", false, l.errReleasing()
	}
	stored, found, err := l.store.MetaGet(ctx, key)
	if err != nil {
		return "", false, l.fault(ctx, err)
	}
	cur, rowFound, err := l.store.MetaGet(ctx, l.key)
	if err != nil {
		return "", false, l.fault(ctx, err)
	}
	if !rowFound || cur != seen {
		if err := l.judgeChanged(cur, rowFound); err != nil {
			return "", false, err
		}
	}
	if !found {
		return "", false, nil
	}
	value, err = DecodeValue(stored)
	if err != nil {
		return "", false, corruptRow(key, stored, err)
	}
	return value, true, nil
}

// judgeChanged judges a lease row found in place of the one this lease last
// wrote: a row of this lease's own (an earlier write whose reply was lost)
// is adopted and nil returned; anything else is the lease's loss. The write
// token is held.
func (l *Lease) judgeChanged(cur string, found bool) error {
	if !found {
		return l.lose(&LeaseLostError{RunID: l.RunID(), Cause: ErrRowChanged})
	}
	row, derr := decodeRow(cur)
	switch {
	case derr == nil && l.ownRow(row):
		l.adopt(cur)
		return nil
	case derr == nil && row.Holder == "" && row.Fence == l.fence:
		return l.lose(&LeaseLostError{RunID: l.RunID(), Cause: ErrReleased, Fence: l.fence}, cur)
	}
	return l.lose(lostFrom(l.RunID(), row, derr))
}

// checkUserKey refuses keys a fenced write or read may not touch: keys a
// Store refuses, and the library's own namespaces.
func checkUserKey(key string) error {
	if strings.HasPrefix(key, LeasePrefix) || strings.HasPrefix(key, SlotPrefix) {
		return invalidArg("key", "%q is in runlease's own namespace", key)
	}
	return CheckKey(key)
}

// BinaryValuePrefix starts the stored form of a value that a Store cannot
// keep as it is: the value's standard base64 follows it. [Lease.Write]
// stores every value that is not UTF-8 text without NUL, or that starts with
// this prefix itself, this way.
const BinaryValuePrefix = "runlease-b64:"

// MaxBinaryValueLen is the longest value [Lease.Write] takes that must be
// stored in the binary envelope (any value that is not UTF-8 text without
// NUL, and text that starts with [BinaryValuePrefix]): its stored form is
// then at most [MaxValueLen]. Other text may be up to MaxValueLen bytes.
const MaxBinaryValueLen = (MaxValueLen - len(BinaryValuePrefix)) / 4 * 3

// encodeValue returns the stored form of a fenced write's value.
func encodeValue(v string) (string, error) {
	if CheckValue(v) == nil && !strings.HasPrefix(v, BinaryValuePrefix) {
		return v, nil
	}
	if len(v) > MaxBinaryValueLen {
		return "", invalidArg("value", "%d bytes of a value kept in the binary envelope (not UTF-8 text without NUL, or starting with %q); the limit is %d (%d for other text)",
			len(v), BinaryValuePrefix, MaxBinaryValueLen, MaxValueLen)
	}
	return BinaryValuePrefix + base64.StdEncoding.EncodeToString([]byte(v)), nil
}

// DecodeValue returns the value a fenced write stored as stored, byte for
// byte: stored itself, unless it is in the binary envelope (it starts with
// [BinaryValuePrefix]), which is decoded. Code that reads a fenced write's
// keys straight from a Store calls it; [Lease.Read] does. An envelope that
// does not decode is an error.
func DecodeValue(stored string) (string, error) {
	b64, ok := strings.CutPrefix(stored, BinaryValuePrefix)
	if !ok {
		return stored, nil
	}
	v, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return "", fmt.Errorf("binary value envelope does not decode: %w", err)
	}
	return string(v), nil
}
