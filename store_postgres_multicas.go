package runlease

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// MetaCASMany is two statements in one round trip, as a batch is (see
// pgBatchHold): the first takes every key in key order, locking its row or
// holding the absent key with a placeholder, so that calls over overlapping
// keys, in whatever order their callers list them, never wait for each
// other in a cycle (a deadlock, 40P01, which the server would break by
// failing one of them). The second, which then never waits, applies each
// write whose key holds its expected value — a placeholder stands for
// absence — and removes the placeholders left over, returning the keys
// written, each with the durability pin (pgDurable): it runs for every row
// written, and the placeholders, the only other rows the call changes, are
// gone by its commit. Each row is written or not on its own, as by MetaCAS.
const pgCASManyApply = `WITH w AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bool[]) AS w(k, e, v, absent)
), put AS (
	UPDATE %[1]s t SET value = w.v FROM w
	WHERE t.key = w.k AND t.value = CASE WHEN w.absent THEN $5 ELSE w.e END
	RETURNING t.key
), gone AS (
	DELETE FROM %[1]s t
	WHERE t.key = ANY($1::text[]) AND t.value = $5 AND t.key NOT IN (SELECT key FROM put)
)
SELECT key, ` + pgDurable + ` FROM put`

// MetaCASMany implements [MultiCASer] in one round trip.
func (s *PostgresStore) MetaCASMany(ctx context.Context, writes []CASWrite) ([]bool, error) {
	if s.closed.Load() {
		return nil, ErrStoreClosed
	}
	if err := CheckCASMany(writes); err != nil {
		return nil, err
	}
	sorted := make([]CASWrite, 0, len(writes))
	for _, w := range writes {
		if w.Expected != nil && CheckValue(*w.Expected) != nil {
			continue // no row can hold it; the server would refuse the text
		}
		sorted = append(sorted, w)
	}
	slices.SortFunc(sorted, func(a, b CASWrite) int { return strings.Compare(a.Key, b.Key) })
	keys := make([]string, len(sorted))
	expected := make([]string, len(sorted))
	values := make([]string, len(sorted))
	absent := make([]bool, len(sorted))
	for i, w := range sorted {
		keys[i], expected[i], values[i], absent[i] = w.Key, deref(w.Expected), w.Value, w.Expected == nil
	}
	written := map[string]bool{}
	if len(keys) > 0 {
		placeholder := pgPlaceholder()
		var run pgRun
		err := s.do(ctx, "MetaCASMany", "", true, func(c *pgx.Conn) error {
			defer func() { run = runOf(c) }()
			res, err := sendByIndex(ctx, c,
				pgStmt{s.q.batchHold, []any{keys, placeholder}},
				pgStmt{s.q.casMany, []any{keys, expected, values, absent, placeholder}})
			if err == nil {
				for _, r := range res[1].Rows {
					written[string(r[0])] = true
				}
			}
			return err
		})
		s.note(err, false, run, keys...)
		if err != nil {
			return nil, err
		}
	}
	if s.doubts.any() {
		s.note(nil, true, pgRun{}, slices.Collect(maps.Keys(written))...)
	}
	swapped := make([]bool, len(writes))
	for i, w := range writes {
		swapped[i] = written[w.Key]
	}
	return swapped, nil
}

func formatCASMany(q *pgQueries, table string) {
	q.casMany = fmt.Sprintf(pgCASManyApply, table)
}
