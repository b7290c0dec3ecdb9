package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/areev/runlease"
)

// The store wrappers embed the built-in store, so that every method it has
// (and any capability added to it later, exported or not) is the store's
// own, and override only the calls of the Store interface and of the
// optional capabilities known today, to count calls (the round trips of
// the embedded store), time the reads of waiters, and tell the harness
// when a waiter's claim is in the queue (its first write that lands). The
// library sees the same capabilities as on the bare store: RangeReader is
// offered only when the store itself has it.

// watch is what the wrappers record.
type watch struct {
	calls atomic.Int64

	mu       sync.Mutex
	readDurs []time.Duration
	readRows []int
}

func (w *watch) read(ctx context.Context, start time.Time, rows int) {
	w.calls.Add(1)
	if roleOf(ctx) == roleHarness {
		return
	}
	d := time.Since(start)
	w.mu.Lock()
	w.readDurs = append(w.readDurs, d)
	w.readRows = append(w.readRows, rows)
	w.mu.Unlock()
}

func (w *watch) wrote(ctx context.Context, landed bool) {
	w.calls.Add(1)
	if landed {
		if f, ok := ctx.Value(keyQueued).(func()); ok {
			f()
		}
	}
}

func (w *watch) resetReads() {
	w.mu.Lock()
	w.readDurs, w.readRows = nil, nil
	w.mu.Unlock()
}

func (w *watch) reads() ([]time.Duration, []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Duration(nil), w.readDurs...), append([]int(nil), w.readRows...)
}

func countRows(rs [][]runlease.Row) int {
	n := 0
	for _, r := range rs {
		n += len(r)
	}
	return n
}

// wrapStore returns s wrapped, as a Store with the same capabilities.
func wrapStore(s runlease.ClosableStore, w *watch) runlease.Store {
	switch s := s.(type) {
	case *runlease.PostgresStore:
		pw := &pgWrap{PostgresStore: s, w: w}
		if _, ok := any(s).(runlease.RangeReader); ok {
			return &pgRangeWrap{pw}
		}
		return pw
	case *runlease.SQLiteStore:
		sw := &sqWrap{SQLiteStore: s, w: w}
		if _, ok := any(s).(runlease.RangeReader); ok {
			return &sqRangeWrap{sw}
		}
		return sw
	}
	panic("admissionbench: no wrapper for this store")
}

type pgWrap struct {
	*runlease.PostgresStore
	w *watch
}

func (s *pgWrap) MetaGet(ctx context.Context, key string) (string, bool, error) {
	t := time.Now()
	v, ok, err := s.PostgresStore.MetaGet(ctx, key)
	s.w.read(ctx, t, 1)
	return v, ok, err
}

func (s *pgWrap) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	t := time.Now()
	rs, err := s.PostgresStore.MetaScan(ctx, prefix)
	s.w.read(ctx, t, len(rs))
	return rs, err
}

func (s *pgWrap) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	t := time.Now()
	rs, err := s.PostgresStore.MetaScanMany(ctx, prefixes)
	s.w.read(ctx, t, countRows(rs))
	return rs, err
}

func (s *pgWrap) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	ok, err := s.PostgresStore.MetaCAS(ctx, key, expected, value)
	s.w.wrote(ctx, ok && err == nil)
	return ok, err
}

func (s *pgWrap) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	ok, err := s.PostgresStore.MetaCASNotify(ctx, key, expected, value)
	s.w.wrote(ctx, ok && err == nil)
	return ok, err
}

func (s *pgWrap) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	ok, err := s.PostgresStore.MetaDelete(ctx, key, expected)
	s.w.wrote(ctx, false)
	return ok, err
}

func (s *pgWrap) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	ok, err := s.PostgresStore.MetaDeleteNotify(ctx, key, expected, wakeKey)
	s.w.wrote(ctx, false)
	return ok, err
}

func (s *pgWrap) MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []runlease.Range) (bool, [][]runlease.Row, error) {
	ok, rs, err := s.PostgresStore.MetaDeleteNotifyRanges(ctx, key, expected, wakeKey, tag, ranges)
	s.w.wrote(ctx, false)
	return ok, rs, err
}

func (s *pgWrap) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	ok, err := s.PostgresStore.MetaBatch(ctx, conds, ops)
	s.w.wrote(ctx, ok && err == nil)
	return ok, err
}

func (s *pgWrap) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	oks, err := s.PostgresStore.MetaCASMany(ctx, writes)
	s.w.wrote(ctx, err == nil && anyTrue(oks))
	return oks, err
}

type pgRangeWrap struct{ *pgWrap }

func (s *pgRangeWrap) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	t := time.Now()
	rs, err := any(s.PostgresStore).(runlease.RangeReader).MetaRanges(ctx, ranges)
	s.w.read(ctx, t, countRows(rs))
	return rs, err
}

type sqWrap struct {
	*runlease.SQLiteStore
	w *watch
}

func (s *sqWrap) MetaGet(ctx context.Context, key string) (string, bool, error) {
	t := time.Now()
	v, ok, err := s.SQLiteStore.MetaGet(ctx, key)
	s.w.read(ctx, t, 1)
	return v, ok, err
}

func (s *sqWrap) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	t := time.Now()
	rs, err := s.SQLiteStore.MetaScan(ctx, prefix)
	s.w.read(ctx, t, len(rs))
	return rs, err
}

func (s *sqWrap) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	t := time.Now()
	rs, err := s.SQLiteStore.MetaScanMany(ctx, prefixes)
	s.w.read(ctx, t, countRows(rs))
	return rs, err
}

func (s *sqWrap) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	ok, err := s.SQLiteStore.MetaCAS(ctx, key, expected, value)
	s.w.wrote(ctx, ok && err == nil)
	return ok, err
}

func (s *sqWrap) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	ok, err := s.SQLiteStore.MetaCASNotify(ctx, key, expected, value)
	s.w.wrote(ctx, ok && err == nil)
	return ok, err
}

func (s *sqWrap) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	ok, err := s.SQLiteStore.MetaDelete(ctx, key, expected)
	s.w.wrote(ctx, false)
	return ok, err
}

func (s *sqWrap) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	ok, err := s.SQLiteStore.MetaDeleteNotify(ctx, key, expected, wakeKey)
	s.w.wrote(ctx, false)
	return ok, err
}

func (s *sqWrap) MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []runlease.Range) (bool, [][]runlease.Row, error) {
	ok, rs, err := s.SQLiteStore.MetaDeleteNotifyRanges(ctx, key, expected, wakeKey, tag, ranges)
	s.w.wrote(ctx, false)
	return ok, rs, err
}

func (s *sqWrap) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	ok, err := s.SQLiteStore.MetaBatch(ctx, conds, ops)
	s.w.wrote(ctx, ok && err == nil)
	return ok, err
}

func (s *sqWrap) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	oks, err := s.SQLiteStore.MetaCASMany(ctx, writes)
	s.w.wrote(ctx, err == nil && anyTrue(oks))
	return oks, err
}

type sqRangeWrap struct{ *sqWrap }

func (s *sqRangeWrap) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	t := time.Now()
	rs, err := any(s.SQLiteStore).(runlease.RangeReader).MetaRanges(ctx, ranges)
	s.w.read(ctx, t, countRows(rs))
	return rs, err
}

func anyTrue(bs []bool) bool {
	for _, b := range bs {
		if b {
			return true
		}
	}
	return false
}
