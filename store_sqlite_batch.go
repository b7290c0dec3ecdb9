package runlease

import (
	"context"
	"database/sql"
	"errors"
)

// MetaBatch implements [Batcher] in one transaction, begun IMMEDIATE so that
// it holds the write lock from its first read: the conditions it checks
// cannot change before its writes commit.
func (s *SQLiteStore) MetaBatch(ctx context.Context, conds []Cond, ops []Op) (applied bool, err error) {
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
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return false, s.fault("MetaBatch", "", err)
	}
	defer func() {
		if !applied {
			_ = tx.Rollback()
		}
	}()
	for _, c := range conds {
		var v string
		err := tx.QueryRowContext(ctx, sqliteGet, c.Key).Scan(&v)
		found := err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return false, s.txFault(ctx, "MetaBatch", c.Key, err)
		}
		if found != (c.Value != nil) || (found && v != *c.Value) {
			return false, nil
		}
	}
	for _, op := range ops {
		if err := s.batchOp(ctx, tx, op); err != nil {
			return false, s.txFault(ctx, "MetaBatch", op.Key, err)
		}
	}
	if err := tx.Commit(); err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			return false, s.txFault(ctx, "MetaBatch", "", err)
		}
		return false, s.commitFault("MetaBatch", "", err)
	}
	return true, nil
}

func (s *SQLiteStore) batchOp(ctx context.Context, tx *sql.Tx, op Op) error {
	if op.Delete {
		_, err := tx.ExecContext(ctx, sqliteDeleteAny, op.Key)
		return err
	}
	_, err := tx.ExecContext(ctx, sqliteUpsert, op.Key, op.Value)
	return err
}

// MetaCASNotify implements [Notifier] within this process: MetaCAS that wakes
// the key's subscribers when it writes.
func (s *SQLiteStore) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	ok, err := s.MetaCAS(ctx, key, expected, value)
	if ok {
		s.subs.wake(key)
	}
	return ok, err
}

// Subscribe implements [Notifier]. Only writes through this store wake its
// subscribers, which is every write: one process owns the file.
func (s *SQLiteStore) Subscribe(key string) (<-chan struct{}, func()) {
	return s.subs.subscribe(key)
}

// MetaCASMany implements [MultiCASer] in one transaction: one commit, and
// one sync to disk, for all the writes.
func (s *SQLiteStore) MetaCASMany(ctx context.Context, writes []CASWrite) (swapped []bool, err error) {
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
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, s.fault("MetaCASMany", "", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	insert, update := tx.StmtContext(ctx, s.stmts.insert), tx.StmtContext(ctx, s.stmts.update)
	swapped = make([]bool, len(writes))
	for i, w := range writes {
		var res sql.Result
		if w.Expected == nil {
			res, err = insert.ExecContext(ctx, w.Key, w.Value)
		} else if CheckValue(*w.Expected) == nil {
			res, err = update.ExecContext(ctx, w.Value, w.Key, *w.Expected)
		} else {
			continue // no row can hold it
		}
		if err == nil {
			var n int64
			n, err = res.RowsAffected()
			swapped[i] = n == 1
		}
		if err != nil {
			return nil, s.txFault(ctx, "MetaCASMany", w.Key, err)
		}
	}
	if err := tx.Commit(); err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			return nil, s.txFault(ctx, "MetaCASMany", "", err)
		}
		return nil, s.commitFault("MetaCASMany", "", err)
	}
	committed = true
	return swapped, nil
}
