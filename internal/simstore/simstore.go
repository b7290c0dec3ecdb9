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
package simstore

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
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
	numOutcomes
)

var outcomeNames = [...]string{"ok", "not-applied", "applied-unknown", "not-applied-unknown", "hang"}

func (o Outcome) String() string { return outcomeNames[o] }

// Rates sets, in percent, how often each fault happens.
type Rates struct {
	NotApplied, AppliedUnknown, NotAppliedUnknown, Hang int // of writes
	ReadFail                                            int // of reads
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
}

// New returns an empty store whose faults follow seed and rates.
func New(seed uint64, rates Rates) *Store {
	return &Store{seed: seed, rates: rates, rows: map[string]string{}, calls: map[string]int{},
		applied: map[string]bool{}, subs: map[string][]chan struct{}{},
		rowSubs: map[string][]chan string{}, faulty: true}
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
	}{{NotApplied, r.NotApplied}, {AppliedUnknown, r.AppliedUnknown}, {NotAppliedUnknown, r.NotAppliedUnknown}, {Hang, r.Hang}} {
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

// finish turns an outcome into the call's result. applied says whether the
// write was applied; ok is its result.
func finish(ctx context.Context, op, key string, o Outcome, ok bool) (bool, error) {
	switch o {
	case NotApplied:
		return false, fault(op, key, false, errInjected)
	case AppliedUnknown, NotAppliedUnknown:
		return false, fault(op, key, true, errInjected)
	case Hang:
		<-ctx.Done()
		return false, fault(op, key, true, ctx.Err())
	}
	return ok, nil
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
	s.mu.Lock()
	o := s.pick("cas", key, value)
	ok := false
	if o == OK || o == AppliedUnknown {
		if ok = s.matches(key, expected); ok {
			s.put(key, value)
		}
	}
	s.logf("cas %s -> %s: %v %v", key, value, o, ok)
	s.mu.Unlock()
	return finish(ctx, "MetaCAS", key, o, ok)
}

// MetaDelete implements runlease.Store.
func (s *Store) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fault("MetaDelete", key, false, err)
	}
	s.mu.Lock()
	o := s.pick("del", key, expected)
	ok := false
	if o == OK || o == AppliedUnknown {
		if ok = s.matches(key, &expected); ok {
			delete(s.rows, key)
		}
	}
	s.logf("del %s: %v %v", key, o, ok)
	s.mu.Unlock()
	return finish(ctx, "MetaDelete", key, o, ok)
}

// MetaBatch implements runlease.Batcher.
func (s *Store) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	if err := runlease.CheckBatch(conds, ops); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, fault("MetaBatch", "", false, err)
	}
	s.mu.Lock()
	parts := []string{}
	for _, op := range ops {
		parts = append(parts, op.Key, op.Value)
	}
	o := s.pick("batch", parts...)
	ok := false
	if o == OK || o == AppliedUnknown {
		ok = true
		for _, c := range conds {
			ok = ok && s.matches(c.Key, c.Value)
		}
		for _, op := range ops {
			switch {
			case !ok:
			case op.Delete:
				delete(s.rows, op.Key)
			default:
				s.put(op.Key, op.Value)
			}
		}
	}
	s.logf("batch %v: %v %v", parts, o, ok)
	s.mu.Unlock()
	return finish(ctx, "MetaBatch", "", o, ok)
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
	s.mu.Lock()
	parts := []string{}
	for _, w := range writes {
		parts = append(parts, w.Key, w.Value)
	}
	o := s.pick("many", parts...)
	swapped := make([]bool, len(writes))
	if o == OK || o == AppliedUnknown {
		for i, w := range writes {
			if swapped[i] = s.matches(w.Key, w.Expected); swapped[i] {
				s.put(w.Key, w.Value)
			}
		}
	}
	s.logf("many %v: %v %v", parts, o, swapped)
	s.mu.Unlock()
	if _, err := finish(ctx, "MetaCASMany", "", o, true); err != nil {
		return nil, err
	}
	return swapped, nil
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
