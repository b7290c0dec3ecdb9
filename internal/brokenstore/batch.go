package brokenstore

import (
	"context"
	"runtime"
	"slices"

	"github.com/areev/runlease"
)

// MetaBatch implements [runlease.Batcher].
func (s *Store) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	if err := runlease.CheckBatch(conds, ops); err != nil {
		return false, err
	}
	if s.st.bug != IgnoresCancel {
		if err := s.ctxErr(ctx, "MetaBatch", ""); err != nil {
			return false, err
		}
	}
	before, after := s.faultBefore("MetaBatch")
	if before != nil {
		return false, before
	}
	written := map[string]bool{}
	for _, op := range ops {
		written[op.Key] = true
	}
	if s.st.bug == WriteSkew {
		var readOnly, onWritten []runlease.Cond
		for _, c := range conds {
			if written[c.Key] {
				onWritten = append(onWritten, c)
			} else {
				readOnly = append(readOnly, c)
			}
		}
		s.st.mu.Lock()
		ok := s.st.hold(readOnly)
		s.st.mu.Unlock()
		if !ok {
			return false, nil
		}
		runtime.Gosched() // the keys only read are not held from here on
		conds = onWritten
	}
	s.st.mu.Lock()
	s.st.admit()
	ok := s.st.hold(conds)
	if ok {
		for _, op := range ops {
			if op.Delete {
				delete(s.st.rows, op.Key)
			} else {
				s.st.rows[op.Key] = op.Value
			}
			s.remember(op.Key, op.Value, !op.Delete)
		}
		s.st.landed()
	}
	s.st.mu.Unlock()
	if after != nil {
		return false, after()
	}
	return ok, nil
}

// hold reports whether every condition holds. st.mu must be held.
func (st *Storage) hold(conds []runlease.Cond) bool {
	for _, c := range conds {
		v, found := st.rows[c.Key]
		if found != (c.Value != nil) || (found && v != *c.Value) {
			return false
		}
	}
	return true
}

// MetaCASMany implements [runlease.MultiCASer].
func (s *Store) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	if err := runlease.CheckCASMany(writes); err != nil {
		return nil, err
	}
	if s.st.bug != IgnoresCancel {
		if err := s.ctxErr(ctx, "MetaCASMany", ""); err != nil {
			return nil, err
		}
	}
	before, after := s.faultBefore("MetaCASMany")
	if before != nil {
		return nil, before
	}
	swapped := make([]bool, len(writes))
	s.st.mu.Lock()
	s.st.admit()
	for i, w := range writes {
		if s.st.hold([]runlease.Cond{{Key: w.Key, Value: w.Expected}}) {
			s.st.rows[w.Key] = w.Value
			s.remember(w.Key, w.Value, true)
			swapped[i] = true
		}
	}
	if slices.Contains(swapped, true) {
		s.st.landed()
	}
	s.st.mu.Unlock()
	if after != nil {
		return nil, after()
	}
	return swapped, nil
}

// MetaScanMany implements [runlease.MultiScanner]: each prefix as MetaScan
// reads it (with ScanManyOnePage, cut to its first page).
func (s *Store) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	if err := runlease.CheckPrefixes(prefixes); err != nil {
		return nil, err
	}
	out := make([][]runlease.Row, len(prefixes))
	for i, p := range prefixes {
		rows, err := s.MetaScan(ctx, p)
		if err != nil {
			return nil, err
		}
		if s.st.bug == ScanManyOnePage && len(rows) > pageRows {
			rows = rows[:pageRows]
		}
		out[i] = rows
	}
	return out, nil
}

// MetaRanges implements [runlease.RangeReader]: each range cut from what
// MetaScan reads of its prefix, so it has every bug MetaScan has.
func (s *Store) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	if err := runlease.CheckRanges(ranges); err != nil {
		return nil, err
	}
	out := make([][]runlease.Row, len(ranges))
	for i, r := range ranges {
		rows, err := s.MetaScan(ctx, r.Prefix)
		if err != nil {
			return nil, err
		}
		kept := []runlease.Row{}
		for _, row := range rows {
			if row.Key > r.After && (r.Limit == 0 || len(kept) < r.Limit) {
				kept = append(kept, row)
			}
		}
		out[i] = kept
	}
	return out, nil
}
