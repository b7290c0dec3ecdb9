package runlease

import "context"

// scopeState is what one read of a scope found: its slot rows, the head of
// its line, and, for a claim's own read, the claim's own rows.
type scopeState struct {
	nowMS int64
	taken map[int]takenSlot // each row decoded once
	// used counts the slots in use: every live slot row, the run's own
	// included (a row belongs to the claim that wrote it, which a new
	// claim is not), and every slot row that does not parse.
	used    int
	own     int // the live slot rows of the run, counted in used
	corrupt int // the slot rows that do not parse, counted in used
	above   int // live slot rows numbered at or above the limit
	// slotRows are the slot rows read, for explanations (slotInfos):
	// a claim does not pay for listing the holders.
	slotRows []Row
	// queue holds the live entries of the head of the line, ranked; cut
	// says the line goes on after headLast, the key of the last row read:
	// the head then holds at least headDepth live entries, so a claim
	// ranked after them all is held back (judge).
	queue    []queuedRow
	cut      bool
	headLast string
	// entryRows holds every line row, mark, place, clock and legacy entry
	// read, live or not, by key; badRows those that do not parse, which
	// hold no place and which nothing writes over.
	entryRows map[string]string
	badRows   map[string]string
	marks     map[string]int64 // the claim's principal's finish, when read
	clock     int64            // the scope's virtual time of the last admission
	// prioTag is the smallest tag of a live entry of another run at the
	// claim's priority, when prioSeen; prioKey and prioRaw are that
	// entry's row.
	prioTag          int64
	prioSeen         bool
	prioKey, prioRaw string
	place            *placeRow   // the run's place row, when read and it parses
	legacy           *queueEntry // the run's live legacy entry, when read
	// displaced is the live entry of an older driver's waiter of the run,
	// whose place a waiter takes (aloneInQueue).
	displaced *Row
	nextMS    int64 // the earliest expiry of a live slot row (0: none)
}

// slotInfos lists the live slot rows of sc in st, and those that do not
// parse (Corrupt set), in key order: the holders an explanation names.
func (st *scopeState) slotInfos(sc Scope) []SlotInfo {
	var out []SlotInfo
	for _, r := range st.slotRows {
		scope, slot, ok := parseSlotKey(r.Key)
		if !ok || scope != sc.name {
			continue
		}
		row, err := decodeRow(r.Value)
		switch {
		case err != nil:
			out = append(out, SlotInfo{Scope: sc.name, Slot: slot, Key: r.Key, Corrupt: true})
		case row.live(st.nowMS):
			out = append(out, SlotInfo{Scope: sc.name, Slot: slot, RunID: row.Holder, Until: row.until(), Key: r.Key})
		}
	}
	return out
}

// readScope reads one scope for a claim of runID that ranks with o's
// priority and fair share: its slot rows, the head of its line, and the
// claim's own rows (every entry of the line when all is set, for an
// explanation). A slot row that does not parse counts as a slot in use,
// and a line entry, place, mark or clock that does not parse holds no
// place (see decodeScope); nothing is ever written over any of them.
func readScope(ctx context.Context, store Store, sc Scope, runID string, o options, all bool) (*scopeState, error) {
	own := &ownRows{principal: o.principal, priority: o.priority, plain: !all}
	raws, err := readScopeRows(ctx, store, []Scope{sc}, own, all, o.nowMS, runID)
	if err != nil {
		return nil, err
	}
	return decodeScopeFor(sc, runID, o, raws[0], orphanTest(store, runID))
}

// decodeScope judges one scope's rows as of now, for runID. It never writes
// through raw: the rows it points into may be shared.
func decodeScope(sc Scope, runID string, o options, raw scopeRows) (*scopeState, error) {
	return decodeScopeFor(sc, runID, o, raw, nil)
}

// decodeScopeFor is decodeScope where orphan, when not nil, tells the rows
// of runID that no Slots of this process trusts (slots_orphans.go): they
// are free slots for a claim of the run.
func decodeScopeFor(sc Scope, runID string, o options, raw scopeRows, orphan func(key, row string) bool) (*scopeState, error) {
	rows := raw.slots
	now := o.nowMS()
	if raw.judgedMS != 0 {
		now = raw.judgedMS // as complete judged the head
	}
	st := &scopeState{nowMS: now, taken: make(map[int]takenSlot, len(rows)), cut: raw.cut,
		entryRows: make(map[string]string, len(raw.head)+4), badRows: map[string]string{},
		marks: map[string]int64{}, slotRows: rows}
	for i := range rows {
		r := &rows[i]
		scope, slot, ok := parseSlotKey(r.Key)
		if !ok || scope != sc.name {
			continue // a longer scope name that shares this prefix
		}
		row, err := decodeRow(r.Value)
		if err != nil {
			// It may be a live holder's row, damaged: it blocks its
			// slot, whatever its number, until a person repairs it, and
			// the other slots are claimed as usual.
			st.taken[slot] = takenSlot{raw: &r.Value}
			st.used++
			st.corrupt++
			continue
		}
		live := row.live(now)
		if live && row.Holder == runID && orphan != nil && orphan(r.Key, r.Value) {
			live = false // the run's own, which no Slots trusts: free for its claims
		}
		st.taken[slot] = takenSlot{&r.Value, !live}
		if !live {
			continue // free, the run's own expired row as any other
		}
		if st.nextMS == 0 || row.UntilMS < st.nextMS {
			st.nextMS = row.UntilMS
		}
		// The run's own live row is in use too: another claim of the
		// run (kept, abandoned or of a driver that died) wrote it and
		// may still trust it.
		if row.Holder == runID {
			st.own++
		}
		st.used++
		if slot >= sc.limit {
			st.above++
		}
	}
	// A waiter wakes for the expiry of the entries ahead of it alone
	// (waiter.plan), so the line's earliest expiry is not kept.
	q, err := decodeLine(raw.head, sc.name, now, st.entryRows, st.badRows)
	if err != nil {
		return nil, err
	}
	st.queue = q
	if len(raw.head) > 0 {
		st.headLast = raw.head[len(raw.head)-1].Key
	}
	for _, r := range raw.clock {
		if m, err := decodeMark(r.Value); err != nil {
			st.badRows[r.Key] = r.Value
		} else {
			st.entryRows[r.Key], st.clock = r.Value, m.Finish
		}
	}
	if raw.own != nil {
		st.decodeOwn(sc, runID, raw.own)
	}
	return st, nil
}

// decodeOwn decodes the claim's own rows of a read.
func (st *scopeState) decodeOwn(sc Scope, runID string, own *ownRows) {
	for _, r := range own.mark {
		if m, err := decodeMark(r.Value); err != nil {
			st.badRows[r.Key] = r.Value
		} else {
			st.entryRows[r.Key], st.marks[own.principal] = r.Value, m.Finish
		}
	}
	for _, r := range own.place {
		if p, err := decodePlace(r.Value); err != nil {
			st.badRows[r.Key] = r.Value
		} else {
			st.entryRows[r.Key], st.place = r.Value, &p
		}
	}
	for _, r := range own.legacy {
		st.entryRows[r.Key] = r.Value
		if e, err := decodeEntry(r.Value); err == nil && e.live(st.nowMS) {
			st.legacy = &e
		}
	}
	// The smallest tag waiting at the claim's priority: the first live
	// entry of another run among the first rows of that priority.
	for _, r := range own.prio {
		e, err := decodeLineRow(sc.name, r)
		if err != nil || !e.live(st.nowMS) || e.Run == runID {
			continue
		}
		st.prioTag, st.prioSeen, st.prioKey, st.prioRaw = e.Tag, true, r.Key, r.Value
		return
	}
}
