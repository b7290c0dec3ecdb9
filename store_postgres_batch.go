package runlease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// A batch is two statements sent together in one round trip, which Postgres
// runs as one implicit transaction (the extended protocol's single Sync),
// after the pins of every write (see send).
//
// The first inserts a placeholder row for every key of the batch that is
// absent, so that a concurrent insert of that key waits for this
// transaction. The second locks every key's row (FOR UPDATE, in key order),
// checks the conditions against the locked rows — a placeholder stands for
// absence — and only if all hold, and every key's row was there to lock,
// applies the ops; it removes the placeholders left over in any case. A row
// deleted by another transaction while this one waited for its lock leaves
// the batch incomplete: it writes nothing and is retried.
const (
	pgBatchPlaceholders = `INSERT INTO %s (key, value)
SELECT k, $2 FROM unnest($1::text[]) AS u(k) ORDER BY k
ON CONFLICT (key) DO NOTHING`

	pgBatchApply = `WITH locked AS (
	SELECT key, value FROM %[1]s WHERE key = ANY($1::text[]) ORDER BY key FOR UPDATE
), verdict AS (
	SELECT (SELECT count(*) FROM locked) = cardinality($1::text[]) AS complete,
		NOT EXISTS (
			SELECT 1 FROM unnest($2::text[], $3::text[], $4::bool[]) AS c(k, v, absent)
			LEFT JOIN locked l ON l.key = c.k
			WHERE l.value IS DISTINCT FROM CASE WHEN c.absent THEN $8 ELSE c.v END
		) AS holds
), ok AS (
	SELECT complete AND holds AS ok FROM verdict
), ops AS (
	SELECT * FROM unnest($5::text[], $6::text[], $7::bool[]) AS o(k, v, del)
), put AS (
	UPDATE %[1]s t SET value = ops.v FROM ops
	WHERE (SELECT ok FROM ok) AND NOT ops.del AND t.key = ops.k
	RETURNING t.key
), gone AS (
	DELETE FROM %[1]s t
	WHERE t.key = ANY($1::text[]) AND (
		((SELECT ok FROM ok) AND t.key IN (SELECT k FROM ops WHERE del))
		OR (t.value = $8 AND NOT ((SELECT ok FROM ok) AND t.key IN (SELECT k FROM ops WHERE NOT del))))
	RETURNING t.key
)
SELECT ok, complete FROM ok, verdict`
)

// pgBatchRetries bounds how often a batch that found a row deleted under it
// is tried again.
const pgBatchRetries = 8

// MetaBatch implements [Batcher] in one round trip: see the statements
// above. A batch that keeps meeting concurrent deletes of its keys fails
// after a few tries with a retryable [*StorageError] that changed nothing.
func (s *PostgresStore) MetaBatch(ctx context.Context, conds []Cond, ops []Op) (bool, error) {
	if s.closed.Load() {
		return false, ErrStoreClosed
	}
	if err := CheckBatch(conds, ops); err != nil {
		return false, err
	}
	args := pgBatchArgs(conds, ops)
	for range pgBatchRetries {
		var ok, complete bool
		err := s.do(ctx, "MetaBatch", "", true, func(c *pgx.Conn) (err error) {
			ok, complete, err = s.sendBatch(ctx, c, args)
			return err
		})
		if err != nil || complete {
			return ok && err == nil, err
		}
	}
	return false, &StorageError{Op: "MetaBatch", Retryable: true,
		Err: errors.New("rows of the batch kept being deleted by other writers")}
}

// sendBatch sends both statements and reads the verdict.
func (s *PostgresStore) sendBatch(ctx context.Context, c *pgx.Conn, args []any) (ok, complete bool, err error) {
	res, err := send(ctx, c, true,
		pgStmt{s.q.batchHold, []any{args[0], args[7]}},
		pgStmt{s.q.batchApply, args})
	if err != nil {
		return false, false, err
	}
	if len(res[1].Rows) != 1 || len(res[1].Rows[0]) != 2 {
		return false, false, errors.New("unexpected reply to a batch")
	}
	row := res[1].Rows[0]
	return string(row[0]) == "t", string(row[1]) == "t", nil
}

// pgBatchArgs lays a batch out as the arrays the statements take: $1 every
// key, $2–$4 the conditions, $5–$7 the ops, $8 the placeholder value.
func pgBatchArgs(conds []Cond, ops []Op) []any {
	var keys, ck, cv, ok, ov []string
	var cabsent, odel []bool
	for _, c := range conds {
		keys = append(keys, c.Key)
		ck = append(ck, c.Key)
		cv = append(cv, deref(c.Value))
		cabsent = append(cabsent, c.Value == nil)
	}
	for _, o := range ops {
		keys = append(keys, o.Key)
		ok = append(ok, o.Key)
		ov = append(ov, o.Value)
		odel = append(odel, o.Delete)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var token [16]byte
	_, _ = rand.Read(token[:])
	placeholder := "\x01runlease batch placeholder " + hex.EncodeToString(token[:])
	return []any{keys, ck, cv, cabsent, ok, ov, odel, placeholder}
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// formatBatch fills the table name into the batch statements.
func formatBatch(q *pgQueries, table string) {
	q.batchHold = fmt.Sprintf(pgBatchPlaceholders, table)
	q.batchApply = fmt.Sprintf(pgBatchApply, table)
}
