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
	"github.com/jackc/pgx/v5/pgconn"
)

// A batch in the shape of a fenced write is one statement (pgBatchFenced
// and pgBatchFencedOne below). Any other batch is two statements sent
// together in one round trip, which Postgres runs as one implicit
// transaction (the extended protocol's single Sync), after the pins of
// every write (see send).
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
// again. Its one row also carries the durability pin (pgDurable), so that
// it runs whatever the batch wrote.
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
SELECT ok, complete, ` + pgDurable + ` FROM ok, verdict`

	// pgBatchFenced is a batch in the shape of every fenced write (see
	// pgFencedShape) as one statement: the conditional UPDATE of the
	// condition's key, and an upsert of the other keys that draws its rows
	// from the UPDATE's, so that it writes only if the UPDATE did. At READ
	// COMMITTED an UPDATE that waited for a concurrent writer of its row
	// checks its WHERE again against the row that writer committed
	// (EvalPlanQual), so the condition is decided on the row as it stands
	// once this transaction holds it, and stays so until the commit. The
	// upsert takes its keys in key order, after the condition's key; it
	// affects every one of its rows (ON CONFLICT DO UPDATE without WHERE
	// always writes), so the command's row count is the number of other
	// keys when the batch applied and 0 when it did not. $1–$3 are the
	// condition's key, its expected value and the value put there; $4 and
	// $5 the other keys and their values. pgBatchFencedOne is the same for
	// one other key, which a fenced write of one key is: scalars, not
	// arrays, spare the server the unnest and the sort. The UPDATE's
	// RETURNING pins the durability (pgDurable) when it writes, which is
	// when anything is written.
	pgBatchFencedOne = `WITH l AS (
	UPDATE %[1]s SET value = $3 WHERE key = $1 AND value = $2 RETURNING ` + pgDurable + `
)
INSERT INTO %[1]s (key, value) SELECT $4, $5 FROM l
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`
	pgBatchFenced = `WITH l AS (
	UPDATE %[1]s SET value = $3 WHERE key = $1 AND value = $2 RETURNING ` + pgDurable + `
)
INSERT INTO %[1]s (key, value)
SELECT u.k, u.v FROM l, unnest($4::text[], $5::text[]) AS u(k, v) ORDER BY u.k
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`
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

// MetaBatch implements [Batcher] in one round trip: a batch in the shape of
// a fenced write (see pgFencedShape) as one statement (pgBatchFenced),
// any other as the two statements above. A batch is decided, applied or
// not, however contended its keys: one that found a key's row missing, or
// that the server failed to break a deadlock or as a serialization failure
// (an ERROR, which rolls its transaction back), wrote nothing and is tried
// again until it is decided or ctx ends, when it fails with a
// [*StorageError] that changed nothing and matches ctx's error.
//
// The two-statement form takes its keys in key order, so two such batches
// never wait for each other in a cycle; the fenced form takes the
// condition's key first, so it can, with a batch or a MetaCASMany that
// shares two of its keys and takes them in the other order. The server
// then fails one of the two (40P01, after deadlock_timeout), which is tried
// again in the two-statement form, in key order.
func (s *PostgresStore) MetaBatch(ctx context.Context, conds []Cond, ops []Op) (bool, error) {
	if s.closed.Load() {
		return false, ErrStoreClosed
	}
	if err := CheckBatch(conds, ops); err != nil {
		return false, err
	}
	b := &pgBatch{conds: conds, ops: ops, fenced: pgFencedShape(conds, ops)}
	pause := pgBatchPauseMin
	for try := 1; ; try++ {
		var ok, decided, aborted bool
		var run pgRun
		err := s.do(ctx, "MetaBatch", "", true, func(c *pgx.Conn) (err error) {
			defer func() { run = runOf(c) }()
			ok, decided, err = s.sendOnce(ctx, c, b)
			aborted = pgAborted(err)
			return err
		})
		if (err != nil && !aborted) || (err == nil && decided) {
			if err != nil || s.doubts.any() {
				s.note(err, ok && err == nil, run, opKeys(ops)...)
			}
			return ok && err == nil, err
		}
		if aborted {
			b.fenced = nil // try again in key order
		}
		if try < pgBatchEagerTries {
			continue
		}
		if err := sleepCtx(ctx, pause/2+rand.N(pause)); err != nil {
			return false, s.fault(ctx, "MetaBatch", "", true, false, err)
		}
		pause = min(2*pause, pgBatchPauseMax)
	}
}

// pgBatch is a batch as MetaBatch sends it: fenced when it has that shape
// and is still to be sent in that form, and the arguments of the
// two-statement form once they are needed.
type pgBatch struct {
	conds  []Cond
	ops    []Op
	fenced *pgFenced
	args   []any
}

// sendOnce sends b in its form and reads the verdict: decided is false
// when the two-statement form found a key's row missing.
func (s *PostgresStore) sendOnce(ctx context.Context, c *pgx.Conn, b *pgBatch) (ok, decided bool, err error) {
	if b.fenced != nil {
		ok, err = s.sendFenced(ctx, c, b.fenced)
		return ok, err == nil, err
	}
	if b.args == nil {
		b.args = pgBatchArgs(b.conds, b.ops)
	}
	return s.sendBatch(ctx, c, b.args)
}

// pgAborted reports whether err is the server's ERROR for a deadlock it
// broke (40P01) or a serialization failure (40001): either rolls the
// call's implicit transaction back, whole, and a new try may succeed.
func pgAborted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !pgFatal(pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// sendBatch sends both statements and reads the verdict.
func (s *PostgresStore) sendBatch(ctx context.Context, c *pgx.Conn, args []any) (ok, complete bool, err error) {
	res, err := sendByIndex(ctx, c,
		pgStmt{s.q.batchHold, []any{args[0], args[7]}},
		pgStmt{s.q.batchApply, args})
	if err != nil {
		return false, false, err
	}
	if len(res[1].Rows) != 1 || len(res[1].Rows[0]) != 3 {
		return false, false, errors.New("unexpected reply to a batch")
	}
	row := res[1].Rows[0]
	return string(row[0]) == "t", string(row[1]) == "t", nil
}

// pgFenced is a batch in the shape of every fenced write: key holds
// expected, and the batch puts value there and values at keys.
type pgFenced struct {
	key, expected, value string
	keys, values         []string
}

// pgFencedShape returns a checked batch as a pgFenced when it has exactly
// one condition, that a key holds a value, and only puts, one of them on
// that key; nil otherwise (an absent-key condition, several conditions or
// a delete take the two-statement form). CheckBatch has made sure that no
// two ops share a key, so the other puts are on other keys, each once.
func pgFencedShape(conds []Cond, ops []Op) *pgFenced {
	if len(conds) != 1 || conds[0].Value == nil {
		return nil
	}
	f := &pgFenced{key: conds[0].Key, expected: *conds[0].Value}
	found := false
	for _, o := range ops {
		switch {
		case o.Delete:
			return nil
		case o.Key == f.key:
			f.value, found = o.Value, true
		default:
			f.keys = append(f.keys, o.Key)
			f.values = append(f.values, o.Value)
		}
	}
	if !found {
		return nil
	}
	return f
}

// sendFenced sends f as one statement: pgBatchFenced, pgBatchFencedOne,
// or, with no other key, the conditional UPDATE alone, which is MetaCAS's.
func (s *PostgresStore) sendFenced(ctx context.Context, c *pgx.Conn, f *pgFenced) (bool, error) {
	var st pgStmt
	switch len(f.keys) {
	case 0:
		st = pgStmt{s.q.update, []any{f.key, f.expected, f.value}}
	case 1:
		st = pgStmt{s.q.batchFencedOne, []any{f.key, f.expected, f.value, f.keys[0], f.values[0]}}
	default:
		st = pgStmt{s.q.batchFenced, []any{f.key, f.expected, f.value, f.keys, f.values}}
	}
	want := int64(max(len(f.keys), 1))
	res, err := send(ctx, c, st)
	if err != nil {
		return false, err
	}
	switch res[0].CommandTag.RowsAffected() {
	case 0:
		return false, nil
	case want:
		return true, nil
	}
	return false, errors.New("unexpected reply to a batch")
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
	q.batchFenced = fmt.Sprintf(pgBatchFenced, table)
	q.batchFencedOne = fmt.Sprintf(pgBatchFencedOne, table)
}
