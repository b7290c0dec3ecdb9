package runlease

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// The line: the rows of a scope's admission queue, one per waiting run, at
// keys whose byte order is admission order, so that what a claim or a
// wake-up needs (the first waiters of a scope) is the first rows of a
// prefix, read by range ([RangeReader]) whatever the queue's length.
//
//	runline:<n>:<scope>:<priority>.<tag>.<enq>:<run id>    the waiter's entry (queueEntry JSON)
//	runplace:<n>:<scope>:<run id>                          where the run waits (placeRow JSON)
//	runfair:<n>:<scope>:<principal>                        where the principal's last run finishes
//	runclock:<n>:<scope>                                   the virtual time of the last admission
//
// n is the scope name's length in bytes. <priority> is MaxPriority minus
// the priority, in 7 digits (higher priorities first), <tag> the fair-share
// tag in 19 digits and <enq> the enqueue time in milliseconds in 16 digits,
// all zero-padded, so the key sorts as queueEntry.before orders entries.
const (
	// QueuePrefix starts the rows of the admission queue's line: a
	// waiter's entry per scope it waits for, at a key that holds its rank.
	QueuePrefix = "runline:"
	// PlacePrefix starts the rows that say, per scope and run, which entry
	// of the line is the run's: runplace:<n>:<scope>:<run id>. A second
	// waiter of a run finds the first through it.
	PlacePrefix = "runplace:"
	// ClockPrefix starts the rows that keep, per scope, the fair-share
	// virtual time of the latest admission from the queue:
	// runclock:<n>:<scope>. A principal that queues when nothing waits
	// starts there.
	ClockPrefix = "runclock:"
	// LegacyQueuePrefix starts the queue entries of runlease versions
	// before the line (runqueue:<n>:<scope>:<run id>). They hold no place
	// in the line: see docs/operating.md, "Upgrading from the scanned queue".
	// A waiter still reads its own run's, so that a run never waits twice
	// across versions, and Prune removes them once they expire.
	LegacyQueuePrefix = "runqueue:"
)

const (
	rankPriorityDigits = 7  // MaxPriority-priority is in [0, 2*MaxPriority]
	rankTagDigits      = 19 // tags are below maxTag = 2^61
	rankEnqDigits      = 16 // milliseconds since 1970, for 300,000 years
	rankLen            = rankPriorityDigits + 1 + rankTagDigits + 1 + rankEnqDigits + 1
)

func scopeSegment(scope string) string { return strconv.Itoa(len(scope)) + ":" + scope }

func lineScopePrefix(scope string) string { return QueuePrefix + scopeSegment(scope) + ":" }

// linePriorityPrefix starts the entries of a scope's line at one priority.
func linePriorityPrefix(scope string, priority int) string {
	return string(appendPadded([]byte(lineScopePrefix(scope)), uint64(MaxPriority-priority), rankPriorityDigits)) + "."
}

// lineKey is the key of e's entry in scope's line.
func lineKey(scope string, e *queueEntry) string {
	p := lineScopePrefix(scope)
	b := make([]byte, 0, len(p)+rankLen+len(e.Run))
	b = append(b, p...)
	b = appendPadded(b, uint64(MaxPriority-e.Priority), rankPriorityDigits)
	b = append(b, '.')
	b = appendPadded(b, uint64(e.Tag), rankTagDigits)
	b = append(b, '.')
	b = appendPadded(b, uint64(e.EnqMS), rankEnqDigits)
	b = append(b, ':')
	b = append(b, e.Run...)
	return string(b)
}

// maxLineKeyLen is the longest line key a run of scope may have: with the
// largest enqueue time the rank holds.
func maxLineKeyLen(scope, runID string) int {
	return len(lineScopePrefix(scope)) + rankLen + len(runID)
}

func appendPadded(b []byte, v uint64, width int) []byte {
	var d [20]byte
	s := strconv.AppendUint(d[:0], v, 10)
	for range width - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}

func placeKey(scope, runID string) string { return PlacePrefix + scopeSegment(scope) + ":" + runID }

func clockKey(scope string) string { return ClockPrefix + scopeSegment(scope) }

func legacyQueueKey(scope, runID string) string {
	return LegacyQueuePrefix + scopeSegment(scope) + ":" + runID
}

// parseLineKey splits a line key into its scope and run id.
func parseLineKey(key string) (scope, runID string, ok bool) {
	scope, rest, ok := cutScopeSegment(key, QueuePrefix)
	if !ok || len(rest) <= rankLen || rest[rankLen-1] != ':' {
		return "", "", false
	}
	return scope, rest[rankLen:], true
}

// cutScopeSegment cuts prefix and <n>:<scope>: from key, and returns the
// scope and what follows.
func cutScopeSegment(key, prefix string) (scope, rest string, ok bool) {
	rest, ok = strings.CutPrefix(key, prefix)
	if !ok {
		return "", "", false
	}
	digits, rest, ok := strings.Cut(rest, ":")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n <= 0 || n >= len(rest) || strconv.Itoa(n) != digits || rest[n] != ':' {
		return "", "", false
	}
	return rest[:n], rest[n+1:], true
}

// decodeLineRow decodes the entry at key of scope's line. An entry whose
// key is not the one its fields rank it at does not parse: it could sort
// where its rank says it is not.
func decodeLineRow(scope string, r Row) (queueEntry, error) {
	e, err := decodeEntry(r.Value)
	if err != nil {
		return e, err
	}
	if lineKey(scope, &e) != r.Key {
		return e, fmt.Errorf("%w: the key is not where the entry ranks (%s)", errBadEntry, lineKey(scope, &e))
	}
	return e, nil
}

// placeRow is the JSON of a run's place row: which waiting call holds the
// run's place in the scope, with what fence, at which line key.
type placeRow struct {
	Waiter  string `json:"waiter"`
	Fence   uint64 `json:"fence"`
	Key     string `json:"key"`
	UntilMS int64  `json:"until_ms"` // the entry's expiry when written (for Prune)
}

func (p placeRow) encode() string {
	b, _ := json.Marshal(p) // strings and integers always marshal
	return string(b)
}

func decodePlace(value string) (placeRow, error) {
	var p placeRow
	if err := json.Unmarshal([]byte(value), &p); err != nil {
		return p, err
	}
	if p.Waiter == "" || !strings.HasPrefix(p.Key, QueuePrefix) || p.UntilMS <= 0 {
		return p, fmt.Errorf("%w: a place names a waiter, a line key and until_ms", errBadEntry)
	}
	return p, nil
}

// scopeRows is what one read of a scope returned. A room's read (shared
// by the waiters of a process) holds the slots, the head of the line and
// the clock; a claim's own read holds its own rows too (own). decodeScope
// only reads them: they may be shared.
type scopeRows struct {
	slots []Row
	head  []Row // the first rows of the line, in rank order
	cut   bool  // the line may hold rows after head
	clock []Row // the scope's clock row, if any
	own   *ownRows
	// judgedMS is the instant complete judged the head's entries live at:
	// the rows are decoded as of then, so that a head complete then is
	// not found short by a later clock reading (0: not completed).
	judgedMS int64
}

// ownRows are the rows of one claim's read of a scope that only it needs:
// its principal's mark, its run's place and legacy entry, and the first
// entries at its priority.
type ownRows struct {
	principal string
	priority  int
	plain     bool // a claim that does not wait: no place, legacy entry or clock
	mark      []Row
	place     []Row
	legacy    []Row
	prio      []Row
	prioCut   bool
}

// headDepth is how many live entries the head of a line must hold for a
// claim of sc to be judged on it: one more than the limit, so that a claim
// ranked behind them all is held back whatever the units in use.
func headDepth(sc Scope) int { return sc.limit + 1 }

// prioDepth is how many entries at a claim's priority its read takes to
// find the smallest tag waiting there (its own entry, and expired ones,
// may come first).
const prioDepth = 4

// readScopeRows reads scopes in as few calls as the store allows: each
// scope's slot rows and the head of its line (every entry when all is
// set), its clock unless own is a plain claim's, and, when own is set, the
// claim's own rows. A plain claim on a store that reads neither ranges nor
// several scans in one call reads its own rows only where the head holds
// a live entry it must rank against. Unless nowMS is nil, the head is read
// on until it holds headDepth live entries or the line ends, and so are
// the claim's own rows at its priority, judged live at nowMS (complete).
func readScopeRows(ctx context.Context, store Store, scopes []Scope, own *ownRows, all bool, nowMS func() int64, runID string) ([]scopeRows, error) {
	out := make([]scopeRows, len(scopes))
	var reads []scopeRead
	lazy := false
	if own != nil && own.plain {
		_, ranges := store.(RangeReader)
		_, many := store.(MultiScanner)
		lazy = !ranges && !many
	}
	for i, sc := range scopes {
		depth := headDepth(sc)
		if all {
			depth = 0
		}
		r := &out[i]
		reads = headReads(reads, sc, depth, own == nil || !own.plain, r)
		if own != nil {
			o := *own
			r.own = &o
			if !lazy {
				reads = o.reads(reads, sc, runID)
			}
		}
	}
	if err := readAll(ctx, store, reads); err != nil {
		return nil, err
	}
	reads = reads[:0]
	for i, sc := range scopes {
		r := &out[i]
		r.cut = !all && len(r.head) == headDepth(sc)
		// A head cut short may hold live entries past the expired ones
		// it read: the claim's rank is read then too.
		if lazy && nowMS != nil && (r.cut || liveEntries(sc.name, r.head, nowMS(), runID) > 0) {
			reads = r.own.reads(reads, sc, runID)
		}
	}
	if err := readAll(ctx, store, reads); err != nil {
		return nil, err
	}
	for i, sc := range scopes {
		r := &out[i]
		r.clock = exact(r.clock, clockKey(sc.name))
		if o := r.own; o != nil {
			o.mark, o.place = exact(o.mark, fairKey(sc.name, o.principal)), exact(o.place, placeKey(sc.name, runID))
			o.legacy = exact(o.legacy, legacyQueueKey(sc.name, runID))
			o.prioCut = len(o.prio) == prioDepth
		}
		if nowMS == nil {
			continue // a room's read: each waiter completes it by its own clock
		}
		// A waiter takes out the expired entries it had to read past; a
		// plain claim or an explanation writes nothing.
		if err := r.complete(ctx, store, sc, nowMS(), runID, own != nil && !own.plain); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// scopeRead is one range of a read and where its rows go.
type scopeRead struct {
	r  Range
	to *[]Row
}

// headReads appends the reads of sc into r: its slot rows, the first depth
// entries of its line (every entry when depth is 0) and, with clock set,
// its clock.
func headReads(reads []scopeRead, sc Scope, depth int, clock bool, r *scopeRows) []scopeRead {
	reads = append(reads, scopeRead{Range{Prefix: sc.prefix()}, &r.slots},
		scopeRead{Range{Prefix: lineScopePrefix(sc.name), Limit: depth}, &r.head})
	if clock {
		reads = append(reads, scopeRead{Range{Prefix: clockKey(sc.name), Limit: 1}, &r.clock})
	}
	return reads
}

// roomReads returns the reads of a room's read of sc into r (a shared scan,
// room.scan, or a hand-over's, room.handOver), and the function that
// finishes r once they are done.
func roomReads(sc Scope, r *scopeRows) ([]scopeRead, func()) {
	return headReads(nil, sc, headDepth(sc), true, r), func() {
		r.cut = len(r.head) == headDepth(sc)
		r.clock = exact(r.clock, clockKey(sc.name))
	}
}

// rangesOf returns the ranges of reads.
func rangesOf(reads []scopeRead) []Range {
	ranges := make([]Range, len(reads))
	for i, rd := range reads {
		ranges[i] = rd.r
	}
	return ranges
}

// reads appends the ranges of the claim's own rows of sc: its
// principal's mark and the first entries at its priority and, for a
// waiter, its run's place and legacy entry.
func (o *ownRows) reads(reads []scopeRead, sc Scope, runID string) []scopeRead {
	reads = append(reads, scopeRead{Range{Prefix: fairKey(sc.name, o.principal), Limit: 1}, &o.mark},
		scopeRead{Range{Prefix: linePriorityPrefix(sc.name, o.priority), Limit: prioDepth}, &o.prio})
	if !o.plain {
		reads = append(reads, scopeRead{Range{Prefix: placeKey(sc.name, runID), Limit: 1}, &o.place},
			scopeRead{Range{Prefix: legacyQueueKey(sc.name, runID), Limit: 1}, &o.legacy})
	}
	return reads
}

// readAll reads every range of reads, MaxScanMany to a call.
func readAll(ctx context.Context, store Store, reads []scopeRead) error {
	for start := 0; start < len(reads); start += MaxScanMany {
		part := reads[start:min(start+MaxScanMany, len(reads))]
		got, err := readRanges(ctx, store, rangesOf(part)...)
		if err != nil {
			return err
		}
		for i, rd := range part {
			*rd.to = got[i]
		}
	}
	return nil
}

// exact keeps the row of rows, read from a range of prefix key, whose key
// is key: the first row of such a range, when there is one.
func exact(rows []Row, key string) []Row {
	if len(rows) > 0 && rows[0].Key == key {
		return rows[:1:1]
	}
	return nil
}

// complete reads on where r's head was cut before it held the live
// entries a claim of sc is judged on (expired and unparsable entries
// came first), and where its own rows of the claim's priority hold no
// live entry of another run yet. With tidy set, the expired entries it
// read past are removed. It never writes through the rows it was
// given (a room's read is shared): it replaces them.
func (r *scopeRows) complete(ctx context.Context, store Store, sc Scope, nowMS int64, runID string, tidy bool) error {
	prefix := lineScopePrefix(sc.name)
	r.judgedMS = nowMS
	paged := false
	for r.cut && liveEntries(sc.name, r.head, nowMS, "") < headDepth(sc) {
		more, err := readRanges(ctx, store, Range{Prefix: prefix, After: r.head[len(r.head)-1].Key, Limit: headDepth(sc)})
		if err != nil {
			return err
		}
		r.head = append(r.head[:len(r.head):len(r.head)], more[0]...)
		r.cut = len(more[0]) == headDepth(sc)
		paged = true
	}
	if paged && tidy {
		// Expired entries made this read take more than one page: take
		// them out, so that the reads after it do not.
		removeExpired(ctx, store, sc.name, r.head, nowMS)
	}
	if o := r.own; o != nil {
		pp := linePriorityPrefix(sc.name, o.priority)
		for o.prioCut && liveEntries(sc.name, o.prio, nowMS, runID) == 0 {
			more, err := readRanges(ctx, store, Range{Prefix: pp, After: o.prio[len(o.prio)-1].Key, Limit: prioDepth})
			if err != nil {
				return err
			}
			o.prio = append(o.prio[:len(o.prio):len(o.prio)], more[0]...)
			o.prioCut = len(more[0]) == prioDepth
		}
	}
	return nil
}

// removeExpired deletes the expired entries of rows, each only while it
// holds the row read: an expired entry holds no place, and its waiter, if
// it still runs, finds its place lost when it next renews (it would have
// found itself stalled anyway: a waiter trusts its entry a margin less
// than its TTL). On a store with batches they go MaxBatch/2 to a batch,
// all or nothing; a batch refused (one of them changed) is left to later
// reads. A fault is left too: the rows hold no place meanwhile.
func removeExpired(ctx context.Context, store Store, scope string, rows []Row, nowMS int64) {
	var dead []Row
	for _, row := range rows {
		if e, err := decodeLineRow(scope, row); err == nil && !e.live(nowMS) {
			dead = append(dead, row)
		}
	}
	b, batched := store.(Batcher)
	for len(dead) > 0 {
		n := len(dead)
		if !batched {
			n = 1
		}
		n = min(n, MaxBatch/2)
		conds, ops := make([]Cond, n), make([]Op, n)
		for i, row := range dead[:n] {
			conds[i], ops[i] = IfEquals(row.Key, row.Value), Delete(row.Key)
		}
		var err error
		if batched {
			_, err = b.MetaBatch(ctx, conds, ops)
		} else {
			_, err = store.MetaDelete(ctx, dead[0].Key, dead[0].Value)
		}
		if err != nil {
			return
		}
		dead = dead[n:]
	}
}

// liveEntries counts the entries of rows that parse and are live at nowMS,
// other than skip's.
func liveEntries(scope string, rows []Row, nowMS int64, skip string) int {
	n := 0
	for _, row := range rows {
		if e, err := decodeLineRow(scope, row); err == nil && e.live(nowMS) && e.Run != skip {
			n++
		}
	}
	return n
}
