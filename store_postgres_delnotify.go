package runlease

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/areev/runlease/internal/wakeup"
)

// pgDeleteNotify is the conditional delete whose RETURNING notifies wakeKey's
// subscribers when the key has a live mark, as pgUpdateNotify does for a
// write (see store_postgres_waiters.go): one statement, and a notification
// only when someone waits.
const pgDeleteNotify = `DELETE FROM %[1]s WHERE key = $1 AND value = $2
RETURNING CASE WHEN EXISTS (SELECT 1 FROM %[1]s w WHERE w.key >= $3 AND w.key < $4 AND w.value > $5) THEN pg_notify($6, $7) END`

func formatDeleteNotify(q *pgQueries, table string) {
	q.deleteNotify = fmt.Sprintf(pgDeleteNotify, table)
}

// MetaDeleteNotify implements [DeleteNotifier]: MetaDelete that, when it
// deletes while a subscriber in any process sharing the table waits on
// wakeKey, wakes it through LISTEN/NOTIFY in the same statement. The
// notification carries no row: the subscribers read what they need.
func (s *PostgresStore) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	if err := s.check(key); err != nil {
		return false, err
	}
	if err := CheckKey(wakeKey); err != nil {
		return false, err
	}
	if CheckValue(expected) != nil {
		return s.neverMatches(ctx, "MetaDeleteNotify", key)
	}
	deleted, _, err := s.deleteNotify(ctx, "MetaDeleteNotify", key, expected, wakeKey, wakeKey, nil)
	return deleted, err
}

// MetaDeleteNotifyRanges implements [DeleteReadNotifier]: the delete of
// MetaDeleteNotify, whose notification carries tag as a row
// ([wakeup.TagRow]), and the reads of MetaRanges, as statements of one
// implicit transaction: one round trip, and reads that see the delete.
// The notification leaves at the commit, with the reads done.
func (s *PostgresStore) MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []Range) (bool, [][]Row, error) {
	if err := s.check(key); err != nil {
		return false, nil, err
	}
	if err := checkDeleteRead(wakeKey, tag, ranges); err != nil {
		return false, nil, err
	}
	if CheckValue(expected) != nil {
		// No row holds it: nothing to delete, and the reads alone.
		rows, err := s.MetaRanges(ctx, ranges)
		return false, rows, err
	}
	return s.deleteNotify(ctx, "MetaDeleteNotifyRanges", key, expected, wakeKey, pgPayload(wakeKey, wakeup.TagRow(tag)), ranges)
}

// deleteNotify is the delete of MetaDeleteNotify, whose notification's
// payload is payload, followed by the reads of ranges.
func (s *PostgresStore) deleteNotify(ctx context.Context, op, key, expected, wakeKey, payload string, ranges []Range) (bool, [][]Row, error) {
	now, _ := s.ClockNow()
	from, to := pgMarkRange(wakeKey)
	// As for MetaCASNotify: the pin takes wakeKey's lock, shared, so that
	// a mark committing meanwhile is seen or sees the delete.
	rr := s.rangeReads(ranges)
	stmts := append([]pgStmt{{pgPinNotify, []any{pgMarkLockKey(s.channel, wakeKey)}},
		{s.q.deleteNotify, []any{key, expected, from, to, pgMarkTime(now.UnixMilli()), s.channel, payload}}},
		rr.stmts...)
	var n int64
	var rows [][]Row
	var run pgRun
	err := s.do(ctx, op, key, true, func(c *pgx.Conn) error {
		defer func() { run = runOf(c) }()
		res, err := send(ctx, c, stmts...)
		if err != nil {
			return err
		}
		n = res[1].CommandTag.RowsAffected()
		rows, _ = rr.rows(res[2:]) // nil when they do not parse: a hint lost
		return nil
	})
	s.note(err, n == 1, run, key)
	if err != nil {
		return false, nil, err
	}
	return n == 1, rows, nil
}

// SubscribeTags implements [DeleteReadNotifier], as Subscribe does.
func (s *PostgresStore) SubscribeTags(key string) (<-chan string, func()) {
	ch, cancel := s.listen.subs.SubscribeTags(key)
	return ch, s.listening(key, cancel)
}

var _ DeleteReadNotifier = (*PostgresStore)(nil)
