package runlease

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// pgRangesOne reads several ranges in one statement: for each range (the
// arrays' i-th elements, numbered by i), the rows of pgRange, found by the
// same index scan of the primary key (the lateral subquery is a
// parameterized index scan per range). Every statement of a call costs
// the server its own parse of the message, snapshot and portal: a claim's
// read of seven ranges is one statement instead of seven. A range whose
// prefix has no end (PrefixEnd) is read by pgRangeOpen.
const pgRangesOne = `SELECT r.i, x.key, x.value
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS r(after, lo, hi, lim, i)
CROSS JOIN LATERAL (SELECT key, value FROM %s WHERE key > r.after AND key >= r.lo AND key < r.hi ORDER BY key LIMIT r.lim) x`

func formatRanges(q *pgQueries, table string) {
	q.rangeTo = fmt.Sprintf(pgRange, table)
	q.rangeOpen = fmt.Sprintf(pgRangeOpen, table)
	q.rangesOne = fmt.Sprintf(pgRangesOne, table)
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
	rr := s.rangeReads(ranges)
	var out [][]Row
	err := s.do(ctx, "MetaRanges", ranges[0].Prefix, false, func(c *pgx.Conn) error {
		res, err := send(ctx, c, rr.stmts...)
		if err == nil {
			out, err = rr.rows(res)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// pgRangeReads is the statements that read some ranges, and how their
// results map back to the ranges.
type pgRangeReads struct {
	n     int
	stmts []pgStmt
	// one lists the ranges the first statement reads (pgRangesOne), in
	// the order of its i; the others are read one to a statement, in
	// order, by the statements that follow.
	one []int
}

// rangeReads returns the statements that read ranges: one pgRangesOne
// for every range whose prefix has an end, when there are two or more of
// them, and one statement for each other range.
func (s *PostgresStore) rangeReads(ranges []Range) pgRangeReads {
	rr := pgRangeReads{n: len(ranges)}
	var afters, los, his []string
	var lims []*int64
	var single []int
	for i, r := range ranges {
		if end, ok := PrefixEnd(r.Prefix); ok {
			rr.one = append(rr.one, i)
			afters, los, his = append(afters, r.After), append(los, r.Prefix), append(his, end)
			var lim *int64 // NULL: every row
			if r.Limit > 0 {
				l := int64(r.Limit)
				lim = &l
			}
			lims = append(lims, lim)
			continue
		}
		single = append(single, i)
	}
	if len(rr.one) < 2 {
		single, rr.one = nil, nil
		for i := range ranges {
			single = append(single, i)
		}
	} else {
		rr.stmts = append(rr.stmts, pgStmt{s.q.rangesOne, []any{afters, los, his, lims}})
	}
	for _, i := range single {
		r := ranges[i]
		var limit any // NULL: every row
		if r.Limit > 0 {
			limit = int64(r.Limit)
		}
		st := pgStmt{s.q.rangeOpen, []any{r.After, r.Prefix, limit}}
		if end, ok := PrefixEnd(r.Prefix); ok {
			st = pgStmt{s.q.rangeTo, []any{r.After, r.Prefix, end, limit}}
		}
		rr.stmts = append(rr.stmts, st)
	}
	return rr
}

// rows returns the rows of each range from res, the results of rr.stmts.
func (rr pgRangeReads) rows(res []*pgconn.Result) ([][]Row, error) {
	out := make([][]Row, rr.n)
	next := 0
	if len(rr.one) > 0 {
		for _, r := range res[0].Rows {
			k, err := strconv.Atoi(string(r[0]))
			if err != nil || k < 1 || k > len(rr.one) {
				return nil, fmt.Errorf("range read: range number %q out of range", r[0])
			}
			i := rr.one[k-1]
			out[i] = append(out[i], Row{Key: string(r[1]), Value: string(r[2])})
		}
		for _, i := range rr.one {
			if out[i] == nil {
				out[i] = []Row{}
			}
			// The nested loop returns each range's rows in key order; a
			// plan that did not is put right.
			if !slices.IsSortedFunc(out[i], compareRowKeys) {
				slices.SortFunc(out[i], compareRowKeys)
			}
		}
		next = 1
	}
	for i := range out {
		if out[i] == nil {
			out[i] = resultRows(res[next])
			next++
		}
	}
	return out, nil
}

func compareRowKeys(a, b Row) int { return strings.Compare(a.Key, b.Key) }

// resultRows returns the (key, value) rows of a read's result.
func resultRows(res *pgconn.Result) []Row {
	rows := make([]Row, 0, len(res.Rows))
	for _, r := range res.Rows {
		rows = append(rows, Row{Key: string(r[0]), Value: string(r[1])})
	}
	return rows
}

var _ RangeReader = (*PostgresStore)(nil)
