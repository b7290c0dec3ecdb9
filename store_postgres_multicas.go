package runlease

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pgCASMany performs many independent conditional writes in one statement:
// updates of rows that hold exactly their expected value, and inserts of
// absent keys, returning the keys written. Each row is written or not on its
// own, as by MetaCAS.
const pgCASMany = `WITH w AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bool[]) AS w(k, e, v, absent)
), upd AS (
	UPDATE %[1]s t SET value = w.v FROM w
	WHERE NOT w.absent AND t.key = w.k AND t.value = w.e
	RETURNING t.key
), ins AS (
	INSERT INTO %[1]s (key, value) SELECT k, v FROM w WHERE w.absent
	ON CONFLICT (key) DO NOTHING
	RETURNING key
)
SELECT key FROM upd UNION ALL SELECT key FROM ins`

// MetaCASMany implements [MultiCASer] in one statement and one round trip,
// after the pins of every write (see send).
func (s *PostgresStore) MetaCASMany(ctx context.Context, writes []CASWrite) ([]bool, error) {
	if s.closed.Load() {
		return nil, ErrStoreClosed
	}
	if err := CheckCASMany(writes); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(writes))
	expected := make([]string, 0, len(writes))
	values := make([]string, 0, len(writes))
	absent := make([]bool, 0, len(writes))
	at := make(map[string]int, len(writes))
	for i, w := range writes {
		if w.Expected != nil && CheckValue(*w.Expected) != nil {
			continue // no row can hold it; the server would refuse the text
		}
		keys, values = append(keys, w.Key), append(values, w.Value)
		expected, absent = append(expected, deref(w.Expected)), append(absent, w.Expected == nil)
		at[w.Key] = i
	}
	swapped := make([]bool, len(writes))
	if len(keys) == 0 {
		return swapped, nil
	}
	err := s.do(ctx, "MetaCASMany", "", true, func(c *pgx.Conn) error {
		res, err := send(ctx, c, true, pgStmt{s.q.casMany, []any{keys, expected, values, absent}})
		if err == nil {
			for _, r := range res[0].Rows {
				swapped[at[string(r[0])]] = true
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return swapped, nil
}

func formatCASMany(q *pgQueries, table string) {
	q.casMany = fmt.Sprintf(pgCASMany, table)
}
