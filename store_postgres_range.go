package runlease

import (
	"context"
	"fmt"
)

// The statements of MetaRanges: the rows after $1 that start with $2, in
// key order, at most $4 (or $3) of them; a NULL limit is no limit. The
// prefix is literal (no LIKE): a key starts with it exactly when it lies in
// [prefix, PrefixEnd(prefix)), and pgRangeOpen serves the prefixes that have
// no end. Both bounds below are index conditions on the primary key: the
// scan starts at the greater of After and the prefix, and stops after the
// limit's last row, so reading the head of a long prefix costs what it
// costs on a short one.
const (
	pgRange     = `SELECT key, value FROM %s WHERE key > $1 AND key >= $2 AND key < $3 ORDER BY key LIMIT $4`
	pgRangeOpen = `SELECT key, value FROM %s WHERE key > $1 AND key >= $2 ORDER BY key LIMIT $3`
)

func formatRanges(q *pgQueries, table string) {
	q.rangeTo = fmt.Sprintf(pgRange, table)
	q.rangeOpen = fmt.Sprintf(pgRangeOpen, table)
}

// MetaRanges implements [RangeReader]: the ranges travel as statements of
// one message, so they cost one round trip, and each reads only the rows
// it returns.
func (s *PostgresStore) MetaRanges(ctx context.Context, ranges []Range) ([][]Row, error) {
	if s.closed.Load() {
		return nil, ErrStoreClosed
	}
	if err := CheckRanges(ranges); err != nil {
		return nil, err
	}
	if len(ranges) == 0 {
		return [][]Row{}, nil
	}
	stmts := make([]pgStmt, len(ranges))
	for i, r := range ranges {
		var limit any // NULL: every row
		if r.Limit > 0 {
			limit = int64(r.Limit)
		}
		stmts[i] = pgStmt{s.q.rangeOpen, []any{r.After, r.Prefix, limit}}
		if end, ok := PrefixEnd(r.Prefix); ok {
			stmts[i] = pgStmt{s.q.rangeTo, []any{r.After, r.Prefix, end, limit}}
		}
	}
	return s.readRows(ctx, "MetaRanges", ranges[0].Prefix, stmts)
}

var _ RangeReader = (*PostgresStore)(nil)
