package sim

import (
	"context"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/wakeup"
)

// watcher is told of every write the store applies, under the store's
// mutex, at the instant it takes effect.
type watcher interface {
	applied(key string, old *string, now *string, at time.Time, op int)
	// batching is told of a batch whose conditions hold, before its
	// writes apply, and how long ago it was sent.
	batching(conds []runlease.Cond, ops []runlease.Op, at time.Time, op int, took time.Duration)
	// acked is told of a write that applied and whose success reached the
	// caller: the call was sent at sent and returned at at.
	acked(key, value string, sent, at time.Time)
}

// opKey tags a context with the id of the workload operation it serves, so
// the store can keep a log of each operation's calls.
type opKey struct{}

func withOp(ctx context.Context, id int) context.Context { return context.WithValue(ctx, opKey{}, id) }

func opOf(ctx context.Context) int {
	id, _ := ctx.Value(opKey{}).(int)
	return id
}

// callRecord is one store call of an operation, as the store served it.
type callRecord struct {
	op      string
	key     string
	outcome Outcome
	applied bool
	ctxCut  bool             // the call ended because its context did
	conds   []runlease.Cond  // a batch's conditions
	ranges  []runlease.Range // a MetaRanges call's ranges
	// expected is a MetaCAS's expected value; read and found are what a
	// MetaGet that succeeded returned.
	expected *string
	read     string
	found    bool
	delay    time.Duration // how long a Slow call waits
	at       time.Time     // when it returned, by the bubble's clock
	storeAt  time.Time     // when it returned, by the store's clock
}

// Store is an in-memory runlease store whose every call's outcome is chosen
// by a seeded decider under the current weather. It implements
// runlease.Store, Batcher, MultiCASer and Clock. Calls never block, except
// those given a hang, which wait for their context to end.
type Store struct {
	mu      sync.Mutex
	rows    map[string]string
	offset  time.Duration // the store clock minus the bubble's clock
	dec     decider
	weather Weather
	yield   float64 // chance that a call yields to other goroutines first
	hung    int
	heal    chan struct{} // closed at teardown: hung calls return, faults stop
	healed  bool
	watch   watcher
	logs    map[int][]callRecord
	writer  int // the operation whose call is applying, while one is
	trace   func(format string, a ...any)
	// uncertainty is how far ClockNow says its reading may be from the
	// store's true time.
	uncertainty time.Duration
	// stall is how long a Stall outcome waits at least (it waits up to
	// twice as long).
	stall time.Duration
	// cut lists the operations whose process died: their calls fail, not
	// applied, from then on.
	cut map[int]bool
	// refused holds the keys whose write a batched compare-and-swap
	// refused, until the next single-key call on the key (class Resolve).
	refused map[string]bool
	// collect, while a call applies, gathers the writes it applies, to be
	// reported as acknowledged if the call succeeds.
	collect *[]appliedWrite
	// busy counts, per lease key, the calls in flight that touch it; idle
	// holds the spans of fake time in which none did, and idleFrom the
	// start of the current span of a key with none in flight (absent: since
	// the store was made, at made). See IdleDuring.
	busy     map[string]int
	idle     map[string][]span
	idleFrom map[string]time.Time
	made     time.Time
	// subs are the subscribers of notifyStore's wake-ups.
	subs wakeup.Set
}

// appliedWrite is a write a call applied: value nil for a deletion.
type appliedWrite struct {
	key   string
	value *string
}

// span is a stretch of fake time.
type span struct{ from, to time.Time }

func newStore(seed uint64, w watcher, trace func(string, ...any)) *Store {
	return &Store{rows: map[string]string{}, dec: decider{seed: seed, count: map[string]uint64{}},
		weather: healthy, heal: make(chan struct{}), watch: w, logs: map[int][]callRecord{}, trace: trace,
		cut: map[int]bool{}, refused: map[string]bool{}, busy: map[string]int{}, idle: map[string][]span{},
		idleFrom: map[string]time.Time{}, made: time.Now()}
}

// detach cuts the store off from its schedule once the schedule is over:
// a call that still comes is neither watched nor traced, and the call logs,
// which only the checkers read, are dropped. The library keeps Store values
// in process-wide maps after the schedule (its lineages by run, holder and
// fence, keyed by the Store value and held until their Leases are
// unreachable; its memo of released rows): a store that still referred to
// its World would keep, through the World's Leases, its own lineages alive,
// and with them the whole schedule, for the life of the test binary.
func (s *Store) detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watch = detached{}
	s.trace = func(string, ...any) {}
	s.logs = map[int][]callRecord{}
	s.idle, s.idleFrom = map[string][]span{}, map[string]time.Time{}
}

// detached is the watcher of a store whose schedule is over.
type detached struct{}

func (detached) applied(string, *string, *string, time.Time, int)                       {}
func (detached) batching([]runlease.Cond, []runlease.Op, time.Time, int, time.Duration) {}
func (detached) acked(string, string, time.Time, time.Time)                             {}

// ClockNow is the store's clock: the bubble's clock plus the steps taken.
func (s *Store) ClockNow() (time.Time, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Add(s.offset), s.uncertainty
}

func (s *Store) nowLocked() time.Time { return time.Now().Add(s.offset) }

// Hung returns how many calls are waiting for their context to end.
func (s *Store) Hung() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hung
}

// Peek returns the row at key without a fault, for checkers.
func (s *Store) Peek(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.rows[key]
	return v, ok
}

// Scan returns the rows under prefix without a fault, for checkers.
func (s *Store) Scan(prefix string) []runlease.Row {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.scanLocked(prefix)
}

func (s *Store) scanLocked(prefix string) []runlease.Row {
	var out []runlease.Row
	for k, v := range s.rows {
		if strings.HasPrefix(k, prefix) {
			out = append(out, runlease.Row{Key: k, Value: v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func (s *Store) log(id int) []callRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]callRecord(nil), s.logs[id]...)
}

// begin decides the outcome of a call. A call whose context has ended is
// refused as not applied, as the Store contract requires.
func (s *Store) begin(ctx context.Context, op, key string, class Class) (Outcome, error) {
	if err := ctx.Err(); err != nil {
		return Fail, &runlease.StorageError{Op: op, Key: key, Err: err}
	}
	s.mu.Lock()
	if s.cut[opOf(ctx)] {
		s.mu.Unlock()
		return Fail, &runlease.StorageError{Op: op, Key: key, Err: errCut}
	}
	x, r := s.dec.draw(op, key)
	if s.refused[key] && (op == "MetaCAS" || op == "MetaGet") {
		delete(s.refused, key)
		if s.weather.Rates[Resolve] != (Rates{}) {
			class = Resolve
		}
	}
	o := OK
	if !s.healed {
		o = s.weather.Rates[class].pick(x)
	}
	yield := r.Float64() < s.yield
	s.mu.Unlock()
	if yield {
		runtime.Gosched() // let a racing goroutine in between the calls
	}
	return o, nil
}

// finish waits out a hang and turns an outcome into the error to return.
// apply runs under the store's mutex when the outcome applies the call.
func (s *Store) finish(ctx context.Context, op, key string, o Outcome, conds []runlease.Cond, apply func() bool) (bool, error) {
	return s.finishRec(ctx, callRecord{op: op, key: key, outcome: o, conds: conds}, nil, apply)
}

// finishRec is finish for a record made by the caller; after, when set,
// completes the record under the store's mutex once apply has run.
func (s *Store) finishRec(ctx context.Context, rec callRecord, after func(*callRecord), apply func() bool) (bool, error) {
	op, key, o := rec.op, rec.key, rec.outcome
	sent := time.Now()
	var cause error = errInjected
	if o == Deaf {
		s.mu.Lock()
		x, _ := s.dec.draw("delay "+op, key)
		stall, trace := s.stall, s.trace // trace under the mutex: see detach
		s.mu.Unlock()
		rec.delay = stall/2 + time.Duration(x*float64(stall))
		trace("  %s %s → deaf to its context for %s", op, key, fmtDur(rec.delay))
		select {
		case <-time.After(rec.delay):
		case <-s.heal:
		}
		o, rec.outcome = OK, Slow
	}
	if o == Slow || o == Stall {
		s.mu.Lock()
		x, _ := s.dec.draw("delay "+op, key)
		stall, trace := s.stall, s.trace // trace under the mutex: see detach
		s.mu.Unlock()
		rec.delay = time.Duration(20+x*600) * time.Millisecond
		if o == Stall {
			rec.delay = stall + time.Duration(x*float64(stall))
			o = Slow
			trace("  %s %s → stall for %s", op, key, fmtDur(rec.delay))
		}
		select {
		case <-time.After(rec.delay):
			o, rec.outcome = OK, Slow
		case <-ctx.Done():
			o, rec.outcome = Hang, Hang
			cause, rec.ctxCut = ctx.Err(), true
		case <-s.heal:
			o, rec.outcome = OK, Slow
		}
	}
	if o == Hang || o == HangApplied {
		s.mu.Lock()
		s.hung++
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			cause, rec.ctxCut = ctx.Err(), true
		case <-s.heal:
		}
		s.mu.Lock()
		s.hung--
		s.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut[opOf(ctx)] && o != Fail {
		// The process died while the call was in flight: it never reached
		// the store.
		o, rec.outcome, cause = Unsent, Unsent, errCut
	}
	ok := false
	var writes []appliedWrite
	if o == OK || o == Lost || o == HangApplied {
		s.writer, s.collect = opOf(ctx), &writes
		ok = apply()
		s.writer, s.collect = 0, nil
		rec.applied = ok
	}
	if o == OK {
		for _, w := range writes {
			if w.value != nil {
				s.watch.acked(w.key, *w.value, sent, time.Now())
			}
		}
	}
	if after != nil {
		after(&rec)
	}
	rec.at, rec.storeAt = time.Now(), s.nowLocked()
	s.logs[opOf(ctx)] = append(s.logs[opOf(ctx)], rec)
	if o != OK {
		s.trace("  %s %s → %s", op, key, o)
	}
	switch o {
	case OK:
		return ok, nil
	case Fail:
		return false, &runlease.StorageError{Op: op, Key: key, Err: cause}
	}
	return false, &runlease.StorageError{Op: op, Key: key, Unknown: true, Err: cause}
}

// put applies a write (value nil: delete) under the mutex.
func (s *Store) putLocked(key string, value *string) {
	var old *string
	if v, ok := s.rows[key]; ok {
		old = &v
	}
	if value == nil {
		delete(s.rows, key)
	} else {
		s.rows[key] = *value
	}
	if s.collect != nil {
		*s.collect = append(*s.collect, appliedWrite{key, value})
	}
	s.watch.applied(key, old, value, s.nowLocked(), s.writer)
}

func (s *Store) holds(key string, expected *string) bool {
	v, ok := s.rows[key]
	if expected == nil {
		return !ok
	}
	return ok && v == *expected
}

// track records that a call touching keys is in flight, and returns the
// func that records its end. Only lease keys are tracked.
func (s *Store) track(keys ...string) (untrack func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var mine []string
	for _, k := range keys {
		if !strings.HasPrefix(k, runlease.LeasePrefix) {
			continue
		}
		mine = append(mine, k)
		if s.busy[k]++; s.busy[k] == 1 {
			from, ok := s.idleFrom[k]
			if !ok {
				from = s.made
			}
			if now := time.Now(); now.After(from) {
				s.idle[k] = append(s.idle[k], span{from, now})
			}
			delete(s.idleFrom, k)
		}
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, k := range mine {
			if s.busy[k]--; s.busy[k] == 0 {
				delete(s.busy, k)
				s.idleFrom[k] = time.Now()
			}
		}
	}
}

// IdleDuring returns the longest stretch of fake time between from and to
// in which no call touching key was in flight.
func (s *Store) IdleDuring(key string, from, to time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var longest time.Duration
	overlap := func(a, b time.Time) {
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		longest = max(longest, b.Sub(a))
	}
	for _, sp := range s.idle[key] {
		overlap(sp.from, sp.to)
	}
	if s.busy[key] == 0 {
		since, ok := s.idleFrom[key]
		if !ok {
			since = s.made
		}
		overlap(since, to)
	}
	return longest
}

func classOf(key string) Class {
	if strings.HasPrefix(key, runlease.SlotPrefix) {
		return SlotWrite
	}
	return LeaseWrite
}

// MetaGet implements runlease.Store.
func (s *Store) MetaGet(ctx context.Context, key string) (string, bool, error) {
	o, err := s.begin(ctx, "MetaGet", key, Read)
	if err != nil {
		return "", false, err
	}
	defer s.track(key)()
	if o != OK && o != Fail && o != Slow && o != Stall {
		o = Hang
	}
	var v string
	var found bool
	_, err = s.finishRec(ctx, callRecord{op: "MetaGet", key: key, outcome: o},
		func(r *callRecord) { r.read, r.found = v, found },
		func() bool { v, found = s.rows[key]; return true })
	if err != nil {
		return "", false, notApplied(err)
	}
	return v, found, nil
}

// MetaScan implements runlease.Store.
func (s *Store) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	o, err := s.begin(ctx, "MetaScan", prefix, Read)
	if err != nil {
		return nil, err
	}
	if o != OK && o != Fail && o != Slow && o != Stall {
		o = Hang
	}
	var rows []runlease.Row
	_, err = s.finish(ctx, "MetaScan", prefix, o, nil, func() bool { rows = s.scanLocked(prefix); return true })
	if err != nil {
		return nil, notApplied(err)
	}
	return rows, nil
}

// metaRanges is MetaRanges (runlease.RangeReader), which only rangeStore
// offers: one call, with one outcome, for every range, each read at the
// instant the call applies.
func (s *Store) metaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	if err := runlease.CheckRanges(ranges); err != nil {
		return nil, err
	}
	key := ""
	if len(ranges) > 0 {
		key = ranges[0].Prefix
	}
	o, err := s.begin(ctx, "MetaRanges", key, Read)
	if err != nil {
		return nil, err
	}
	if o != OK && o != Fail && o != Slow && o != Stall {
		o = Hang
	}
	out := make([][]runlease.Row, len(ranges))
	_, err = s.finishRec(ctx, callRecord{op: "MetaRanges", key: key, outcome: o, ranges: ranges}, nil, func() bool {
		for i, r := range ranges {
			rows := s.scanLocked(r.Prefix)
			if r.After != "" {
				j := sort.Search(len(rows), func(j int) bool { return rows[j].Key > r.After })
				rows = rows[j:]
			}
			if r.Limit > 0 && len(rows) > r.Limit {
				rows = rows[:r.Limit]
			}
			out[i] = rows
		}
		return true
	})
	if err != nil {
		return nil, notApplied(err)
	}
	return out, nil
}

// rangeStore is the Store with ordered range reads (runlease.RangeReader),
// as the built-in stores have: a claim then reads the head of a line, not
// the whole of it.
type rangeStore struct{ *Store }

// MetaRanges implements runlease.RangeReader.
func (r rangeStore) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	return r.metaRanges(ctx, ranges)
}

// reads reports whether c is a read that returned rows under prefix from
// their first (a scan of it, or a range of it with no After).
func (c callRecord) reads(prefix string) bool {
	if c.outcome != OK && c.outcome != Slow {
		return false
	}
	switch c.op {
	case "MetaScan":
		return c.key == prefix
	case "MetaRanges":
		for _, r := range c.ranges {
			if r.Prefix == prefix && r.After == "" {
				return true
			}
		}
	}
	return false
}

// isRead reports whether c is a read call.
func (c callRecord) isRead() bool {
	return c.op == "MetaScan" || c.op == "MetaGet" || c.op == "MetaRanges"
}

// notApplied marks a failed read as certainly not applied.
func notApplied(err error) error {
	if se, ok := err.(*runlease.StorageError); ok {
		se.Unknown = false
	}
	return err
}

// MetaCAS implements runlease.Store.
func (s *Store) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return s.metaCAS(ctx, key, expected, value, nil)
}

// metaCAS is MetaCAS that calls woke, under the mutex, when the write
// applies (whatever its caller is told).
func (s *Store) metaCAS(ctx context.Context, key string, expected *string, value string, woke func()) (bool, error) {
	if err := firstErr(runlease.CheckKey(key), runlease.CheckValue(value)); err != nil {
		return false, err
	}
	o, err := s.begin(ctx, "MetaCAS", key, classOf(key))
	if err != nil {
		return false, err
	}
	defer s.track(key)()
	return s.finishRec(ctx, callRecord{op: "MetaCAS", key: key, outcome: o, expected: expected}, nil, func() bool {
		if !s.holds(key, expected) {
			return false
		}
		s.putLocked(key, &value)
		if woke != nil {
			woke()
		}
		return true
	})
}

// MetaDelete implements runlease.Store.
func (s *Store) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	return s.metaDelete(ctx, key, expected, nil)
}

// metaDelete is MetaDelete that calls woke, under the mutex, when the
// delete applies (whatever its caller is told).
func (s *Store) metaDelete(ctx context.Context, key, expected string, woke func()) (bool, error) {
	if err := runlease.CheckKey(key); err != nil {
		return false, err
	}
	o, err := s.begin(ctx, "MetaDelete", key, classOf(key))
	if err != nil {
		return false, err
	}
	defer s.track(key)()
	return s.finish(ctx, "MetaDelete", key, o, nil, func() bool {
		if !s.holds(key, &expected) {
			return false
		}
		s.putLocked(key, nil)
		if woke != nil {
			woke()
		}
		return true
	})
}

// notifyStore is the Store with ordered range reads and wake-ups by key
// (runlease.Notifier, RowNotifier, DeleteNotifier and DeleteReadNotifier),
// as the built-in stores have: a released slot wakes the waiters of its
// scope, and hands its read of the queue to those of the process (every
// driver of a schedule shares one process). A wake-up is sent when its
// write applies, whatever the caller is told; a write that never applies
// wakes nobody, as a notification lost would.
type notifyStore struct{ rangeStore }

// MetaCASNotify implements runlease.Notifier.
func (n notifyStore) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return n.metaCAS(ctx, key, expected, value, func() { n.subs.Wake(key, value) })
}

// Subscribe implements runlease.Notifier.
func (n notifyStore) Subscribe(key string) (<-chan struct{}, func()) { return n.subs.Subscribe(key) }

// SubscribeRows implements runlease.RowNotifier.
func (n notifyStore) SubscribeRows(key string) (<-chan string, func()) {
	return n.subs.SubscribeRows(key)
}

// SubscribeTags implements runlease.DeleteReadNotifier.
func (n notifyStore) SubscribeTags(key string) (<-chan string, func()) {
	return n.subs.SubscribeTags(key)
}

// MetaDeleteNotify implements runlease.DeleteNotifier.
func (n notifyStore) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	if err := runlease.CheckKey(wakeKey); err != nil {
		return false, err
	}
	return n.metaDelete(ctx, key, expected, func() { n.subs.Wake(wakeKey, "") })
}

// MetaDeleteNotifyRanges implements runlease.DeleteReadNotifier: the
// delete, with its outcome, then the reads, with theirs (a read that
// fails is no read: rows nil). Other calls may apply between the two.
func (n notifyStore) MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []runlease.Range) (bool, [][]runlease.Row, error) {
	if err := firstErr(runlease.CheckKey(key), runlease.CheckKey(wakeKey), runlease.CheckTag(tag), runlease.CheckRanges(ranges)); err != nil {
		return false, nil, err
	}
	deleted, err := n.metaDelete(ctx, key, expected, func() { n.subs.Wake(wakeKey, wakeup.TagRow(tag)) })
	if err != nil {
		return false, nil, err
	}
	rows, err := n.metaRanges(ctx, ranges)
	if err != nil {
		rows = nil
	}
	return deleted, rows, nil
}

// MetaBatch implements runlease.Batcher.
func (s *Store) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	if err := runlease.CheckBatch(conds, ops); err != nil {
		return false, err
	}
	class, key := LeaseWrite, ops[0].Key
	for _, op := range ops {
		switch {
		case strings.HasPrefix(op.Key, runlease.SlotPrefix):
			class = SlotWrite
		case !strings.HasPrefix(op.Key, runlease.LeasePrefix):
			class = UserBatch
		}
	}
	if len(conds) > 0 {
		key = conds[0].Key
	}
	sent := time.Now()
	o, err := s.begin(ctx, "MetaBatch", key, class)
	if err != nil {
		return false, err
	}
	keys := make([]string, 0, len(conds)+len(ops))
	for _, c := range conds {
		keys = append(keys, c.Key)
	}
	for _, op := range ops {
		keys = append(keys, op.Key)
	}
	defer s.track(keys...)()
	return s.finish(ctx, "MetaBatch", key, o, conds, func() bool {
		for _, c := range conds {
			if !s.holds(c.Key, c.Value) {
				return false
			}
		}
		s.watch.batching(conds, ops, s.nowLocked(), s.writer, time.Since(sent))
		for _, op := range ops {
			if op.Delete {
				s.putLocked(op.Key, nil)
			} else {
				v := op.Value
				s.putLocked(op.Key, &v)
			}
		}
		return true
	})
}

// MetaCASMany implements runlease.MultiCASer. A lost reply may have applied
// any subset of the writes, as the interface allows.
func (s *Store) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	if err := runlease.CheckCASMany(writes); err != nil {
		return nil, err
	}
	key := ""
	if len(writes) > 0 {
		key = writes[0].Key
	}
	o, err := s.begin(ctx, "MetaCASMany", key, MultiCAS)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(writes))
	for i, w := range writes {
		keys[i] = w.Key
	}
	defer s.track(keys...)()
	swapped := make([]bool, len(writes))
	_, err = s.finish(ctx, "MetaCASMany", key, o, nil, func() bool {
		for i, w := range writes {
			if o == Lost && i%2 == 1 && len(writes) > 1 {
				continue // part of a lost call did not apply
			}
			if s.holds(w.Key, w.Expected) {
				v := w.Value
				s.putLocked(w.Key, &v)
				swapped[i] = true
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	for i, w := range writes {
		if !swapped[i] {
			s.refused[w.Key] = true
		}
	}
	s.mu.Unlock()
	return swapped, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// setWeather changes the store's health from now on.
func (s *Store) setWeather(w Weather) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.healed {
		s.weather = w
	}
}

// stepClock moves the store's clock by d.
func (s *Store) stepClock(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offset += d
}

// cutOff makes every call of operation id fail from now on, as not
// applied, including those in flight: its process died.
func (s *Store) cutOff(id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut[id] = true
}

// healAll ends every hang and every fault, for the teardown.
func (s *Store) healAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.healed {
		s.healed = true
		close(s.heal)
	}
}

// plainStore is the Store without its optional capabilities but its clock:
// no batches and no batched compare-and-swaps, so the library takes the
// paths a store of single-key calls needs (claims slot by slot, with a
// rollback; renewals one by one).
type plainStore struct{ s *Store }

func (p plainStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	return p.s.MetaGet(ctx, key)
}

func (p plainStore) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	return p.s.MetaScan(ctx, prefix)
}

func (p plainStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return p.s.MetaCAS(ctx, key, expected, value)
}

func (p plainStore) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	return p.s.MetaDelete(ctx, key, expected)
}

func (p plainStore) ClockNow() (time.Time, time.Duration) { return p.s.ClockNow() }
