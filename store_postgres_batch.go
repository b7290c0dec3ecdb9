package runlease

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// A batch is two statements sent together in one round trip, which Postgres
// runs as one implicit transaction (the extended protocol's single Sync),
// after the pins of every write (see send).
//
// The first takes every key of the batch, one key after another in key
// order: it locks the key's row, or, when the key is absent, inserts a
// placeholder row, so that a concurrent insert of that key waits for this
// transaction. ON CONFLICT DO UPDATE is what locks an existing row, and its
// WHERE false keeps the row as it is; it waits for a concurrent writer of
// the row, and if that writer deleted it, tries the key again, inserting or
// locking whatever is there now. So the first statement ends holding every
// key, and since every writer of several keys takes them in key order, no
// two wait for each other in a cycle.
//
// The second reads every key's row (its own locks: it never waits), checks
// the conditions against them — a placeholder stands for absence — and only
// if all hold applies the ops; it removes the placeholders left over in any
// case. It also reports whether every key's row was there: with every key
// held that is always so, and a batch that found one missing, which would
// take a server that breaks the locking above, wrote nothing and is tried
// again.
const (
	pgBatchHold = `INSERT INTO %s AS t (key, value)
SELECT k, $2 FROM unnest($1::text[]) AS u(k) ORDER BY k
ON CONFLICT (key) DO UPDATE SET value = t.value WHERE false`

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

// The pace of a batch tried again: the first pgBatchEagerTries follow at
// once, later ones after a pause that doubles from pgBatchPauseMin up to
// pgBatchPauseMax, with jitter so that batches that keep meeting each
// other fall out of step.
const (
	pgBatchEagerTries = 3
	pgBatchPauseMin   = time.Millisecond
	pgBatchPauseMax   = 50 * time.Millisecond
)

// MetaBatch implements [Batcher] in one round trip: see the statements
// above. A batch is decided, applied or not, however contended its keys:
// one that found a key's row missing wrote nothing and is tried again until
// it is decided or ctx ends, when it fails with a [*StorageError] that
// changed nothing and matches ctx's error.
func (s *PostgresStore) MetaBatch(ctx context.Context, conds []Cond, ops []Op) (bool, error) {
	if s.closed.Load() {
		return false, ErrStoreClosed
	}
	if err := CheckBatch(conds, ops); err != nil {
		return false, err
	}
	args := pgBatchArgs(conds, ops)
	pause := pgBatchPauseMin
	for try := 1; ; try++ {
		var ok, complete bool
		err := s.do(ctx, "MetaBatch", "", true, func(c *pgx.Conn) (err error) {
			ok, complete, err = s.sendBatch(ctx, c, args)
			return err
		})
		if err != nil || complete {
			return ok && err == nil, err
		}
		if try < pgBatchEagerTries {
			continue
		}
		if err := pgPause(ctx, pause/2+rand.N(pause)); err != nil {
			return false, s.fault(ctx, "MetaBatch", "", true, false, err)
		}
		pause = min(2*pause, pgBatchPauseMax)
	}
}

// pgPause waits for d or the end of ctx, whose error it returns.
func pgPause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
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
	return []any{keys, ck, cv, cabsent, ok, ov, odel, pgPlaceholder()}
}

// pgPlaceholder returns a value that no caller's row holds, to stand for an
// absent key that a call holds: random, so no caller can guess it, and led
// by a control character, which no value the library writes contains.
// Placeholders never outlive the call's transaction, so no other session
// ever reads one.
func pgPlaceholder() string {
	var token [16]byte
	_, _ = crand.Read(token[:])
	return "\x01runlease placeholder " + hex.EncodeToString(token[:])
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// formatBatch fills the table name into the batch statements.
func formatBatch(q *pgQueries, table string) {
	q.batchHold = fmt.Sprintf(pgBatchHold, table)
	q.batchApply = fmt.Sprintf(pgBatchApply, table)
}
