package runlease

import (
	"context"
	"errors"
	"strings"
	"time"
)

// Leases lists the lease row of every run in the store, in run id order, for
// status surfaces and operators. Rows that do not parse are listed with
// Corrupt set. Only the [WithClock] option matters: it judges Live.
func Leases(ctx context.Context, store Store, opts ...Option) ([]LeaseInfo, error) {
	o, err := buildOptions(store, opts, optsRead, "Leases")
	if err != nil {
		return nil, err
	}
	rows, err := store.MetaScan(ctx, LeasePrefix)
	if err != nil {
		return nil, err
	}
	now := o.nowMS()
	out := make([]LeaseInfo, 0, len(rows))
	for _, r := range rows {
		out = append(out, leaseInfo(strings.TrimPrefix(r.Key, LeasePrefix), r.Value, now))
	}
	return out, nil
}

// leaseInfo describes the stored row raw of runID at nowMS.
func leaseInfo(runID, raw string, nowMS int64) LeaseInfo {
	info := LeaseInfo{RunID: runID, Found: true, Row: raw}
	row, err := decodeRow(raw)
	if err != nil {
		info.Corrupt = true
		return info
	}
	info.Holder, info.Fence, info.Until = row.Holder, row.Fence, row.until()
	info.Live, info.Released = row.live(nowMS), row.Holder == ""
	return info
}

// ForceRelease is an operator's release of a stuck lease: it writes a
// released tombstone over the row info was read from (by [Peek] or
// [Leases]), keeping its fence so that the next holder continues above it.
// The holder of a force-released lease learns of it at its next renewal
// ([ErrReleased]).
//
// Releasing a released lease does nothing and succeeds: ForceRelease
// returns nil, writing nothing, when info is already released, and when the
// row changed since it was read into a released tombstone at a fence no
// lower than info's (the holder released it meanwhile). Otherwise it is
// conditional on the exact row read: if the row changed — the holder
// renewed, or someone else took over — nothing is written and the error is
// a [*LeaseLostError] describing the row now (cause [ErrRowChanged] when
// the holder is unchanged, [ErrTakenOver] otherwise).
//
// A row that is absent or corrupt is refused with [ErrInvalidArgument]: a
// corrupt row needs a person to look at it, not a tombstone. ForceRelease
// takes one option, [WithClock], which dates the tombstone.
func ForceRelease(ctx context.Context, store Store, info LeaseInfo, opts ...Option) error {
	_, err := forceRelease(ctx, store, info, opts, "ForceRelease")
	if errors.Is(err, errReleasedByEither) {
		return nil
	}
	return err
}

// ForceReleaseOutcome is [ForceRelease] that also reports whether this call
// wrote the tombstone: wrote is false when the lease was released already,
// before or while the call ran, and whenever err is not nil.
//
// When the write's reply is lost and the row read back is the very
// tombstone it sent, the lease is released but no one can tell by whom:
// the holder's own Release in the same millisecond writes the same bytes.
// ForceReleaseOutcome then returns a [*StorageError] matching
// [ErrOutcomeUnknown], and ForceRelease returns nil, since the lease is
// released either way.
func ForceReleaseOutcome(ctx context.Context, store Store, info LeaseInfo, opts ...Option) (wrote bool, err error) {
	return forceRelease(ctx, store, info, opts, "ForceReleaseOutcome")
}

// forceRelease is ForceReleaseOutcome, refusing the options that fn, the
// call made, does not take.
func forceRelease(ctx context.Context, store Store, info LeaseInfo, opts []Option, fn string) (bool, error) {
	o, err := buildOptions(store, opts, optsRead, fn)
	if err != nil {
		return false, err
	}
	switch {
	case !info.Found || info.Row == "":
		return false, invalidArg("info", "run %q has no lease row read by Peek or Leases", info.RunID)
	case info.Corrupt:
		return false, invalidArg("info", "run %q: the row does not parse; inspect it rather than release it", info.RunID)
	case info.Released:
		return false, nil
	}
	key := LeasePrefix + info.RunID
	tomb := leaseRow{Fence: info.Fence, UntilMS: min(o.nowMS(), info.Until.UnixMilli())}.encode()
	ok, err := forceCAS(ctx, store, key, info.Row, tomb)
	if err != nil || ok {
		return ok, err
	}
	e := &LeaseLostError{RunID: info.RunID, Cause: ErrRowChanged}
	now, nerr := Peek(ctx, store, info.RunID, WithClock(o.now))
	if nerr != nil || !now.Found || now.Corrupt {
		return false, e
	}
	// Fences never go backwards, so a tombstone at this fence or above
	// means the lease read was given up (by its holder, or by a later
	// holder that took over and released in turn): what the operator
	// asked for is done.
	if now.Released && now.Fence >= info.Fence {
		return false, nil
	}
	e.Holder, e.Fence, e.Until = now.Holder, now.Fence, now.Until
	if now.Holder != info.Holder || now.Fence != info.Fence {
		e.Cause = ErrTakenOver
	}
	return false, e
}

// errReleasedByEither is the cause of a force release whose outcome is
// unknown and whose tombstone is in place (see ForceReleaseOutcome).
var errReleasedByEither = errors.New("the lease is released, by this call or by its holder in the same millisecond: the two write the same row")

// forceCAS writes tomb over row at key, waking waiters when the store can,
// and resolves an unknown outcome by reading back: row still there means
// not applied (yet), the tombstone means released by someone
// (errReleasedByEither), anything else means not applied.
func forceCAS(ctx context.Context, store Store, key, row, tomb string) (bool, error) {
	var ok bool
	var err error
	if n, isN := store.(Notifier); isN {
		ok, err = n.MetaCASNotify(ctx, key, &row, tomb)
	} else {
		ok, err = store.MetaCAS(ctx, key, &row, tomb)
	}
	if err == nil || !IsOutcomeUnknown(err) {
		return ok, err
	}
	cur, found, rerr := store.MetaGet(ctx, key)
	switch {
	case rerr != nil:
		return false, errors.Join(err, rerr)
	case found && cur == tomb:
		return false, &StorageError{Op: "MetaCAS", Key: key, Unknown: true, Err: errReleasedByEither}
	case found && cur == row:
		return false, err
	}
	return false, nil
}

// Pruned lists what [Prune] removed, or what [PruneCandidates] would remove.
type Pruned struct {
	Leases []string // run ids whose lease rows were removed
	Slots  []string // keys of the slot rows removed
	// Queue holds the keys of the admission-queue rows removed: entries
	// left by waiters that died or stalled ([QueuePrefix], and
	// [LegacyQueuePrefix] of earlier versions), places of runs that no
	// longer wait ([PlacePrefix]), and fair-share marks ([FairPrefix]) and
	// clocks ([ClockPrefix]) that no waiting entry needs.
	Queue []string
}

// add records the row at key under Leases, Slots or Queue.
func (p *Pruned) add(key string) {
	if id, ok := strings.CutPrefix(key, LeasePrefix); ok {
		p.Leases = append(p.Leases, id)
	} else if strings.HasPrefix(key, SlotPrefix) {
		p.Slots = append(p.Slots, key)
	} else {
		p.Queue = append(p.Queue, key)
	}
}

// Len is the number of rows p lists.
func (p Pruned) Len() int { return len(p.Leases) + len(p.Slots) + len(p.Queue) }

// Prune removes lease rows that were released or expired, and slot rows,
// queue entries and fair-share marks that expired, before now - olderThan.
// Each delete is conditional on the row read, so a lease taken meanwhile,
// or a queue entry its waiter renewed, is never removed. Live rows and rows
// that do not parse are never removed. An expired queue entry already holds
// no place: its waiter, if it still runs, re-queues at the back whether or
// not the row is there.
//
// Pruning resets history: a released lease row keeps its run's fence, and a
// run id whose row was pruned starts again at fence 1 if it is ever
// acquired again. Prune only run ids that will not be reused, or whose
// fences no outside system still checks. A [Lease] value from before the
// prune is never confused with the new acquisition, even one by its own
// holder at the same fence (see CONCURRENCY.md, rule 5). olderThan must not
// be negative. Prune takes one option, [WithClock], which says when now is.
func Prune(ctx context.Context, store Store, olderThan time.Duration, opts ...Option) (Pruned, error) {
	var p Pruned
	var errs []error
	err := prunable(ctx, store, olderThan, opts, "Prune", func(r Row) {
		ok, err := deleteResolved(ctx, store, r.Key, r.Value)
		switch {
		case err != nil:
			errs = append(errs, err)
		case ok:
			forgetReleased(store, r.Key)
			p.add(r.Key)
		}
	})
	if err != nil {
		return p, err
	}
	return p, errors.Join(errs...)
}

// PruneCandidates lists the rows [Prune] would remove now with the same
// arguments, and removes nothing, so that an operator can review them
// first. Rows may change before Prune runs; Prune decides again on the rows
// it reads then. It fails as Prune does for invalid arguments and storage
// faults.
func PruneCandidates(ctx context.Context, store Store, olderThan time.Duration, opts ...Option) (Pruned, error) {
	var p Pruned
	err := prunable(ctx, store, olderThan, opts, "PruneCandidates", func(r Row) { p.add(r.Key) })
	return p, err
}

// prunable calls visit with every row that Prune removes: rows that parse,
// hold no live lease, and expired before now - olderThan. fn names the
// call made, for the options it refuses.
func prunable(ctx context.Context, store Store, olderThan time.Duration, opts []Option, fn string, visit func(Row)) error {
	o, err := buildOptions(store, opts, optsRead, fn)
	if err != nil {
		return err
	}
	if olderThan < 0 {
		return invalidArg("olderThan", "negative: %v", olderThan)
	}
	// horizon <= now, so a row that ended before it holds nothing live.
	nowMS := o.nowMS()
	horizon := nowMS - olderThan.Milliseconds()
	// The line is read first: a place, mark or clock is pruned only when
	// the entries it speaks for are gone (queueUse).
	var use queueUse
	for _, prefix := range []string{QueuePrefix, ClockPrefix, LeasePrefix, SlotPrefix, LegacyQueuePrefix, PlacePrefix, FairPrefix} {
		rows, err := store.MetaScan(ctx, prefix)
		if err != nil {
			return err
		}
		switch prefix {
		case QueuePrefix:
			use = lineUse(rows, nowMS)
		case ClockPrefix:
			use.clocks(rows)
		}
		for _, r := range rows {
			if until, ok := endOf(prefix, r.Value); ok && until < horizon && use.done(prefix, r) {
				visit(r)
			}
		}
	}
	return nil
}

// queueUse is what the line holds live, for Prune: the live entries by
// key, and per scope the smallest tag of a live entry.
type queueUse struct {
	live   map[string]bool
	minTag map[string]int64
	clock  map[string]int64 // each scope's clock, as read
}

// clocks records the scopes' clocks.
func (u *queueUse) clocks(rows []Row) {
	u.clock = map[string]int64{}
	for _, r := range rows {
		scope, rest, ok := cutScopeSegment(r.Key+":", ClockPrefix)
		if m, err := decodeMark(r.Value); ok && rest == "" && err == nil {
			u.clock[scope] = m.Finish
		}
	}
}

func lineUse(rows []Row, nowMS int64) queueUse {
	u := queueUse{live: map[string]bool{}, minTag: map[string]int64{}}
	for _, r := range rows {
		scope, _, ok := parseLineKey(r.Key)
		if !ok {
			continue
		}
		e, err := decodeLineRow(scope, r)
		if err != nil || !e.live(nowMS) {
			continue
		}
		u.live[r.Key] = true
		if t, seen := u.minTag[scope]; !seen || e.Tag < t {
			u.minTag[scope] = e.Tag
		}
	}
	return u
}

// done reports whether the row r under prefix speaks for nothing the line
// still holds: a place whose entry is not live; a mark of a scope where
// nothing waits (the scope starts over, forgiving what a principal ran
// ahead, as its clock goes too), or one at or behind its scope's clock
// and every live tag of its scope (so no entry of its principal waits,
// and every virtual time a claim of the scope can start from is past
// it); a clock of a scope where nothing waits. Entries, leases and slots are judged by their expiry
// alone.
func (u queueUse) done(prefix string, r Row) bool {
	switch prefix {
	case PlacePrefix:
		p, _ := decodePlace(r.Value)
		return !u.live[p.Key]
	case FairPrefix:
		scope, _, ok := cutScopeSegment(r.Key, FairPrefix)
		m, _ := decodeMark(r.Value)
		t, waiting := u.minTag[scope]
		return ok && (!waiting || m.Finish <= u.clock[scope] && m.Finish <= t)
	case ClockPrefix:
		scope, rest, ok := cutScopeSegment(r.Key+":", ClockPrefix)
		_, waiting := u.minTag[scope]
		return ok && rest == "" && !waiting
	}
	return true
}

// endOf is when the row under prefix stops counting (its until_ms), and
// false when the row does not parse.
func endOf(prefix, value string) (int64, bool) {
	switch prefix {
	case QueuePrefix, LegacyQueuePrefix:
		e, err := decodeEntry(value)
		return e.UntilMS, err == nil
	case FairPrefix, ClockPrefix:
		m, err := decodeMark(value)
		return m.UntilMS, err == nil
	case PlacePrefix:
		p, err := decodePlace(value)
		return p.UntilMS, err == nil
	}
	row, err := decodeRow(value)
	return row.UntilMS, err == nil
}
