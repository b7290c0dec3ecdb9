package runlease

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"time"
)

// queueBell is the key whose subscribers are a scope's waiters: the
// scope's queue prefix, a key no entry has.
func queueBell(scope string) string { return queueScopePrefix(scope) }

// deleteRinging deletes key if it holds expected, waking the waiters of
// scope's queue when the store can, with an unknown outcome resolved as by
// deleteResolved.
func deleteRinging(ctx context.Context, s Store, key, expected, scope string) (bool, error) {
	n, ok := s.(DeleteNotifier)
	if !ok {
		return deleteResolved(ctx, s, key, expected)
	}
	deleted, err := n.MetaDeleteNotify(ctx, key, expected, queueBell(scope))
	if err == nil || !IsOutcomeUnknown(err) {
		return deleted, err
	}
	return deleteResolved(ctx, s, key, expected)
}

// ClaimSlotsWait is [ClaimSlots] that waits its turn: when the run cannot
// be admitted in every scope at once, it queues in each and returns once it
// holds the units it asked for in all of them, all or nothing, or returns
// ctx's error itself when ctx ends first (a deadline that has passed
// counts, even before ctx's timer has said so), after taking its place out
// of the queues (a place it could not take out, because the store failed
// or the process died, expires after the TTL).
//
// Order, the same on every store: a higher priority ([WithPriority]) is
// admitted first; among equal priorities, principals share the scopes by
// their weights ([WithFairShare]); a principal's runs rank in the order
// they queued. A waiter that cannot be admitted yet (another scope it
// needs is full, or fewer units are free than it needs) reserves what it
// needs: a waiter ranked behind it is admitted only into units that no
// waiter ahead needs, so it never delays one. See docs/admission.md, "Waiting
// for slots" for the precise rules and the bound on waiting they give.
//
// The waiter keeps its queue entries alive while it waits, renewing them
// every third of the TTL. A waiter stalled past its TTL (a paused process)
// loses its place: it queues again at the back, and the hooks'
// SlotsRequeued and the logger say so. A second call waiting for the same
// run while the first still waits fails with [ErrAlreadyQueued].
//
// Rows that do not parse are never written over. A slot row counts as one
// slot in use, as for ClaimSlots. Another run's queue entry holds no place
// (it ranks nowhere and reserves nothing), and a principal's fair-share
// mark counts as none and stays as it is; but a run whose own entry in a
// scope does not parse cannot queue there, and the call fails with a
// [*CorruptRowError] naming it until a person deletes the row.
//
// It takes the options of ClaimSlots, and [WithWaitPoll]: how often it
// looks again when nothing wakes it sooner. Releases of slots wake it
// through the store when it is a [DeleteNotifier]; the expiry of a slot or
// of a waiter ahead, when it comes sooner than the poll, too.
func ClaimSlotsWait(ctx context.Context, store Store, runID string, scopes []Scope, opts ...Option) (*Slots, error) {
	o, err := buildOptions(store, opts, optsQueue, "ClaimSlotsWait")
	if err != nil {
		return nil, err
	}
	if err := checkName("runID", runID, maxHolderLen); err != nil {
		return nil, err
	}
	return waitSlots(ctx, newSlots(store, runID, o), scopes, 0, batchCommit(store))
}

// batchCommit is the admission of an unfenced wait: one batch, a lost race
// reported as ErrConditionFailed, and errNoBatch on a store without
// batches.
func batchCommit(store Store) func(context.Context, []Cond, []Op) error {
	b, ok := store.(Batcher)
	return func(ctx context.Context, conds []Cond, ops []Op) error {
		if !ok {
			return errNoBatch
		}
		swapped, err := batchResolved(ctx, b, store, conds, ops)
		if err == nil && !swapped {
			return ErrConditionFailed
		}
		return err
	}
}

// ClaimSlotsWait is [ClaimSlotsWait] through the run's lease, as
// [Lease.ClaimSlots] is ClaimSlots: on the lease's store, with its TTL,
// clock, hooks and logger, and, on a store that implements [Batcher], with
// the admission fenced by the lease (a driver whose lease was taken over
// is admitted nowhere, and gets its [*LeaseLostError]). It takes
// [WithPriority], [WithFairShare] and [WithWaitPoll]. A waiter of a newer
// driver of the run (a higher fence) takes the place of an older one's: at
// its rank when it waits for the same principal and priority and in no
// scope the older one did not wait in, else as a new waiter.
func (l *Lease) ClaimSlotsWait(ctx context.Context, scopes []Scope, opts ...Option) (*Slots, error) {
	o, err := l.claimStart(opts, optsRank|optPoll, "Lease.ClaimSlotsWait")
	if err != nil {
		return nil, err
	}
	s := newSlots(l.store, l.RunID(), o)
	if _, ok := l.store.(Batcher); !ok {
		return waitSlots(ctx, s, scopes, l.Fence(), batchCommit(l.store))
	}
	commit := func(ctx context.Context, conds []Cond, ops []Op) error {
		return l.update(ctx, kindWrite, &userBatch{conds: conds, ops: ops})
	}
	return waitSlots(ctx, s, scopes, l.Fence(), commit)
}

// errNoBatch is what commit returns on a store that cannot write a batch:
// the waiter then claims slot by slot and takes its entries out after.
var errNoBatch = errors.New("store is not a Batcher")

// waiter is one call of ClaimSlotsWait: its state belongs to the calling
// goroutine alone, so it needs no lock. It shares with the other waiters of
// the process only the store and its rooms (queue_room.go): their
// subscriptions and their reads of a scope.
type waiter struct {
	s      *Slots
	scopes []Scope
	fence  uint64
	commit func(ctx context.Context, conds []Cond, ops []Op) error

	me queueEntry // the entry as last written; UntilMS 0 before it is queued
	// Per scope: the line key and row of the entry this waiter last wrote
	// there, and its place row ("": none); the fair-share mark its last
	// place wrote and the mark that place moved ("": none; prev nil: the
	// mark was absent), so that a wait that ends gives its share back.
	keys, rows, places []string
	marks              []string
	markPrev           []*string
	// markWas and markPrevWas are, per scope, the mark an earlier place of
	// this waiter wrote and the mark it moved, when the write of the place
	// after it had an outcome never known: the mark may still be the
	// earlier one, and leave gives that back too.
	markWas     []string
	markPrevWas []*string
	// doubt is, per scope, the entry (key and row) of that place whose
	// write's outcome is unknown: a mark row names no writer, and another
	// run of the principal may have written one equal to the one this
	// waiter sent, so leave gives back what it sent only where it finds
	// that entry, which lands with the mark or not at all.
	doubt []Row
	// tried holds the line keys of places whose write was sent but is not
	// known to have landed or failed: leave looks for them too.
	tried map[string]struct{}
	// checkOwn makes the next read the waiter's own, with its place row:
	// an admission refused while queued may mean its place was taken.
	checkOwn bool
	// pending holds the slots of an admission whose outcome is not known
	// (a fault or the end of ctx cut it short): if it landed after all,
	// they are the run's, and a wait that returns an error must free them.
	pending  []*heldSlot
	wrote    bool // an entry write was sent: leaving must look for them
	queued   bool
	wroteAt  time.Time // local monotonic start of the last entry write that landed
	queuedAt time.Time // when the run took its current place

	rooms    []*room       // per scope, the room it waits in
	roomKeys []string      // per scope, the place its room knows it holds ("": none)
	wake     chan struct{} // the rooms' wake-ups, merged: one pending at most
	// fresh is the roomClock tick its next read must follow for its own
	// moves: its last write, or the moment it chose to look. rung is the
	// tick of the latest ring that woke it, which its next read must
	// follow too; kept apart, so that a room may answer it with a
	// hand-over's read (queue_room_hand.go).
	fresh, rung uint64
}

func waitSlots(ctx context.Context, s *Slots, scopes []Scope, fence uint64, commit func(context.Context, []Cond, []Op) error) (*Slots, error) {
	if s.o.poll < MinWaitPoll {
		return nil, invalidArg("poll", "%v is shorter than %v", s.o.poll, MinWaitPoll)
	}
	if err := checkScopes(scopes); err != nil {
		return nil, err
	}
	if len(scopes) == 0 {
		return s, nil
	}
	if n := claimUnits(scopes) + queueRowsPerScope*len(scopes); n > MaxBatch {
		return nil, invalidArg("scopes", "%d units and queue rows; a waiting claim writes at most %d", n, MaxBatch)
	}
	for _, sc := range scopes {
		if maxLineKeyLen(sc.name, s.runID) > MaxKeyLen {
			return nil, invalidArg("runID", "run %q with scope %q makes a queue key longer than %d bytes", s.runID, sc.name, MaxKeyLen)
		}
	}
	var id [12]byte
	_, _ = crand.Read(id[:])
	n := len(scopes)
	w := &waiter{s: s, scopes: scopes, fence: fence, commit: commit, keys: make([]string, n), rows: make([]string, n),
		places: make([]string, n), marks: make([]string, n), markPrev: make([]*string, n),
		markWas: make([]string, n), markPrevWas: make([]*string, n), doubt: make([]Row, n), tried: map[string]struct{}{}}
	w.me = queueEntry{Run: s.runID, Waiter: hex.EncodeToString(id[:]), Fence: fence,
		Principal: s.o.principal, Weight: s.o.weightOr1(), Priority: s.o.priority}
	for _, sc := range scopes {
		w.me.Scopes = append(w.me.Scopes, sc.name)
	}
	w.wake = make(chan struct{}, 1)
	// Deferred first: a store that panics in Subscribe leaves the rooms
	// joined before it, and no count behind.
	defer func() { leaveRooms(w.rooms, w.wake) }()
	joinRooms(s.store, scopes, w.wake, &w.rooms)
	w.roomKeys = make([]string, len(scopes))
	w.fresh = roomTick()
	held, err := w.run(ctx)
	if err != nil {
		// One bound for both: the call returns within leaveTimeout of the
		// end of its context, whatever the store does meanwhile.
		cleanup, cancel := cleanupContext(ctx, leaveTimeout)
		w.leave(cleanup)
		w.freePending(cleanup)
		cancel()
		if cerr := ctxEnded(ctx); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	s.held = held
	return s, nil
}

// run waits until the run is admitted in every scope, and returns the
// slots it then holds.
func (w *waiter) run(ctx context.Context) ([]*heldSlot, error) {
	raced := false
	giveTurn := func() {}
	defer func() { giveTurn() }()
	for try := 0; ; try++ {
		giveTurn()
		giveTurn = func() {}
		w.syncRooms()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !w.queued && keyable(w.s.store) {
			// Its next write moves the principal's mark: it takes its
			// process's turn for the principal from the read on
			// (queue_turn.go).
			give, err := takeTurn(ctx, w.s.store, w.me.Principal)
			if err != nil {
				return nil, err
			}
			giveTurn = give
		}
		states, err := w.read(ctx)
		if err != nil {
			w.fresh = roomTick() // a failed read tells nothing: any later one will do
			if retryableFault(ctx, err) {
				if err := claimBackoff(ctx, try, "MetaScan"); err != nil {
					return nil, err
				}
				continue
			}
			return nil, err
		}
		if w.queued {
			own := w.checkOwn // the read holds the run's own rows
			lost := ""
			switch {
			case w.stalled():
				// The read took so long (a store that stalled, a paused
				// process) that others may have seen its entries expire:
				// it is not admitted on them, and queues again, as a
				// waiter that stalled asleep does (keepPlace).
				lost = "the waiter stalled past its TTL"
			case !w.stillQueued(states):
				lost = "the run's place in the queue was taken or expired"
			}
			if lost != "" {
				w.requeued(lost)
				if !own {
					// It ranks anew from a read of its own rows (its
					// principal's mark, the virtual time at its
					// priority, its place row), which a room's read
					// does not hold.
					continue
				}
			}
		}
		if err := w.aloneInQueue(ctx, states); err != nil {
			return nil, err
		}
		if err := w.ownEntryParses(states); err != nil {
			return nil, err
		}
		rank := w.rank(states)
		plans, admitted, next := w.plan(states, rank)
		// A run that lost a race to be admitted without waiting takes a
		// place first: the racers then take turns in the queue (where an
		// admission moves no mark) instead of racing again for every unit.
		queueFirst := admitted && !w.queued && raced
		if admitted && !queueFirst {
			// An admission from a place holds only if the place was
			// still trusted when the batch landed: confirmed within it.
			onPlace, placeEnd := w.queued, w.placeTrustEnd()
			held, err := w.admit(ctx, states, rank, plans)
			// Read what follows the write, whatever it did: a refusal
			// means a row changed since the (perhaps shared) read.
			w.fresh = roomTick()
			switch {
			case err == nil && !w.trusted(held):
				// Landed, or confirmed, a TTL less the margin after the
				// attempt began, from which its rows were stamped: they are
				// expiring or gone, and others may have been admitted over
				// its entries meanwhile. Give them back and queue again.
				w.giveBack(ctx, held)
				w.requeued("its admission was confirmed after its trust window ran out")
				continue
			case err == nil && onPlace && !time.Now().Before(placeEnd):
				// Confirmed only after the trust of the place it was
				// admitted from ended: the entries may have expired before
				// the batch applied, and others ranked ahead of it
				// meanwhile. Give the slots back and queue again.
				w.giveBack(ctx, held)
				w.requeued("its place lapsed before its admission was confirmed")
				continue
			case err == nil:
				return held, nil
			case errors.Is(err, ErrConditionFailed):
				// A slot or an entry changed since the read: read again,
				// with the run's own rows when it is queued (its place
				// row may have been taken).
				w.checkOwn = w.queued
				raced = !w.queued
				continue
			case retryableFault(ctx, err):
				if err := claimBackoff(ctx, try, "MetaBatch"); err != nil {
					return nil, err
				}
				continue
			default:
				return nil, err
			}
		}
		// Not admitted: a deadline that has passed ends the wait here,
		// before it queues or sleeps, as AcquireWait's does after a
		// refusal, though ctx's timer has not said so yet (ctxEnded).
		if err := ctxEnded(ctx); err != nil {
			return nil, err
		}
		if err := w.keepPlace(ctx, states, rank); err != nil {
			if errors.Is(err, ErrConditionFailed) || retryableFault(ctx, err) {
				if err := claimBackoff(ctx, try, "MetaBatch"); err != nil {
					return nil, err
				}
				continue
			}
			return nil, err
		}
		if queueFirst {
			// Units were free when it read: it looks again at once, queued.
			raced = false
			continue
		}
		w.syncRooms()
		giveTurn()
		giveTurn = func() {}
		if err := w.sleepRenewing(ctx, next); err != nil {
			return nil, err
		}
		try = -1
	}
}

// syncRooms tells each room where the waiter's place is, when that
// changed: a room's rings wake a member with a place only while it is
// among the first of the room's members (room.near).
func (w *waiter) syncRooms() {
	for i, r := range w.rooms {
		key := ""
		if w.queued {
			key = w.keys[i]
		}
		if w.roomKeys[i] != key {
			r.place(w.wake, key)
			w.roomKeys[i] = key
		}
	}
}

// near reports whether a ring of any of its rooms wakes the waiter.
func (w *waiter) near() bool {
	for _, r := range w.rooms {
		if r.near(w.wake) {
			return true
		}
	}
	return false
}

// read reads every scope the run waits for. A queued waiter reads the
// head of each line from scans that started after ticks w.fresh and w.rung, shared
// with the other waiters of its rooms, and decodes them for its own run;
// a waiter that takes a place (or checks its own, checkOwn) reads its own
// rows too, in a read of its own.
func (w *waiter) read(ctx context.Context) ([]*scopeState, error) {
	states := make([]*scopeState, len(w.scopes))
	orphan := orphanTest(w.s.store, w.s.runID)
	if !w.queued || w.checkOwn {
		own := &ownRows{principal: w.me.Principal, priority: w.me.Priority}
		raws, err := readScopeRows(ctx, w.s.store, w.scopes, own, false, w.s.o.nowMS, w.s.runID)
		if err != nil {
			return nil, err
		}
		for i, sc := range w.scopes {
			if states[i], err = decodeScopeFor(sc, w.s.runID, w.s.o, raws[i], orphan); err != nil {
				return nil, err
			}
		}
		return states, nil
	}
	for i, sc := range w.scopes {
		raw, err := w.rooms[i].rows(ctx, w.fresh, w.rung, min(w.s.o.poll, joinPatience))
		if err != nil {
			return nil, err
		}
		// The room read as deep as its scope's limit asks; a waiter whose
		// limit is higher, or whose head held expired entries, reads on.
		if err := raw.complete(ctx, w.s.store, sc, w.s.o.nowMS(), w.s.runID, true); err != nil {
			return nil, err
		}
		if states[i], err = decodeScopeFor(sc, w.s.runID, w.s.o, raw, orphan); err != nil {
			return nil, err
		}
	}
	return states, nil
}

// stillQueued reports whether every entry the waiter wrote is in place and
// live, and forgets its place when not. An entry beyond the head read is
// trusted while its renewals land; a read of its own rows also checks its
// place row.
func (w *waiter) stillQueued(states []*scopeState) bool {
	for i, st := range states {
		if !st.holds(w.keys[i], w.rows[i]) {
			w.queued = false
			return false
		}
		if raw, read := st.entryRows[placeKey(w.scopes[i].name, w.s.runID)]; w.checkOwn && (!read || raw != w.places[i]) {
			w.queued = false
			return false
		}
	}
	w.checkOwn = false
	return true
}

// holds reports whether the line read holds row at key, live, or may
// (key lies beyond the head read).
func (st *scopeState) holds(key, row string) bool {
	if q := st.entry(key); q != nil {
		return q.raw == row
	}
	return st.cut && key > st.headLast
}

// entry returns the live entry of the head read at key, if any.
func (st *scopeState) entry(key string) *queuedRow {
	for i := range st.queue {
		if st.queue[i].key == key {
			return &st.queue[i]
		}
	}
	return nil
}

func findEntry(q []queuedRow, runID string) *queuedRow {
	for i := range q {
		if q[i].e.Run == runID {
			return &q[i]
		}
	}
	return nil
}

// rank is the run's entry as it ranks now: its place when queued, or the
// place it would take, behind everything waiting, when not.
func (w *waiter) rank(states []*scopeState) *queueEntry {
	me := w.me
	if w.queued {
		return &me
	}
	if d := w.inherited(states); d != nil {
		// A newer driver's waiter takes the older one's place: its rank,
		// already charged to the principal's marks.
		me.Tag, me.EnqMS = d.Tag, d.EnqMS
		return &me
	}
	for i, st := range states {
		// A mark still as this waiter's lost place left it ranks the run
		// from where the mark was before that place: the place was never
		// admitted.
		if raw, ok := st.entryRows[fairKey(w.scopes[i].name, me.Principal)]; ok && w.rebases(i, st, raw) {
			st.marks[me.Principal] = 0
			if p := w.markPrev[i]; p != nil {
				if m, err := decodeMark(*p); err == nil {
					st.marks[me.Principal] = m.Finish
				}
			}
		}
	}
	me.Tag = rankIn(states, w.s.runID, me.Principal, me.Priority)
	me.EnqMS = max(states[0].nowMS, 1)
	return &me
}

// inherited returns the rank of the older driver's waiter whose place
// this one takes (aloneInQueue), when it can keep that rank: the older
// waiter's live entry is displaced in every scope of the claim, at one
// rank, for the same principal and priority. Its tag was charged to that
// principal's marks in those scopes alone, from that priority's virtual
// time: in another scope, or for another principal or priority, it could
// rank the run ahead of entries queued before it there (the principal's
// own later runs among them) or share their tag. The run then ranks as a
// new one, behind them, and the older entries still go with its place or
// admission (clearOwn).
func (w *waiter) inherited(states []*scopeState) *queueEntry {
	var rank *queueEntry
	for _, st := range states {
		if st.displaced == nil {
			return nil
		}
		e, err := decodeEntry(st.displaced.Value)
		switch {
		case err != nil, e.Principal != w.me.Principal, e.Priority != w.me.Priority:
			return nil
		case rank != nil && (e.Tag != rank.Tag || e.EnqMS != rank.EnqMS):
			return nil
		}
		rank = &e
	}
	return rank
}

// plan plans the claim in every scope at rank, and reports whether every
// scope admits it; next is the earliest expiry that could change that.
func (w *waiter) plan(states []*scopeState, rank *queueEntry) ([][]slotCandidate, bool, int64) {
	plans := make([][]slotCandidate, len(states))
	admitted := true
	var next int64
	for i, st := range states {
		sc := w.scopes[i]
		if st.nextMS != 0 && (next == 0 || st.nextMS < next) {
			next = st.nextMS
		}
		// An entry ahead that expires may let the run in; one behind it,
		// or its own, changes nothing for it.
		for _, q := range st.queue {
			if q.e.Run != rank.Run && q.e.before(rank) && (next == 0 || q.e.UntilMS < next) {
				next = q.e.UntilMS
			}
		}
		p, err := w.s.planFrom(sc, st, rank)
		if err != nil {
			admitted = false
			continue
		}
		plans[i] = p
	}
	return plans, admitted, next
}

// queueRowsPerScope bounds the queue rows an admission or a new place
// writes or checks per scope: the entry, the place, the mark, the clock,
// an entry of its own from before, and an older driver's entry.
const queueRowsPerScope = 6

// admit takes the planned slots of every scope and the run's entries out
// of the queues in one atomic batch, conditional on the slots being as
// read, the entries and place rows being the waiter's own, and, for a run
// admitted without waiting, on its principal's marks and its run's place
// and legacy entry being as read.
func (w *waiter) admit(ctx context.Context, states []*scopeState, rank *queueEntry, plans [][]slotCandidate) ([]*heldSlot, error) {
	conds, ops, held := w.s.claimWrites(w.scopes, plans)
	if !w.queued {
		mconds, mops, _, _ := w.markWrites(states, rank)
		conds, ops = append(conds, mconds...), append(ops, mops...)
	}
	for i, sc := range w.scopes {
		st := states[i]
		pk := placeKey(sc.name, w.s.runID)
		if w.queued {
			conds = append(conds, Cond{Key: w.keys[i], Value: &w.rows[i]}, Cond{Key: pk, Value: &w.places[i]})
			ops = append(ops, Delete(w.keys[i]), Delete(pk))
		} else {
			conds, ops = w.clearOwn(st, sc, conds, ops, "")
			if raw, ok := st.entryRows[pk]; ok {
				conds, ops = append(conds, Cond{Key: pk, Value: &raw}), append(ops, Delete(pk))
			} else {
				conds = append(conds, Cond{Key: pk})
			}
			lk := legacyQueueKey(sc.name, w.s.runID)
			if raw, ok := st.entryRows[lk]; ok {
				conds = append(conds, Cond{Key: lk, Value: &raw})
			} else {
				conds = append(conds, Cond{Key: lk})
			}
		}
		e := *rank
		e.Units = sc.Units()
		if fin := e.finish(); fin > st.clock {
			if _, bad := st.badRows[clockKey(sc.name)]; !bad {
				ops = append(ops, Put(clockKey(sc.name), fairMark{Finish: fin, UntilMS: stampMS(w.s.o.now(), w.s.o.ttl, 0)}.encode()))
			}
		}
	}
	err := w.commit(ctx, conds, ops)
	if errors.Is(err, errNoBatch) {
		return w.admitSlotBySlot(ctx, states, plans, conds, ops)
	}
	if err != nil {
		if !errors.Is(err, ErrConditionFailed) {
			w.pending = held // it may have landed: freed if the wait fails
		}
		return nil, err
	}
	w.pending = nil
	w.clearTried(ctx, ops)
	w.admitted()
	w.s.tookOver(held)
	return held, nil
}

// clearTried deletes, after an admission whose batch was ops, the entries
// of places this waiter left that the batch did not delete (a place it
// lost while its entry stayed, beyond the head it read), so that none
// holds a place for a run already admitted. There are none unless a
// place was lost; the bound is the one of a leaving waiter.
func (w *waiter) clearTried(ctx context.Context, ops []Op) {
	for _, op := range ops {
		delete(w.tried, op.Key)
	}
	if len(w.tried) == 0 {
		return
	}
	cleanup, cancel := cleanupContext(ctx, leaveTimeout)
	defer cancel()
	for key := range w.tried {
		if scope, _, ok := parseLineKey(key); ok {
			w.deleteOwn(cleanup, key, scope)
		}
	}
}

// admitted forgets the run's place once it is admitted: its entries and
// place rows are gone, and the marks it moved stay moved.
func (w *waiter) admitted() {
	w.queued = false
	clear(w.keys)
	clear(w.rows)
	clear(w.places)
	clear(w.marks)
	clear(w.markPrev)
	clear(w.markWas)
	clear(w.markPrevWas)
	clear(w.doubt)
	clear(w.tried)
}

// clearOwn adds to a batch the deletes of the entries of the run that the
// read found in the scope's head and that are not at keep: one of this
// waiter's from before (a place it lost, or whose write's outcome was not
// known), and the entry of an older driver's waiter whose place it takes.
func (w *waiter) clearOwn(st *scopeState, sc Scope, conds []Cond, ops []Op, keep string) ([]Cond, []Op) {
	for key, raw := range st.entryRows {
		if key == keep || !w.ownsEntry(raw) {
			continue
		}
		if scope, run, ok := parseLineKey(key); ok && scope == sc.name && run == w.s.runID {
			raw := raw
			conds, ops = append(conds, Cond{Key: key, Value: &raw}), append(ops, Delete(key))
		}
	}
	if d := st.displaced; d != nil && d.Key != keep {
		conds, ops = append(conds, Cond{Key: d.Key, Value: &d.Value}), append(ops, Delete(d.Key))
	}
	return conds, ops
}

// rebases reports whether a new place in scope i is charged from the mark
// as it was before this waiter's lost place: the mark read (raw) is still
// the one that place wrote, and that place's entry is not beyond the head
// read (so it is gone, or in the head, where the new place's batch takes
// it out). A leftover entry further back still ranks at its tag, and the
// new place must not take that tag again.
func (w *waiter) rebases(i int, st *scopeState, raw string) bool {
	return w.marks[i] != "" && raw == w.marks[i] && !(st.cut && w.keys[i] > st.headLast)
}

// markWrites returns the conditions and puts that move the principal's
// fair-share mark in every scope to where the run at rank finishes,
// conditional on the marks as read, and the marks written and the rows
// they replace (nil: absent). A mark that does not parse is left as it
// is: nothing writes over it, and the principal ranks in that scope as one
// without a mark. A mark this waiter moved for a place it lost moves on
// from where it was before that place.
func (w *waiter) markWrites(states []*scopeState, rank *queueEntry) ([]Cond, []Op, []string, []*string) {
	n := len(w.scopes)
	conds, ops := make([]Cond, 0, n), make([]Op, 0, n)
	marks, prev := make([]string, n), make([]*string, n)
	for i, sc := range w.scopes {
		e := *rank
		e.Units = sc.Units()
		mk := fairKey(sc.name, rank.Principal)
		if _, bad := states[i].badRows[mk]; bad {
			continue
		}
		var seen *string
		if raw, ok := states[i].entryRows[mk]; ok {
			seen = &raw
		}
		from := states[i].marks[rank.Principal]
		prev[i] = seen
		if seen != nil && w.rebases(i, states[i], *seen) {
			// Still the mark of this waiter's lost place: its share is
			// given back, and the new place is charged from before it.
			prev[i], from = w.markPrev[i], 0
			if w.markPrev[i] != nil {
				if m, err := decodeMark(*w.markPrev[i]); err == nil {
					from = m.Finish
				}
			}
		}
		marks[i] = fairMark{Finish: max(e.finish(), from), UntilMS: stampMS(w.s.o.now(), w.s.o.ttl, 0)}.encode()
		conds, ops = append(conds, Cond{Key: mk, Value: seen}), append(ops, Put(mk, marks[i]))
	}
	return conds, ops, marks, prev
}

// virtualTimeConds returns the conditions that keep a new place at rank
// from landing on a virtual time that has moved on since it was read: in
// each scope where the rank is ahead of the principal's mark (the
// principal had nothing waiting, and starts at the head), the row it was
// read from must still be there as read: the first entry waiting at the
// priority, or the scope's clock when none waited. An admission in between
// (which takes that entry out, or moves the clock) refuses the place, and
// the waiter reads again, so a principal back from idle never ranks ahead
// of the head it would find.
func (w *waiter) virtualTimeConds(states []*scopeState, rank *queueEntry) []Cond {
	var conds []Cond
	for i, sc := range w.scopes {
		st := states[i]
		if mark, ok := st.marks[rank.Principal]; ok && rank.Tag <= mark {
			continue // ranked from its own mark
		}
		if st.prioSeen {
			raw := st.prioRaw
			conds = append(conds, Cond{Key: st.prioKey, Value: &raw})
			continue
		}
		ck := clockKey(sc.name)
		if raw, ok := st.entryRows[ck]; ok {
			conds = append(conds, Cond{Key: ck, Value: &raw})
		} else if _, bad := st.badRows[ck]; !bad {
			conds = append(conds, Cond{Key: ck})
		}
	}
	return conds
}

// freePending deletes the slots of an admission whose outcome was not
// known, where they hold the rows it sent, with a context of its own.
func (w *waiter) freePending(ctx context.Context) {
	w.free(ctx, w.pending, true)
	w.pending = nil
}

// errNotFreed is why a slot of an admission in doubt that landed after its
// delete looked, and could not be deleted then, is remembered as an orphan.
var errNotFreed = errors.New("the slot's row could not be deleted")

// free deletes held, where each slot still holds the row sent for it; a
// row it cannot delete is remembered as trusted by no Slots
// (slots_orphans.go). inDoubt says the admission's outcome is unknown: it
// may still land after the delete looked (a write cut short still runs on
// the server), so a delete that found nothing reads the key, which waits
// for such a write where the store can tell (the Postgres store waits
// while a backend of a write in doubt still runs), and deletes the row it
// finds sent.
//
// A fault that a retry may clear, or whose outcome is unknown, is tried
// again with backoff until ctx ends: the clean-up's bound (leaveTimeout
// for a failed wait) is there to be used. Giving up at the first fault
// would leave the slot live for its TTL, remembered as an orphan that only
// a later Release of the run's Slots frees, while the wait returns its
// error as if nothing had been admitted; a Keeper.ClaimSlotsWait cut short
// by its keeper's end has no Slots left to release. Every try is
// conditional on the row sent, so a try never deletes another claim's row,
// and one whose outcome was unknown is safe to send again.
func (w *waiter) free(ctx context.Context, held []*heldSlot, inDoubt bool) {
	for _, h := range held {
		for try := 0; ; try++ {
			err := w.freeOne(ctx, h, inDoubt)
			if err == nil {
				break
			}
			if !freeRetryable(ctx, err) || claimBackoff(ctx, try, "MetaDelete") != nil {
				w.s.gaveUp([]*heldSlot{h})
				break
			}
		}
	}
}

// freeOne is one try of free for h.
func (w *waiter) freeOne(ctx context.Context, h *heldSlot, inDoubt bool) error {
	deleted, err := deleteRinging(ctx, w.s.store, h.key, h.seen, h.scope)
	if err != nil || deleted || !inDoubt {
		return err
	}
	v, ok, err := w.s.store.MetaGet(ctx, h.key)
	if err != nil || !ok || v != h.seen {
		return err
	}
	if deleted, err = deleteRinging(ctx, w.s.store, h.key, h.seen, h.scope); err == nil && !deleted {
		err = errNotFreed
	}
	return err
}

// freeRetryable reports whether free tries again after err: a storage
// fault that a retry is expected to clear, or whose outcome is unknown,
// while ctx lives.
func freeRetryable(ctx context.Context, err error) bool {
	var se *StorageError
	return errors.As(err, &se) && (se.Retryable || se.Unknown) && ctx.Err() == nil
}

// giveBack frees the slots of an admission the run cannot trust, with the
// wait's own context: when that ends first, the slots are left to the
// clean-up of the failed wait (freePending), within its one bound.
func (w *waiter) giveBack(ctx context.Context, held []*heldSlot) {
	w.free(ctx, held, false)
	if ctx.Err() != nil {
		w.pending = held
	}
}

// trusted reports whether every slot of an admission that landed is still
// within its trust window (Slots.trustEnd): counted from the start of the
// attempt, and ended by the clock that judges expiry too.
func (w *waiter) trusted(held []*heldSlot) bool {
	now, nowMS := time.Now(), w.s.o.nowMS()
	for _, h := range held {
		if !now.Before(w.s.trustEnd(h, now, nowMS)) {
			return false
		}
	}
	return true
}

// cleanupContext returns the context of a clean-up after ctx may have
// ended: ctx's values, and at most bound (leaveTimeout for a waiter,
// takeBackTimeout for an acquisition). Callers pass it down rather than
// each making their own, so that the bound holds for them all.
func cleanupContext(ctx context.Context, bound time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), bound)
}

// aloneInQueue fails with an [*AlreadyQueuedError] when another call
// waits for the same run in one of the scopes (a live entry of the run
// that this waiter did not write, of the same or a newer fence, found
// through the run's place row or its legacy entry): a second call must not
// be admitted inside the first one's reservation. It looks only when the
// read holds the run's own rows; the admission and the place it writes
// are conditional on the place row as read, so a second call that comes
// after the read is caught then.
func (w *waiter) aloneInQueue(ctx context.Context, states []*scopeState) error {
	for i, st := range states {
		if e := st.legacy; e != nil && e.Waiter != w.me.Waiter && e.Fence >= w.fence {
			return &AlreadyQueuedError{RunID: w.s.runID, Scope: w.scopes[i].name}
		}
		p := st.place
		if p == nil || p.Waiter == w.me.Waiter {
			continue
		}
		e, raw, err := st.placeEntry(ctx, w.s.store, w.scopes[i].name, p)
		if err != nil {
			return err
		}
		if e == nil || e.Waiter != p.Waiter {
			continue // its waiter is gone: the place is free
		}
		if p.Fence >= w.fence {
			return &AlreadyQueuedError{RunID: w.s.runID, Scope: w.scopes[i].name}
		}
		// An older driver's waiter: this one takes its place, and its
		// entry goes with the place written (placeWrites).
		st.displaced = &Row{Key: p.Key, Value: raw}
	}
	return nil
}

// placeEntry returns the live entry a place row points to, and its row:
// from the head read when it lies there, else read by key.
func (st *scopeState) placeEntry(ctx context.Context, store Store, scope string, p *placeRow) (*queueEntry, string, error) {
	if q := st.entry(p.Key); q != nil {
		return &q.e, q.raw, nil
	}
	if !st.cut || p.Key <= st.headLast {
		return nil, "", nil // within the head, and not live there
	}
	raw, found, err := store.MetaGet(ctx, p.Key)
	if err != nil || !found {
		return nil, "", err
	}
	e, err := decodeLineRow(scope, Row{Key: p.Key, Value: raw})
	if err != nil || !e.live(st.nowMS) {
		return nil, "", nil
	}
	return &e, raw, nil
}

// ownEntryParses fails with a [*CorruptRowError] when the run's own place
// row in a scope does not parse: the run can never queue there without
// writing over it, which nothing does, so its waits fail until a person
// deletes the row. Other runs wait as usual.
func (w *waiter) ownEntryParses(states []*scopeState) error {
	for i, st := range states {
		key := placeKey(w.scopes[i].name, w.s.runID)
		if raw, bad := st.badRows[key]; bad {
			_, err := decodePlace(raw)
			return corruptRow(key, raw, err)
		}
	}
	return nil
}

// admitSlotBySlot admits the run on a store without batches: the slots one
// by one, put back if one is lost, then the entries taken out.
func (w *waiter) admitSlotBySlot(ctx context.Context, states []*scopeState, plans [][]slotCandidate, conds []Cond, ops []Op) ([]*heldSlot, error) {
	s := w.s
	for i, sc := range w.scopes {
		for range sc.Units() {
			if err := s.claimOne(ctx, sc, plans[i]); err != nil {
				// Put back with a context of its own: the wait's may be
				// what ended it.
				cleanup, cancel := cleanupContext(ctx, leaveTimeout)
				err = errors.Join(err, s.rollback(cleanup))
				cancel()
				var limit *ConcurrencyLimitError
				if errors.As(err, &limit) {
					return nil, ErrConditionFailed
				}
				return nil, err
			}
		}
	}
	held := s.held
	s.held = nil
	clear(w.marks) // admitted: the marks its place moved stay moved
	clear(w.markWas)
	cleanup, cancel := cleanupContext(ctx, leaveTimeout)
	w.leave(cleanup)
	cancel()
	// Then the marks and clocks the batch would have moved, each
	// conditional on the row as read.
	seen := map[string]*string{}
	for _, c := range conds {
		seen[c.Key] = c.Value
	}
	for i, sc := range w.scopes {
		if raw, ok := states[i].entryRows[clockKey(sc.name)]; ok {
			seen[clockKey(sc.name)] = &raw
		}
	}
	for _, op := range ops {
		if strings.HasPrefix(op.Key, FairPrefix) || strings.HasPrefix(op.Key, ClockPrefix) {
			_, _ = casResolved(ctx, s.store, op.Key, seen[op.Key], op.Value)
		}
	}
	w.admitted()
	return held, nil
}

// keepPlace queues the run when it is not queued, and renews its entries
// when they are due (entryRenewalDue: between a quarter and a third of
// the TTL after they were written).
func (w *waiter) keepPlace(ctx context.Context, states []*scopeState, rank *queueEntry) error {
	if w.queued && time.Now().Before(entryRenewalDue(w.wroteAt, w.s.o.ttl)) {
		return nil
	}
	if w.queued && w.stalled() {
		// Stalled past the TTL, less the margin: others may have seen the
		// entries expire and been admitted over them, so the place is
		// given up rather than renewed.
		// It takes a new place from a read of its own rows (the marks its
		// lost place moved, its place row): the caller reads again.
		w.requeued("the waiter stalled past its TTL")
		return ErrConditionFailed
	}
	return w.putPlace(ctx, states, rank)
}

// stalled reports whether others may see the entries expired: they were
// written a TTL less the margin ago, or longer, or the clock that judges
// expiry says they expire within the margin.
func (w *waiter) stalled() bool { return !time.Now().Before(w.placeTrustEnd()) }

// placeTrustEnd is when the waiter stops trusting its entries, by its own
// clock: a TTL less the margin after it wrote them, or a margin before
// they expire by the clock that judges expiry, whichever comes first.
func (w *waiter) placeTrustEnd() time.Time {
	left := time.Duration(w.me.UntilMS-w.s.o.nowMS())*time.Millisecond - w.s.margin
	return earliest(w.wroteAt.Add(w.s.o.ttl-w.s.margin), time.Now().Add(left))
}

// sleepRenewing sleeps as sleep does, and while it wakes only to renew the
// entries of a place it holds, renews them and sleeps again, without
// reading the scopes: a wake-up for the renewal alone brings no news of
// them (a ring, an expiry it waits for, or the poll would). A renewal
// that does not land leaves the place given up, and the read that follows
// queues the run again.
func (w *waiter) sleepRenewing(ctx context.Context, nextMS int64) error {
	// One poll for the whole sleep: a renewal on the way does not put the
	// next look off.
	pollAt := time.Now().Add(jitter(w.s.o.poll))
	for {
		renew, poll, err := w.sleep(ctx, nextMS, pollAt)
		if err == nil && poll && w.queued && !w.stalled() && !w.near() {
			// A poll of a waiter far from the head: waiters of its own
			// process rank ahead of it, more than could be admitted, and
			// they look. It polls no more: its renewals keep its place,
			// and the room wakes it when a waiter ahead leaves the first
			// ones and lets it in (room.unplaceLocked), so a process of
			// 100,000 waiters does not wake each of them every poll.
			pollAt = time.Now().Add(w.s.o.ttl)
			continue
		}
		if err != nil || !renew || !w.queued || w.stalled() {
			return err
		}
		me := w.me
		if err := w.putPlace(ctx, nil, &me); err != nil {
			// The place is given up, and the read that follows queues
			// the run again: a renewal refused, or lost to a fault of
			// the store, is a place lost, not the end of the wait (the
			// write of the new place meets the store's faults as any
			// place's does). Anything else (a closed store, say) ends it.
			if errors.Is(err, ErrConditionFailed) || errors.Is(err, ErrStorage) || ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// putPlace writes the run's entries at rank: a new place over states'
// rows when it is not queued, a renewal of its own rows when it is (states
// is then not used).
func (w *waiter) putPlace(ctx context.Context, states []*scopeState, rank *queueEntry) error {
	next := *rank
	next.Seq++
	start := time.Now()
	next.UntilMS = stampMS(w.s.o.now(), w.s.o.ttl, w.me.UntilMS)
	n := len(w.scopes)
	keys, rows, places := make([]string, n), make([]string, n), make([]string, n)
	conds := make([]Cond, 0, n)
	ops := make([]Op, 0, n)
	for i, sc := range w.scopes {
		// One entry per scope: the same rank everywhere, and the units
		// asked of that scope.
		e := next
		e.Units = sc.Units()
		keys[i], rows[i] = lineKey(sc.name, &e), e.encode()
		if w.queued {
			conds, ops = append(conds, Cond{Key: keys[i], Value: &w.rows[i]}), append(ops, Put(keys[i], rows[i]))
			continue
		}
		st := states[i]
		var expected *string
		if raw, ok := st.entryRows[keys[i]]; ok {
			expected = &raw // its own entry from before, at the same rank
		}
		conds, ops = append(conds, Cond{Key: keys[i], Value: expected}), append(ops, Put(keys[i], rows[i]))
		conds, ops = w.clearOwn(st, sc, conds, ops, keys[i])
		pk := placeKey(sc.name, w.s.runID)
		places[i] = placeRow{Waiter: w.me.Waiter, Fence: w.fence, Key: keys[i], UntilMS: next.UntilMS}.encode()
		var seen *string
		if raw, ok := st.entryRows[pk]; ok {
			seen = &raw
		}
		conds, ops = append(conds, Cond{Key: pk, Value: seen}), append(ops, Put(pk, places[i]))
		lk := legacyQueueKey(sc.name, w.s.runID)
		if raw, ok := st.entryRows[lk]; ok {
			// Expired, ours, or an older driver's (aloneInQueue refused
			// a live one of anyone else): it goes with the new place.
			conds, ops = append(conds, Cond{Key: lk, Value: &raw}), append(ops, Delete(lk))
		} else {
			conds = append(conds, Cond{Key: lk})
		}
	}
	var marks []string
	var prev []*string
	markAt := make([]int, n) // per scope, the index of its mark's op
	if !w.queued {
		var mconds []Cond
		var mops []Op
		mconds, mops, marks, prev = w.markWrites(states, &next)
		for i := range marks {
			if marks[i] != "" {
				markAt[i] = len(ops)
				ops = append(ops, mops[0])
				mops = mops[1:]
			}
		}
		conds = append(conds, mconds...)
		conds = append(conds, w.virtualTimeConds(states, &next)...)
		for i, k := range keys {
			// leave looks for every place this waiter may have left: the
			// one it tries now, and the one it held before.
			w.tried[k] = struct{}{}
			if w.keys[i] != "" {
				w.tried[w.keys[i]] = struct{}{}
			}
		}
	}
	// The marks are recorded as sent before the write: if its outcome is
	// never known, leave still moves them back (only while they hold what
	// was sent), and those of an earlier place too (while they still hold
	// those). A write certainly refused, or failed by a fault that
	// certainly changed nothing, restores what was recorded.
	oldMarks, oldPrev := slices.Clone(w.marks), slices.Clone(w.markPrev)
	for i := range marks {
		if marks[i] != "" {
			w.marks[i], w.markPrev[i] = marks[i], prev[i]
		}
	}
	// Some entries may land and others not (a fault, or a store without
	// batches): leave finds them by their keys.
	w.wrote = true
	var ok bool
	var landed int
	var err error
	_, batched := w.s.store.(Batcher)
	if m, multi := batchedRenewals(w.s.store); multi && w.queued {
		ok, err = w.renewEntries(ctx, m, conds, ops)
	} else {
		ok, landed, err = w.putEntries(ctx, conds, ops)
	}
	w.fresh = roomTick() // the next read must show what this write did
	if err != nil || !ok {
		switch {
		case w.queued:
		case err == nil || !IsOutcomeUnknown(err) || !batched:
			// Certainly not written, but for the ops a store without
			// batches wrote before the one that failed (a mark whose own
			// write is in doubt there counts as not written: the share
			// stays charged, which ranks no run ahead of its turn).
			for i := range marks {
				if marks[i] == "" || markAt[i] >= landed {
					w.marks[i], w.markPrev[i] = oldMarks[i], oldPrev[i]
				}
			}
		default:
			for i := range marks {
				if marks[i] != "" {
					w.doubt[i] = Row{Key: keys[i], Value: rows[i]}
					w.markWas[i], w.markPrevWas[i] = oldMarks[i], oldPrev[i]
				}
			}
		}
		if w.queued && ctx.Err() == nil {
			// (A wait whose context ended is leaving, not queueing again.)
			switch {
			case w.stalled():
				// The renewal could not land within the entries' trust.
				w.requeued("the waiter stalled past its TTL")
			case err != nil:
				w.requeued("its entries could not be renewed: " + err.Error())
			default:
				w.requeued("its entries changed under it")
			}
		}
		w.queued = false
		if err != nil {
			return err
		}
		return ErrConditionFailed
	}
	if !w.queued {
		w.queuedAt = start
		copy(w.places, places)
		clear(w.markWas)
		clear(w.doubt)
	}
	w.me, w.queued, w.wroteAt = next, true, start
	w.keys, w.rows = keys, rows
	return nil
}

// ownsEntry reports whether raw is an entry this waiter wrote.
func (w *waiter) ownsEntry(raw string) bool {
	e, err := decodeEntry(raw)
	return err == nil && e.Waiter == w.me.Waiter
}

// putEntries writes the entries of every scope, all or nothing on a store
// with batches, and otherwise op by op, each conditional on its key's
// condition, stopping at the first that does not land (conditions on keys
// no op writes cannot be checked together then: such a store gives no
// atomicity across rows). It reports how many of ops certainly landed,
// in order.
func (w *waiter) putEntries(ctx context.Context, conds []Cond, ops []Op) (bool, int, error) {
	if b, ok := w.s.store.(Batcher); ok {
		ok, err := batchResolved(ctx, b, w.s.store, conds, ops)
		if !ok {
			return false, 0, err
		}
		return true, len(ops), err
	}
	expected := make(map[string]*string, len(conds))
	for _, c := range conds {
		expected[c.Key] = c.Value
	}
	for n, op := range ops {
		var ok bool
		var err error
		switch exp := expected[op.Key]; {
		case !op.Delete:
			ok, err = casResolved(ctx, w.s.store, op.Key, exp, op.Value)
		case exp != nil:
			ok, err = deleteResolved(ctx, w.s.store, op.Key, *exp)
		default:
			ok = true // nothing there to delete
		}
		if err != nil || !ok {
			return false, n, err
		}
	}
	return true, len(ops), nil
}

// renewEntries renews the entries of a queued waiter with the renewals
// of the process's other waiters (queue_renew.go), and reports whether
// every one landed in time. One confirmed only after the entries' trust
// ended counts as not landed: others may have seen them expire meanwhile
// and moved ahead, so the waiter gives its place up (putPlace finds it
// stalled) rather than keep it.
func (w *waiter) renewEntries(ctx context.Context, m MultiCASer, conds []Cond, ops []Op) (bool, error) {
	writes := make([]CASWrite, len(ops))
	for i := range ops {
		writes[i] = CASWrite{Key: ops[i].Key, Expected: conds[i].Value, Value: ops[i].Value}
	}
	end := w.placeTrustEnd()
	swapped, err := renewEntries(ctx, w.s.store, m, writes, end)
	if err != nil {
		return false, err
	}
	return !slices.Contains(swapped, false) && time.Now().Before(end), nil
}

// requeued gives up the run's place and says so.
func (w *waiter) requeued(why string) {
	waited := time.Since(w.queuedAt)
	w.queued = false
	if w.s.o.logger != nil {
		w.s.o.logger.Warn("runlease: waiter lost its place in the queue and queues again at the back",
			"run", w.s.runID, "scopes", w.me.Scopes, "waited", waited, "why", why)
	}
	if h := hooksOr(w.s.o.hooks).SlotsRequeued; h != nil {
		h(RequeueEvent{RunID: w.s.runID, Scopes: w.me.Scopes, Waited: waited, Reason: why})
	}
}

// sleep waits for a wake-up of any scope, the expiry at nextMS, the
// renewal of the entries, or the poll at pollAt, whichever comes first,
// and reports whether it woke for the renewal alone, or for the poll.
func (w *waiter) sleep(ctx context.Context, nextMS int64, pollAt time.Time) (renew, poll bool, err error) {
	d := max(time.Until(pollAt), 0)
	expiry := false
	// An entry ahead that expires matters only to a waiter near the head:
	// one further back has more waiters of its own process ahead of it
	// than a release or an expiry lets in (they look, and ring as they
	// leave).
	if nextMS != 0 && w.near() {
		if until := time.UnixMilli(nextMS).Sub(w.s.o.now()) + time.Millisecond; until < d {
			d, expiry = max(until, time.Millisecond), true
		}
	}
	if w.queued {
		if due := time.Until(entryRenewalDue(w.wroteAt, w.s.o.ttl)); due < d {
			d, renew, expiry = max(due, 0), true, false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, false, ctx.Err()
	case <-t.C:
		if !expiry {
			w.fresh = roomTick()
			return renew, !renew, nil
		}
		// Every waiter of the process that waited for this expiry needs
		// the same: a scan started after it, which they share.
		ms := w.s.o.nowMS()
		tick := roomTick()
		for _, r := range w.rooms {
			w.fresh = max(w.fresh, r.tickAfter(nextMS, ms, tick))
		}
		return false, false, nil
	case <-w.wake:
		// Every waiter woken by one ring needs the same: a scan started
		// after it, the first of which they all share.
		for _, r := range w.rooms {
			w.rung = max(w.rung, r.lastRing())
		}
		return false, false, nil
	}
}

// leave takes the run's entries out of the queues, waking the waiters
// behind it, and its place rows, and gives back the share its place took
// of its principal's marks where no later run moved them since, with ctx,
// which its callers make with cleanupContext (the waiter's own may have
// ended). An entry it cannot take out expires after the TTL.
func (w *waiter) leave(ctx context.Context) {
	w.queued = false
	if !w.wrote {
		return
	}
	for i, sc := range w.scopes {
		// A place whose write is in doubt landed if its entry is there
		// as sent (read before the entries are taken out).
		landed := true
		if d := w.doubt[i]; d.Key != "" {
			cur, found, err := w.s.store.MetaGet(ctx, d.Key)
			landed = err == nil && found && cur == d.Value
		}
		// Deleted only while it is a row this waiter wrote, live or
		// expired: a newer waiter's place is never touched. The row last
		// written is tried first; after a write whose outcome is unknown,
		// the row there may be another of ours, so it is read.
		gone := w.keys[i] == ""
		if !gone {
			ok, err := deleteRinging(ctx, w.s.store, w.keys[i], w.rows[i], sc.name)
			if !ok && err == nil {
				ok = w.deleteOwn(ctx, w.keys[i], sc.name)
			}
			gone = ok
		}
		for key := range w.tried {
			if scope, _, ok := parseLineKey(key); ok && scope == sc.name && key != w.keys[i] {
				gone = w.deleteOwn(ctx, key, sc.name) && gone
			}
		}
		pk := placeKey(sc.name, w.s.runID)
		inherited := false
		if cur, found, err := w.s.store.MetaGet(ctx, pk); err == nil && found {
			p, err := decodePlace(cur)
			switch {
			case err != nil:
			case p.Waiter == w.me.Waiter:
				_, _ = deleteResolved(ctx, w.s.store, pk, cur)
			case p.Fence > w.fence && w.keys[i] != "" && p.Key == w.keys[i]:
				// A newer driver's waiter took this place at its very
				// rank, and with it the share this place charged, if it
				// waits for the same principal and priority (inherited):
				// the mark it wrote may be byte for byte this one's
				// (stamped in the same millisecond), and it is the newer
				// waiter's to give back. One of another principal that
				// ranked anew and landed at this very key owes nothing to
				// this one's principal, whose share goes back.
				inherited = w.sameShare(ctx, sc.name, p.Key)
			}
		}
		// The share goes back only once the entry is known gone: a
		// leftover entry still ranks at its tag, and the principal's next
		// run must not take that tag again. After a place whose write's
		// outcome is unknown, the mark holds what it sent or still what
		// the place before it sent.
		if gone && !inherited && !(landed && w.giveShareBack(ctx, sc, w.marks[i], w.markPrev[i])) {
			w.giveShareBack(ctx, sc, w.markWas[i], w.markPrevWas[i])
		}
	}
	clear(w.keys)
	clear(w.rows)
	clear(w.marks)
	clear(w.markWas)
	clear(w.doubt)
	clear(w.tried)
}

// sameShare reports whether the live entry at key, in scope, waits for
// this waiter's principal at its priority.
func (w *waiter) sameShare(ctx context.Context, scope, key string) bool {
	raw, found, err := w.s.store.MetaGet(ctx, key)
	if err != nil || !found {
		return false
	}
	e, err := decodeLineRow(scope, Row{Key: key, Value: raw})
	return err == nil && e.Principal == w.me.Principal && e.Priority == w.me.Priority
}

// giveShareBack moves the principal's mark in sc back to prev (nil:
// absent) if it still holds mark, and reports whether it did.
func (w *waiter) giveShareBack(ctx context.Context, sc Scope, mark string, prev *string) bool {
	if mark == "" {
		return false
	}
	mk := fairKey(sc.name, w.me.Principal)
	if prev != nil {
		ok, _ := casResolved(ctx, w.s.store, mk, &mark, *prev)
		return ok
	}
	ok, _ := deleteResolved(ctx, w.s.store, mk, mark)
	return ok
}

// deleteOwn deletes the entry at key if this waiter wrote it, and reports
// whether no entry of this waiter is known to be left there.
func (w *waiter) deleteOwn(ctx context.Context, key, scope string) bool {
	cur, found, err := w.s.store.MetaGet(ctx, key)
	switch {
	case err != nil:
		return false
	case !found || !w.ownsEntry(cur):
		return true
	}
	ok, err := deleteRinging(ctx, w.s.store, key, cur, scope)
	return ok && err == nil
}

// leaveTimeout bounds how long a waiter whose context ended spends taking
// its entries out and freeing the slots of an admission in doubt, both
// together, and how long it spends giving back an admission it cannot
// trust.
const leaveTimeout = 2 * time.Second
