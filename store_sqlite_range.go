package runlease

import (
	"context"
	"database/sql"
)

// The statements of MetaRanges: the rows from a start, below the prefix's
// end when it has one, in key order, at most LIMIT of them (-1: every row).
// The start is one bound, chosen in Go (after After, or from the prefix,
// whichever is greater): SQLite starts a range scan of the primary key at
// one lower bound and only filters by any other, so with both it could walk
// every key from After up to the prefix. The prefix is literal (no LIKE): a
// key starts with it exactly when it lies in [prefix, PrefixEnd(prefix)).
const (
	sqliteRangeAfter     = `SELECT key, value FROM runlease_meta WHERE key > ? AND key < ? ORDER BY key LIMIT ?`
	sqliteRangeFrom      = `SELECT key, value FROM runlease_meta WHERE key >= ? AND key < ? ORDER BY key LIMIT ?`
	sqliteRangeAfterOpen = `SELECT key, value FROM runlease_meta WHERE key > ? ORDER BY key LIMIT ?`
	sqliteRangeFromOpen  = `SELECT key, value FROM runlease_meta WHERE key >= ? ORDER BY key LIMIT ?`
)

// sqliteRangeStmts are the prepared statements of MetaRanges, on the
// reading pool.
type sqliteRangeStmts struct {
	after, from, afterOpen, fromOpen *sql.Stmt
}

func prepareRanges(prepare func(*sql.DB, string) *sql.Stmt, r *sql.DB) sqliteRangeStmts {
	return sqliteRangeStmts{
		after:     prepare(r, sqliteRangeAfter),
		from:      prepare(r, sqliteRangeFrom),
		afterOpen: prepare(r, sqliteRangeAfterOpen),
		fromOpen:  prepare(r, sqliteRangeFromOpen),
	}
}

// MetaRanges implements [RangeReader]: one range after another, on one
// reading connection, each reading only the rows it returns; in process,
// a range costs no round trip to save.
func (s *SQLiteStore) MetaRanges(ctx context.Context, ranges []Range) ([][]Row, error) {
	if err := s.enter("MetaRanges"); err != nil {
		return nil, err
	}
	defer s.exit("MetaRanges")
	if err := CheckRanges(ranges); err != nil {
		return nil, err
	}
	first := ""
	if len(ranges) > 0 {
		first = ranges[0].Prefix
	}
	// startRead checks ctx only when it may wait; an ended context fails
	// the call here either way, as MetaScan's first row would.
	if err := ctx.Err(); err != nil {
		return nil, &StorageError{Op: "MetaRanges", Key: first, Err: err}
	}
	rctx, err := s.startRead(ctx, "MetaRanges", first)
	if err != nil {
		return nil, err
	}
	defer s.endRead()
	out := make([][]Row, len(ranges))
	for i, r := range ranges {
		if out[i], err = s.readRange(ctx, rctx, r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readRange reads one range of MetaRanges, its statement run on rctx (see
// startRead) and stopped between rows once ctx has ended.
func (s *SQLiteStore) readRange(ctx, rctx context.Context, r Range) ([]Row, error) {
	limit := int64(-1)
	if r.Limit > 0 {
		limit = int64(r.Limit)
	}
	end, bounded := PrefixEnd(r.Prefix)
	var st *sql.Stmt
	args := []any{r.Prefix}
	if r.After >= r.Prefix {
		args[0] = r.After
		st = s.stmts.ranges.afterOpen
		if bounded {
			st = s.stmts.ranges.after
		}
	} else {
		st = s.stmts.ranges.fromOpen
		if bounded {
			st = s.stmts.ranges.from
		}
	}
	if bounded {
		if args[0].(string) >= end {
			return []Row{}, nil // After is past the prefix
		}
		args = append(args, end)
	}
	rows, err := st.QueryContext(rctx, append(args, limit)...)
	if err != nil {
		return nil, s.fault("MetaRanges", r.Prefix, err)
	}
	defer rows.Close()
	out := []Row{}
	for rows.Next() {
		if s.hooks != nil && s.hooks.scanned != nil {
			s.hooks.scanned(len(out) + 1)
		}
		if err := ctx.Err(); err != nil {
			return nil, &StorageError{Op: "MetaRanges", Key: r.Prefix, Err: err}
		}
		var row Row
		if err := rows.Scan(&row.Key, &row.Value); err != nil {
			return nil, s.fault("MetaRanges", r.Prefix, err)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fault("MetaRanges", r.Prefix, err)
	}
	return out, nil
}

var _ RangeReader = (*SQLiteStore)(nil)
