package runlease

import (
	"context"
	"database/sql"
	"errors"

	"github.com/areev/runlease/internal/wakeup"
)

// MetaBatch implements [Batcher] in one transaction, begun IMMEDIATE so that
// it holds the write lock from its first read: the conditions it checks
// cannot change before its writes commit. Batches from concurrent
// goroutines share transactions and syncs with other writes, each under a
// savepoint of its own (see [SQLiteStore]).
func (s *SQLiteStore) MetaBatch(ctx context.Context, conds []Cond, ops []Op) (bool, error) {
	if err := s.enter("MetaBatch"); err != nil {
		return false, err
	}
	defer s.exit("MetaBatch")
	if s.w == nil {
		return false, invalidArg("store", "%q was opened read-only", s.path)
	}
	if err := CheckBatch(conds, ops); err != nil {
		return false, err
	}
	c := &groupCall{op: "MetaBatch"}
	c.alone = func(ctx context.Context, c *groupCall) (err error) {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return s.fault("MetaBatch", "", err)
		}
		defer func() {
			if !c.res.ok {
				_ = tx.Rollback()
			}
		}()
		ok, key, err := s.batchIn(ctx, &sqliteTx{tx: tx}, conds, ops)
		if err != nil || !ok {
			if err != nil {
				err = s.txFault(ctx, "MetaBatch", key, err)
			}
			return err
		}
		if err := tx.Commit(); err != nil {
			if errors.Is(err, sql.ErrTxDone) {
				return s.txFault(ctx, "MetaBatch", "", err)
			}
			return s.commitFault("MetaBatch", "", err)
		}
		c.res.ok = true
		return nil
	}
	c.inTx = func(t *sqliteTx, c *groupCall) error {
		ok, _, err := s.batchIn(context.Background(), t, conds, ops)
		c.res.ok, c.res.wrote = ok && err == nil, ok && err == nil
		return err
	}
	res, err := s.write(ctx, c)
	return res.ok, err
}

// batchIn checks the conditions of a batch in t and, if they all hold,
// applies its ops; on a failure it returns the key at fault.
func (s *SQLiteStore) batchIn(ctx context.Context, t *sqliteTx, conds []Cond, ops []Op) (applied bool, key string, err error) {
	for _, c := range conds {
		var v string
		err := t.stmtCtx(ctx, &t.get, s.stmts.getW).QueryRowContext(ctx, c.Key).Scan(&v)
		found := err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return false, c.Key, err
		}
		if found != (c.Value != nil) || (found && v != *c.Value) {
			return false, "", nil
		}
	}
	for _, op := range ops {
		if err := s.batchOp(ctx, t, op); err != nil {
			return false, op.Key, err
		}
	}
	return true, "", nil
}

func (s *SQLiteStore) batchOp(ctx context.Context, t *sqliteTx, op Op) error {
	if op.Delete {
		_, err := t.stmtCtx(ctx, &t.deleteAny, s.stmts.deleteAny).ExecContext(ctx, op.Key)
		return err
	}
	_, err := t.stmtCtx(ctx, &t.upsert, s.stmts.upsert).ExecContext(ctx, op.Key, op.Value)
	return err
}

// MetaCASNotify implements [Notifier] within this process: MetaCAS that wakes
// the key's subscribers when it writes.
func (s *SQLiteStore) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	ok, err := s.MetaCAS(ctx, key, expected, value)
	if ok {
		s.subs.Wake(key, value)
	}
	return ok, err
}

// MetaDeleteNotify implements [DeleteNotifier] within this process:
// MetaDelete that wakes the subscribers of wakeKey when it deletes (or may
// have: a wake-up is a hint, and a needless one costs a read).
func (s *SQLiteStore) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	if err := CheckKey(wakeKey); err != nil {
		return false, err
	}
	ok, err := s.MetaDelete(ctx, key, expected)
	if ok || IsOutcomeUnknown(err) {
		s.subs.Wake(wakeKey, "")
	}
	return ok, err
}

// MetaDeleteNotifyRanges implements [DeleteReadNotifier] within this
// process: MetaDeleteNotify, whose wake-up carries tag, then MetaRanges of
// ranges. The reads follow the delete's commit, so they see it.
func (s *SQLiteStore) MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []Range) (bool, [][]Row, error) {
	if err := checkDeleteRead(wakeKey, tag, ranges); err != nil {
		return false, nil, err
	}
	ok, err := s.MetaDelete(ctx, key, expected)
	if ok || IsOutcomeUnknown(err) {
		s.subs.Wake(wakeKey, wakeup.TagRow(tag))
	}
	if err != nil {
		return false, nil, err
	}
	rows, err := s.MetaRanges(ctx, ranges)
	if err != nil {
		return ok, nil, nil // the reads are a hint; the delete is done
	}
	return ok, rows, nil
}

// SubscribeTags implements [DeleteReadNotifier], as Subscribe does.
func (s *SQLiteStore) SubscribeTags(key string) (<-chan string, func()) {
	return s.subs.SubscribeTags(key)
}

var _ DeleteReadNotifier = (*SQLiteStore)(nil)

// Subscribe implements [Notifier]. Only writes through this store wake its
// subscribers, which is every write: one process owns the file.
func (s *SQLiteStore) Subscribe(key string) (<-chan struct{}, func()) {
	return s.subs.Subscribe(key)
}

// SubscribeRows implements [RowNotifier], as Subscribe does.
func (s *SQLiteStore) SubscribeRows(key string) (<-chan string, func()) {
	return s.subs.SubscribeRows(key)
}

// MetaCASMany implements [MultiCASer] in one transaction: one commit, and
// one sync to disk, for all the writes. Calls from concurrent goroutines
// share transactions and syncs with other writes, each under a savepoint
// of its own (see [SQLiteStore]).
func (s *SQLiteStore) MetaCASMany(ctx context.Context, writes []CASWrite) ([]bool, error) {
	if err := s.enter("MetaCASMany"); err != nil {
		return nil, err
	}
	defer s.exit("MetaCASMany")
	if s.w == nil {
		return nil, invalidArg("store", "%q was opened read-only", s.path)
	}
	if err := CheckCASMany(writes); err != nil {
		return nil, err
	}
	c := &groupCall{op: "MetaCASMany"}
	c.alone = func(ctx context.Context, c *groupCall) error {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return s.fault("MetaCASMany", "", err)
		}
		committed := false
		defer func() {
			if !committed {
				_ = tx.Rollback()
			}
		}()
		t := &sqliteTx{tx: tx}
		swapped, key, err := s.casManyIn(ctx, t, writes)
		if err != nil {
			return s.txFault(ctx, "MetaCASMany", key, err)
		}
		if err := tx.Commit(); err != nil {
			if errors.Is(err, sql.ErrTxDone) {
				return s.txFault(ctx, "MetaCASMany", "", err)
			}
			return s.commitFault("MetaCASMany", "", err)
		}
		committed = true
		c.res.swapped = swapped
		return nil
	}
	c.inTx = func(t *sqliteTx, c *groupCall) error {
		swapped, _, err := s.casManyIn(context.Background(), t, writes)
		c.res.swapped = swapped
		for _, ok := range swapped {
			c.res.wrote = c.res.wrote || ok
		}
		return err
	}
	res, err := s.write(ctx, c)
	return res.swapped, err
}

// casManyIn makes the writes of a MetaCASMany in t and reports which
// swapped; on a failure it returns the key at fault.
func (s *SQLiteStore) casManyIn(ctx context.Context, t *sqliteTx, writes []CASWrite) ([]bool, string, error) {
	swapped := make([]bool, len(writes))
	for i, w := range writes {
		var res sql.Result
		var err error
		if w.Expected == nil {
			res, err = t.stmtCtx(ctx, &t.insert, s.stmts.insert).ExecContext(ctx, w.Key, w.Value)
		} else if CheckValue(*w.Expected) == nil {
			res, err = t.stmtCtx(ctx, &t.update, s.stmts.update).ExecContext(ctx, w.Value, w.Key, *w.Expected)
		} else {
			continue // no row can hold it
		}
		if swapped[i], err = rowChanged(res, err); err != nil {
			return nil, w.Key, err
		}
	}
	return swapped, "", nil
}
