// Package testkit holds test helpers shared by runlease's tests: a manual
// clock, a Store decorator that counts calls, and one that injects faults.
package testkit

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/manualclock"
)

// Clock is a manual clock for runlease.WithClock. It starts at a fixed
// instant and moves only when told to (Advance). It is safe for concurrent
// use.
type Clock = manualclock.Clock

// NewClock returns a Clock set to start.
func NewClock(start time.Time) *Clock { return manualclock.New(start) }

// Counting wraps a Store and counts each method's calls.
type Counting struct {
	runlease.Store
	Gets, CASes, Deletes, Scans atomic.Int64
}

// Total returns the number of calls of every kind.
func (c *Counting) Total() int64 {
	return c.Gets.Load() + c.CASes.Load() + c.Deletes.Load() + c.Scans.Load()
}

// Reset sets every count to zero.
func (c *Counting) Reset() {
	c.Gets.Store(0)
	c.CASes.Store(0)
	c.Deletes.Store(0)
	c.Scans.Store(0)
}

func (c *Counting) MetaGet(ctx context.Context, key string) (string, bool, error) {
	c.Gets.Add(1)
	return c.Store.MetaGet(ctx, key)
}

func (c *Counting) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	c.CASes.Add(1)
	return c.Store.MetaCAS(ctx, key, expected, value)
}

func (c *Counting) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	c.Deletes.Add(1)
	return c.Store.MetaDelete(ctx, key, expected)
}

func (c *Counting) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	c.Scans.Add(1)
	return c.Store.MetaScan(ctx, prefix)
}

// Fault decides what a Faulty store does with one write: apply it or not,
// and then report an error (nil for none).
type Fault struct {
	Apply bool
	Then  func() // runs after the write, before the reply: another writer's move
	Err   error
}

// Faulty wraps a Store and lets a test decide the fate of each write, to
// cause what a real store does only under a network fault: a write applied
// whose reply was lost, or a write refused. Reads pass through.
type Faulty struct {
	runlease.Store
	mu     sync.Mutex
	faults []Fault // consumed by writes in order; when empty, writes pass through
	reads  int     // how many of the next reads fail
	down   bool    // every call fails
	hang   *string // writes of keys with this prefix block until their context ends
	fail   *string // writes of keys with this prefix fail, not applied
}

// HangWrites makes every write of a key starting with prefix (a batch: of
// any of its ops' keys) block until its context ends, and then fail with an
// unknown outcome, as a store that stopped answering after the request was
// sent does. A nil prefix ends it.
func (f *Faulty) HangWrites(prefix *string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hang = prefix
}

// FailWrites makes every write of a key starting with prefix fail without
// effect, as a store refusing them does. A nil prefix ends it.
func (f *Faulty) FailWrites(prefix *string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = prefix
}

// Prefix returns a pointer to p, for HangWrites and FailWrites.
func Prefix(p string) *string { return &p }

// intercept applies HangWrites and FailWrites to a write of key. It returns
// the error the write must fail with, or nil to go on.
func (f *Faulty) intercept(ctx context.Context, op, key string) error {
	f.mu.Lock()
	hang, fail := f.hang, f.fail
	f.mu.Unlock()
	switch {
	case fail != nil && strings.HasPrefix(key, *fail):
		return NotApplied(op)
	case hang != nil && strings.HasPrefix(key, *hang):
		<-ctx.Done()
		return &runlease.StorageError{Op: op, Key: key, Unknown: true, Err: ctx.Err()}
	}
	return nil
}

// SetDown makes every call fail, as an unreachable store does: writes with
// an unknown outcome (they time out after sending), reads not applied.
func (f *Faulty) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

func (f *Faulty) isDown() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

// FailReads makes the next n reads fail with a storage error, as a store
// that is unreachable does.
func (f *Faulty) FailReads(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads = n
}

func (f *Faulty) failRead() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return true
	}
	if f.reads == 0 {
		return false
	}
	f.reads--
	return true
}

func (f *Faulty) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if f.failRead() {
		return "", false, NotApplied("MetaGet")
	}
	return f.Store.MetaGet(ctx, key)
}

func (f *Faulty) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	if f.failRead() {
		return nil, NotApplied("MetaScan")
	}
	return f.Store.MetaScan(ctx, prefix)
}

// Next queues faults for the next writes.
func (f *Faulty) Next(faults ...Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, faults...)
}

func (f *Faulty) next() (Fault, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.faults) == 0 {
		return Fault{}, false
	}
	ft := f.faults[0]
	f.faults = f.faults[1:]
	return ft, true
}

// Unknown returns a storage error whose outcome is unknown, as a store
// reports a reset after sending.
func Unknown(op string) error {
	return &runlease.StorageError{Op: op, Unknown: true, Err: context.DeadlineExceeded}
}

// NotApplied returns a storage error that certainly changed nothing.
func NotApplied(op string) error {
	return &runlease.StorageError{Op: op, Err: context.DeadlineExceeded}
}

func (f *Faulty) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if f.isDown() {
		return false, Unknown("MetaCAS")
	}
	if err := f.intercept(ctx, "MetaCAS", key); err != nil {
		return false, err
	}
	ft, ok := f.next()
	if !ok {
		return f.Store.MetaCAS(ctx, key, expected, value)
	}
	if ft.Then != nil && !ft.Apply {
		ft.Then() // another writer moves first
	}
	swapped := false
	if ft.Apply {
		var err error
		if swapped, err = f.Store.MetaCAS(ctx, key, expected, value); err != nil {
			return false, err
		}
		if ft.Then != nil {
			ft.Then()
		}
	}
	if ft.Err != nil {
		return false, ft.Err
	}
	return swapped, nil
}

func (f *Faulty) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if f.isDown() {
		return false, Unknown("MetaDelete")
	}
	if err := f.intercept(ctx, "MetaDelete", key); err != nil {
		return false, err
	}
	ft, ok := f.next()
	if !ok {
		return f.Store.MetaDelete(ctx, key, expected)
	}
	deleted := false
	if ft.Apply {
		var err error
		if deleted, err = f.Store.MetaDelete(ctx, key, expected); err != nil {
			return false, err
		}
	}
	if ft.Err != nil {
		return false, ft.Err
	}
	return deleted, nil
}

// MetaBatch passes batches through to the wrapped store, which must be a
// runlease.Batcher, consuming queued faults like the other writes.
func (f *Faulty) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	b := f.Store.(runlease.Batcher)
	if f.isDown() {
		return false, Unknown("MetaBatch")
	}
	for _, op := range ops {
		if err := f.intercept(ctx, "MetaBatch", op.Key); err != nil {
			return false, err
		}
	}
	ft, ok := f.next()
	if !ok {
		return b.MetaBatch(ctx, conds, ops)
	}
	applied := false
	if ft.Apply {
		var err error
		if applied, err = b.MetaBatch(ctx, conds, ops); err != nil {
			return false, err
		}
	}
	if ft.Then != nil {
		ft.Then()
	}
	if ft.Err != nil {
		return false, ft.Err
	}
	return applied, nil
}

// FaultyMulti is a Faulty store that also renews many leases at once, as a
// runlease.MultiCASer, passing the calls to the wrapped store (which must be
// one). A call fails as a whole when the store is down, or when HangWrites
// or FailWrites matches the key of any of its writes; it consumes no queued
// fault.
type FaultyMulti struct {
	*Faulty
}

// MetaCASMany implements runlease.MultiCASer.
func (f FaultyMulti) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	if f.isDown() {
		return nil, Unknown("MetaCASMany")
	}
	for _, w := range writes {
		if err := f.intercept(ctx, "MetaCASMany", w.Key); err != nil {
			return nil, err
		}
	}
	return f.Store.(runlease.MultiCASer).MetaCASMany(ctx, writes)
}

// PlainStore hides every optional capability of a Store: it is a Store and
// nothing more, for testing the paths taken on stores without batches.
type PlainStore struct {
	runlease.Store
}

// CountingBatcher is a Counting store that also passes batches through to a
// wrapped runlease.Batcher, counting them.
type CountingBatcher struct {
	Counting
	Batches, Multis, MultiWrites atomic.Int64
}

// NewCountingBatcher wraps s, which must be a runlease.Batcher.
func NewCountingBatcher(s runlease.Store) *CountingBatcher {
	return &CountingBatcher{Counting: Counting{Store: s}}
}

func (c *CountingBatcher) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	c.Batches.Add(1)
	return c.Store.(runlease.Batcher).MetaBatch(ctx, conds, ops)
}

// MetaScanMany passes many-scan calls through, counted as one scan: one
// round trip. A wrapped store that is no runlease.MultiScanner scans one
// prefix after another.
func (c *CountingBatcher) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	c.Scans.Add(1)
	if m, ok := c.Store.(runlease.MultiScanner); ok {
		return m.MetaScanMany(ctx, prefixes)
	}
	out := make([][]runlease.Row, len(prefixes))
	for i, p := range prefixes {
		rows, err := c.Store.MetaScan(ctx, p)
		if err != nil {
			return nil, err
		}
		out[i] = rows
	}
	return out, nil
}

// MetaRanges passes range reads through, counted as one scan: one round
// trip. A wrapped store that is no runlease.RangeReader scans the prefix
// of one range after another, and keeps what MetaRanges would return.
func (c *CountingBatcher) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	c.Scans.Add(1)
	if r, ok := c.Store.(runlease.RangeReader); ok {
		return r.MetaRanges(ctx, ranges)
	}
	if err := runlease.CheckRanges(ranges); err != nil {
		return nil, err
	}
	out := make([][]runlease.Row, len(ranges))
	for i, r := range ranges {
		rows, err := c.Store.MetaScan(ctx, r.Prefix)
		if err != nil {
			return nil, err
		}
		out[i] = []runlease.Row{}
		for _, row := range rows {
			if row.Key > r.After && (r.Limit == 0 || len(out[i]) < r.Limit) {
				out[i] = append(out[i], row)
			}
		}
	}
	return out, nil
}

// MetaCASMany passes many-write calls through to a wrapped
// runlease.MultiCASer, counting calls and writes.
func (c *CountingBatcher) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	c.Multis.Add(1)
	c.MultiWrites.Add(int64(len(writes)))
	return c.Store.(runlease.MultiCASer).MetaCASMany(ctx, writes)
}
