package runlease

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
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
	now, _ := s.ClockNow()
	from, to := pgMarkRange(wakeKey)
	del := pgStmt{s.q.deleteNotify, []any{key, expected, from, to, pgMarkTime(now.UnixMilli()), s.channel, wakeKey}}
	var n int64
	var run pgRun
	err := s.do(ctx, "MetaDeleteNotify", key, true, func(c *pgx.Conn) error {
		defer func() { run = runOf(c) }()
		// As for MetaCASNotify: the pin takes wakeKey's lock, shared, so
		// that a mark committing meanwhile is seen or sees the delete.
		res, err := send(ctx, c, pgStmt{pgPinNotify, []any{pgMarkLockKey(s.channel, wakeKey)}}, del)
		if err == nil {
			n = res[1].CommandTag.RowsAffected()
		}
		return err
	})
	s.note(err, n == 1, run, key)
	return n == 1, err
}
