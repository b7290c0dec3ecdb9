// Package simstore is the store of runlease's simulation test: an
// in-memory runlease.Store with every optional capability (Batcher,
// MultiCASer, Clock, Notifier), whose faults are decided by a seed, so that
// a schedule that fails can be replayed from its seed.
//
// A fault is chosen for each call from a hash of the seed and the call's
// arguments, not from a shared random stream: goroutines that reach the
// store in a different order in a replay still meet the same faults. The
// store records what the simulation's checkers need: every value a write
// applied, and any fence that went backwards.
//
// A write may also apply late ([Late], [HangLate]), as a server may run a
// call its client gave up on (its context ended, its connection was cut)
// and commit it after the client saw an outcome-unknown fault, and after
// the client's clean-up looked for the row. The store then does what the
// Postgres store does for a key in doubt (store_postgres_doubt.go): a
// MetaGet of a key such a write covers waits until the write has applied
// or been refused, so that a caller reading a key after a write of unknown
// outcome sees the write's final outcome. Scans and writes do not wait, as
// they do not there.
package simstore

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/areev/runlease"
)

// Outcome is what the store does with one write.
type Outcome int

// The outcomes of a write.
const (
	OK                Outcome = iota // applied as the condition says, reply delivered
	NotApplied                       // refused before it ran: a fault that changed nothing
	AppliedUnknown                   // applied as the condition says, reply lost
	NotAppliedUnknown                // not applied, reply lost: the caller cannot tell
	Hang                             // blocks until the call's context ends, then not applied, unknown
	// Late is not applied now, reply lost: the write applies a little
	// later, as its condition says then (a server running a call whose
	// connection was cut). A MetaGet of a key it writes waits for it.
	Late
	// HangLate blocks until the call's context ends, returns unknown, and
	// then applies a little later, as Late does (a server running a call
	// its client gave up on).
	HangLate
	numOutcomes
)

var outcomeNames = [...]string{"ok", "not-applied", "applied-unknown", "not-applied-unknown", "hang", "late", "hang-late"}

func (o Outcome) String() string { return outcomeNames[o] }

// Rates sets, in percent, how often each fault happens. The write faults
// are drawn in the order of the fields, so that rates of Late and HangLate
// of 0 leave every other outcome as it was without them.
type Rates struct {
	NotApplied, AppliedUnknown, NotAppliedUnknown, Hang int // of writes
	ReadFail                                            int // of reads
	Late, HangLate                                      int // of writes
}

// Store is the simulated store. It is safe for concurrent use.
type Store struct {
	seed  uint64
	rates Rates

	mu      sync.Mutex
	rows    map[string]string
	offset  time.Duration // the store clock: time.Now() + offset
	faulty  bool          // faults are injected only while set
	calls   map[string]int
	applied map[string]bool // every value any write applied
	broken  []string        // fences that went backwards
	trace   []string
	subs    map[string][]chan struct{}
	rowSubs map[string][]chan string
	// lates holds, per key, a channel for each write of the key that is
	// to apply late, closed once it has applied or been refused.
	lates map[string][]chan struct{}
}

// New returns an empty store whose faults follow seed and rates.
func New(seed uint64, rates Rates) *Store {
	return &Store{seed: seed, rates: rates, rows: map[string]string{}, calls: map[string]int{},
		applied: map[string]bool{}, subs: map[string][]chan struct{}{},
		rowSubs: map[string][]chan string{}, lates: map[string][]chan struct{}{}, faulty: true}
}

// SetFaulty turns fault injection on or off.
func (s *Store) SetFaulty(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faulty = on
}

// StepClock moves the store's clock by d, forward or back.
func (s *Store) StepClock(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offset += d
	s.logf("clock %+v", d)
}

// ClockNow implements runlease.Clock.
func (s *Store) ClockNow() (time.Time, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Add(s.offset), 0
}

// Row returns the value at key.
func (s *Store) Row(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.rows[key]
	return v, ok
}

// Applied reports whether any write applied value.
func (s *Store) Applied(value string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied[value]
}

// Broken returns the fences that went backwards, one line each.
func (s *Store) Broken() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.broken...)
}

// Trace returns the log of the store's writes and faults.
func (s *Store) Trace() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.trace...)
}

func (s *Store) logf(format string, a ...any) {
	if len(s.trace) < 4000 {
		s.trace = append(s.trace, fmt.Sprintf("%v ", time.Now().UnixMilli()%1_000_000)+fmt.Sprintf(format, a...))
	}
}

// pick chooses the outcome of a write from the seed and the call. s.mu is
// held.
func (s *Store) pick(op string, parts ...string) Outcome {
	if !s.faulty {
		return OK
	}
	id := op + "\x00" + strings.Join(parts, "\x00")
	s.calls[id]++
	h := fnv.New64a()
	fmt.Fprintf(h, "%d\x00%s\x00%d", s.seed, id, s.calls[id])
	n := int(h.Sum64() % 100)
	r := s.rates
	for _, c := range []struct {
		o    Outcome
		rate int
	}{{NotApplied, r.NotApplied}, {AppliedUnknown, r.AppliedUnknown}, {NotAppliedUnknown, r.NotAppliedUnknown}, {Hang, r.Hang},
		{Late, r.Late}, {HangLate, r.HangLate}} {
		if n < c.rate {
			return c.o
		}
		n -= c.rate
	}
	return OK
}

func (s *Store) readFails(op, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.faulty {
		return false
	}
	s.calls[op+key]++
	h := fnv.New64a()
	fmt.Fprintf(h, "%d\x00r%s\x00%d", s.seed, op+key, s.calls[op+key])
	return int(h.Sum64()%100) < s.rates.ReadFail
}

func fault(op, key string, unknown bool, err error) error {
	return &runlease.StorageError{Op: op, Key: key, Unknown: unknown, Err: err}
}

var errInjected = fmt.Errorf("injected fault")

// finish turns an outcome into the call's result; ok is the write's result
// when it applied. lw is the write to apply late, for Late and HangLate:
// from the moment the call returns, as a server may run a call whose
// client has given it up.
func (s *Store) finish(ctx context.Context, op, key string, o Outcome, ok bool, lw *lateWrite) (bool, error) {
	switch o {
	case NotApplied:
		return false, fault(op, key, false, errInjected)
	case AppliedUnknown, NotAppliedUnknown:
		return false, fault(op, key, true, errInjected)
	case Late:
		s.late(lw)
		return false, fault(op, key, true, errInjected)
	case Hang, HangLate:
		<-ctx.Done()
		if o == HangLate {
			s.late(lw)
		}
		return false, fault(op, key, true, ctx.Err())
	}
	return ok, nil
}

// lateWrite is a write that applies late: op and parts name it (and draw
// its delay), keys are the keys it writes, apply applies it as its
// condition then says, under s.mu, and says what it did.
type lateWrite struct {
	op          string
	keys, parts []string
	apply       func() string
}

// late applies lw a little later, after a delay drawn from the seed and
// the write (1 to 8 ms), and makes a MetaGet of its keys wait until it has
// applied or been refused.
func (s *Store) late(lw *lateWrite) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d\x00late\x00%s\x00%s", s.seed, lw.op, strings.Join(lw.parts, "\x00"))
	delay := time.Duration(1+h.Sum64()%8) * time.Millisecond
	done := make(chan struct{})
	s.mu.Lock()
	for _, k := range lw.keys {
		s.lates[k] = append(s.lates[k], done)
	}
	s.logf("%s %v: to apply in %v", lw.op, lw.parts, delay)
	s.mu.Unlock()
	go func() {
		time.Sleep(delay)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.logf("late %s %v: %s", lw.op, lw.parts, lw.apply())
		for _, k := range lw.keys {
			chans := s.lates[k]
			for i, c := range chans {
				if c == done {
					chans = append(chans[:i:i], chans[i+1:]...)
					break
				}
			}
			if len(chans) == 0 {
				delete(s.lates, k)
			} else {
				s.lates[k] = chans
			}
		}
		close(done)
	}()
}

// awaitLate waits until no write that is to apply late covers key, or ctx
// ends.
func (s *Store) awaitLate(ctx context.Context, key string) error {
	for {
		s.mu.Lock()
		chans := s.lates[key]
		s.mu.Unlock()
		if len(chans) == 0 {
			return nil
		}
		select {
		case <-chans[0]:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// put stores value at key, recording it and checking the fence. s.mu is
// held.
func (s *Store) put(key, value string) {
	if old, ok := s.rows[key]; ok && strings.HasPrefix(key, runlease.LeasePrefix) {
		if f0, f1 := fence(old), fence(value); f1 < f0 {
			s.broken = append(s.broken, fmt.Sprintf("%s: fence %d after %d", key, f1, f0))
		}
	}
	s.rows[key] = value
	s.applied[value] = true
	for _, ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	// Every write wakes the row subscribers with its row, the ones that
	// did not release as well: a waiter must cope with news of a row it
	// cannot take, or that changed since.
	for _, ch := range s.rowSubs[key] {
		select {
		case <-ch:
		default:
		}
		ch <- value
	}
}

func fence(row string) uint64 {
	var r struct{ Fence uint64 }
	_ = json.Unmarshal([]byte(row), &r)
	return r.Fence
}

func (s *Store) matches(key string, expected *string) bool {
	v, ok := s.rows[key]
	if expected == nil {
		return !ok
	}
	return ok && v == *expected
}

// MetaGet implements runlease.Store.
func (s *Store) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if err := ctx.Err(); err != nil {
		return "", false, fault("MetaGet", key, false, err)
	}
	if s.readFails("get", key) {
		return "", false, fault("MetaGet", key, false, errInjected)
	}
	if err := s.awaitLate(ctx, key); err != nil {
		return "", false, fault("MetaGet", key, false, err)
	}
	v, ok := s.Row(key)
	return v, ok, nil
}

// MetaScan implements runlease.Store.
func (s *Store) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, fault("MetaScan", prefix, false, err)
	}
	if s.readFails("scan", prefix) {
		return nil, fault("MetaScan", prefix, false, errInjected)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []runlease.Row
	for k, v := range s.rows {
		if strings.HasPrefix(k, prefix) {
			out = append(out, runlease.Row{Key: k, Value: v})
		}
	}
	sortRows(out)
	return out, nil
}

// MetaCAS implements runlease.Store.
func (s *Store) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fault("MetaCAS", key, false, err)
	}
	expected = cloneStr(expected) // the bytes sent, whatever the caller does with its own
	apply := func() bool {
		ok := s.matches(key, expected)
		if ok {
			s.put(key, value)
		}
		return ok
	}
	s.mu.Lock()
	o := s.pick("cas", key, value)
	ok := false
	if o == OK || o == AppliedUnknown {
		ok = apply()
	}
	s.logf("cas %s -> %s: %v %v", key, value, o, ok)
	s.mu.Unlock()
	return s.finish(ctx, "MetaCAS", key, o, ok, &lateWrite{op: "cas", keys: []string{key}, parts: []string{key, value},
		apply: func() string { return fmt.Sprint("applied ", apply()) }})
}

// MetaDelete implements runlease.Store.
func (s *Store) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fault("MetaDelete", key, false, err)
	}
	apply := func() bool {
		ok := s.matches(key, &expected)
		if ok {
			delete(s.rows, key)
		}
		return ok
	}
	s.mu.Lock()
	o := s.pick("del", key, expected)
	ok := false
	if o == OK || o == AppliedUnknown {
		ok = apply()
	}
	s.logf("del %s: %v %v", key, o, ok)
	s.mu.Unlock()
	return s.finish(ctx, "MetaDelete", key, o, ok, &lateWrite{op: "del", keys: []string{key}, parts: []string{key, expected},
		apply: func() string { return fmt.Sprint("applied ", apply()) }})
}

// MetaBatch implements runlease.Batcher.
func (s *Store) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	if err := runlease.CheckBatch(conds, ops); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, fault("MetaBatch", "", false, err)
	}
	conds = slices.Clone(conds)
	for i := range conds {
		conds[i].Value = cloneStr(conds[i].Value)
	}
	ops = slices.Clone(ops)
	parts, keys := []string{}, []string{}
	for _, op := range ops {
		parts, keys = append(parts, op.Key, op.Value), append(keys, op.Key)
	}
	apply := func() bool {
		for _, c := range conds {
			if !s.matches(c.Key, c.Value) {
				return false
			}
		}
		for _, op := range ops {
			if op.Delete {
				delete(s.rows, op.Key)
			} else {
				s.put(op.Key, op.Value)
			}
		}
		return true
	}
	s.mu.Lock()
	o := s.pick("batch", parts...)
	ok := false
	if o == OK || o == AppliedUnknown {
		ok = apply()
	}
	s.logf("batch %v: %v %v", parts, o, ok)
	s.mu.Unlock()
	return s.finish(ctx, "MetaBatch", "", o, ok, &lateWrite{op: "batch", keys: keys, parts: parts,
		apply: func() string { return fmt.Sprint("applied ", apply()) }})
}

// MetaCASMany implements runlease.MultiCASer: one outcome for the whole
// call.
func (s *Store) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	if err := runlease.CheckCASMany(writes); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fault("MetaCASMany", "", false, err)
	}
	writes = slices.Clone(writes)
	parts, keys := []string{}, []string{}
	for i, w := range writes {
		writes[i].Expected = cloneStr(w.Expected)
		parts, keys = append(parts, w.Key, w.Value), append(keys, w.Key)
	}
	apply := func() []bool {
		swapped := make([]bool, len(writes))
		for i, w := range writes {
			if swapped[i] = s.matches(w.Key, w.Expected); swapped[i] {
				s.put(w.Key, w.Value)
			}
		}
		return swapped
	}
	s.mu.Lock()
	o := s.pick("many", parts...)
	swapped := make([]bool, len(writes))
	if o == OK || o == AppliedUnknown {
		swapped = apply()
	}
	s.logf("many %v: %v %v", parts, o, swapped)
	s.mu.Unlock()
	if _, err := s.finish(ctx, "MetaCASMany", "", o, true, &lateWrite{op: "many", keys: keys, parts: parts,
		apply: func() string { return fmt.Sprint("applied ", apply()) }}); err != nil {
		return nil, err
	}
	return swapped, nil
}

// cloneStr returns a copy of p, nil for nil.
func cloneStr(p *string) *string {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// MetaCASNotify implements runlease.Notifier.
func (s *Store) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return s.MetaCAS(ctx, key, expected, value)
}

// Subscribe implements runlease.Notifier.
func (s *Store) Subscribe(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs[key] = append(s.subs[key], ch)
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, c := range s.subs[key] {
			if c == ch {
				s.subs[key] = append(s.subs[key][:i], s.subs[key][i+1:]...)
				break
			}
		}
	}
}

// SubscribeRows implements runlease.RowNotifier.
func (s *Store) SubscribeRows(key string) (<-chan string, func()) {
	ch := make(chan string, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rowSubs[key] = append(s.rowSubs[key], ch)
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, c := range s.rowSubs[key] {
			if c == ch {
				s.rowSubs[key] = append(s.rowSubs[key][:i], s.rowSubs[key][i+1:]...)
				break
			}
		}
	}
}

func sortRows(rows []runlease.Row) {
	for i := 1; i < len(rows); i++ {
		for j := i; j > 0 && rows[j].Key < rows[j-1].Key; j-- {
			rows[j], rows[j-1] = rows[j-1], rows[j]
		}
	}
}
