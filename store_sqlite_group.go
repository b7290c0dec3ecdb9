package runlease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"

	"modernc.org/sqlite"
)

// maxGroup is the most writes one group commit carries. A longer queue is
// committed in turns, so that no write waits for an unbounded transaction.
const maxGroup = 256

// Savepoint statements of a write that sends more than one statement inside
// a group commit, so that its failure takes back its own changes only.
const (
	sqliteSavepoint = `SAVEPOINT runlease_call`
	sqliteRelease   = `RELEASE runlease_call`
	sqliteUndo      = `ROLLBACK TO runlease_call`
)

// The states of a groupCall. A call is queued until a leader takes it into
// a group, taken while that group's transaction runs, and done once the
// group's outcome (its commit, and the sync to disk, or its failure) is
// recorded in the call.
const (
	callQueued = iota
	callTaken
	callRunning // its statements have been sent: it waits for the commit
	callDone
)

// groupCall is one write waiting for, or inside, a group commit.
//
// alone runs the write by itself, in its own transaction (or autocommit
// statement), on the caller's context: the path of a group of one, and of
// every write when the store commits one transaction per call. inTx runs
// the write's statements inside a group's transaction, without committing.
// Both record the write's result in res; inTx also reports in res.wrote
// whether the write changed a row.
type groupCall struct {
	ctx     context.Context
	op, key string
	alone   func(ctx context.Context, c *groupCall) error
	inTx    func(tx *sqliteTx, c *groupCall) error

	res  groupResult
	wake chan struct{} // capacity 1: promoted to lead, or done

	// Guarded by groupQueue.mu.
	state    int
	promoted bool  // the call at the head of the queue is to lead next
	skip     bool  // taken, but its context ended before it ran: never runs
	err      error // the call's error, set before state becomes callDone
}

// groupResult is what a write returns on success.
type groupResult struct {
	ok      bool
	swapped []bool
	wrote   bool
}

// groupQueue is the queue of writes waiting for the next group commit, and
// whether a leader is running one. Whenever leading is false the queue is
// empty: the call that finds it so leads at once.
type groupQueue struct {
	mu      sync.Mutex
	queue   []*groupCall
	leading bool
}

// sqliteTx is a group's transaction and the statements prepared on it.
type sqliteTx struct {
	tx                       *sql.Tx
	insert, update, del      *sql.Stmt
	get, deleteAny, upsert   *sql.Stmt
	savepoint, release, undo *sql.Stmt
}

// write runs c, alone or in a group commit, and returns its result once the
// transaction that carries it has committed and synced, or its error (and a
// zero result) once that failed. The result is read from c only once c is
// done: a call that gives up early must not read what the leader writes.
//
// A call that arrives while no write is in flight leads: it commits at once.
// Calls that arrive while a commit is in flight queue; when that commit
// ends, the first of them leads the next group, which carries every call
// queued by then (up to maxGroup), in their order of arrival, in one
// transaction and one sync. So no goroutine runs but the callers', and a
// write waits for at most the commit in flight and its own.
func (s *SQLiteStore) write(ctx context.Context, c *groupCall) (groupResult, error) {
	if s.oneTxPerCall {
		return done(c.alone(ctx, c), c)
	}
	c.ctx = ctx
	c.wake = make(chan struct{}, 1)
	q := &s.group
	q.mu.Lock()
	q.queue = append(q.queue, c)
	lead := !q.leading
	q.leading = true
	q.mu.Unlock()
	if !lead {
		var err error
		if lead, err = s.follow(ctx, c); !lead {
			if err != nil {
				return groupResult{}, err
			}
			return c.res, nil // done: follow saw it under the queue's lock
		}
	}
	return done(s.lead(c), c)
}

// done returns the result of c, run by this goroutine, and its error err.
func done(err error, c *groupCall) (groupResult, error) {
	if err != nil {
		return groupResult{}, err
	}
	return c.res, nil
}

// follow waits until c is done or promoted to lead, or until ctx ends.
// A call still queued when its context ends leaves the queue and fails as
// not applied; one already taken into a transaction fails at once with its
// outcome unknown, as the transaction may yet commit it.
func (s *SQLiteStore) follow(ctx context.Context, c *groupCall) (lead bool, err error) {
	q := &s.group
	select {
	case <-c.wake:
	case <-ctx.Done():
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case c.state == callDone:
		return false, c.err
	case c.state == callQueued && c.promoted:
		return true, nil
	case c.state == callQueued:
		// Woken by nothing but ctx (a queued call is only ever woken to
		// lead): leave the queue, and pass the lead on if it was ours.
		q.removeLocked(c)
		return false, &StorageError{Op: c.op, Key: c.key, Err: ctx.Err()}
	case c.state == callTaken:
		// Taken, not run yet: the leader will skip it, so it is not applied.
		c.skip = true
		return false, &StorageError{Op: c.op, Key: c.key, Err: ctx.Err()}
	}
	// Its statements have run: wait for the commit (which waits for no lock)
	// so that its outcome is settled when it returns.
	q.mu.Unlock()
	<-c.wake
	q.mu.Lock()
	return false, c.err
}

// removeLocked takes c, whose context ended, out of the queue; if c was to
// lead, the next call in the queue leads instead.
func (q *groupQueue) removeLocked(c *groupCall) {
	for i, o := range q.queue {
		if o == c {
			q.queue = append(q.queue[:i:i], q.queue[i+1:]...)
			break
		}
	}
	if c.promoted {
		q.promoteLocked()
	}
}

// promoteLocked hands the lead to the first call in the queue, or, when
// none waits, records that no commit is in flight.
func (q *groupQueue) promoteLocked() {
	if len(q.queue) == 0 {
		q.leading = false
		return
	}
	next := q.queue[0]
	next.promoted = true
	next.wake <- struct{}{} // never blocks: a queued call is woken once
}

// lead takes the queue's head (c itself) and the calls behind it, commits
// them, hands the lead on, and returns c's error. The group's calls are
// told their outcome only after the commit, so each returns once the sync
// that covers it is done.
func (s *SQLiteStore) lead(c *groupCall) error {
	q := &s.group
	q.mu.Lock()
	n := min(len(q.queue), maxGroup)
	group := make([]*groupCall, n)
	copy(group, q.queue)
	q.queue = append([]*groupCall(nil), q.queue[n:]...)
	for _, g := range group {
		g.state = callTaken
	}
	q.mu.Unlock()

	errs := make([]error, n)
	if n == 1 {
		if errs[0] = notStarted(c.ctx, c.op, c.key); errs[0] == nil {
			errs[0] = c.alone(c.ctx, c)
		}
	} else {
		s.commitGroup(group, errs)
	}
	if s.hooks != nil && s.hooks.committed != nil {
		s.hooks.committed(n)
	}

	q.mu.Lock()
	for i, g := range group {
		g.err, g.state = errs[i], callDone
		if g != c {
			g.wake <- struct{}{}
		}
	}
	q.promoteLocked()
	q.mu.Unlock()
	return errs[0]
}

// commitGroup runs the calls of group in one transaction, in order, and
// commits it, recording each call's error in errs. It runs on a context of
// its own: one caller's context ending must not roll back the others'
// writes. A call whose context has ended before its statements run is
// skipped, not applied.
func (s *SQLiteStore) commitGroup(group []*groupCall, errs []error) {
	ctx := context.Background()
	tx, end, err := s.beginGroup(group)
	defer end()
	if err != nil {
		for i, g := range group {
			if cerr := g.ctx.Err(); cerr != nil {
				errs[i] = &StorageError{Op: g.op, Key: g.key, Err: cerr}
			} else {
				errs[i] = s.fault(g.op, g.key, err)
			}
		}
		return
	}
	stx := &sqliteTx{tx: tx}
	ran := make([]bool, len(group))
	q := &s.group
	for i, g := range group {
		q.mu.Lock()
		cerr := g.ctx.Err()
		if g.skip || cerr != nil {
			g.skip = true
		} else {
			g.state = callRunning
		}
		q.mu.Unlock()
		if cerr != nil {
			errs[i] = &StorageError{Op: g.op, Key: g.key, Err: cerr}
			continue
		}
		if abort, err := s.runInGroup(stx, g); abort {
			s.abortGroup(tx, group, errs, ran, i, err)
			return
		} else if err != nil {
			errs[i] = err
			continue
		}
		ran[i] = true
	}
	if err := tx.Commit(); err != nil {
		// SQLite keeps a transaction open after some failed commits (a
		// busy one): end it, so that it cannot commit later and the next
		// group can begin. The error when none is open is of no interest.
		_, _ = s.w.ExecContext(ctx, "ROLLBACK")
		s.failedCommit(group, errs, ran, err)
	}
}

// beginGroup begins the group's transaction. The wait for SQLite's write
// lock (busy_timeout) ends once every call of the group has its context
// ended: nothing has been sent then, so every call fails not applied. The
// context is never cancelled once the transaction has begun; if it ends in
// the instant between, database/sql rolls the transaction back and the
// calls, all with their contexts ended, are skipped.
// The caller calls end once the transaction has ended.
func (s *SQLiteStore) beginGroup(group []*groupCall) (tx *sql.Tx, end func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	live, begun := len(group), false
	for _, g := range group {
		stop := context.AfterFunc(g.ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if live--; live == 0 && !begun {
				cancel()
			}
		})
		defer stop()
	}
	tx, err = s.w.BeginTx(ctx, nil)
	mu.Lock()
	begun = true
	mu.Unlock()
	return tx, cancel, err
}

// runInGroup runs g's statements inside the group's transaction, under a
// savepoint rolled back if any of them fails; its error is then returned
// with abort false. Even a call of one statement needs it: a constraint
// that a trigger raises with RAISE(ABORT) and one raised with
// RAISE(ROLLBACK) share an error code, and only the savepoint tells
// whether the rest of the group survived. A failure
// that the savepoint cannot take back, or that SQLite may have answered by
// rolling back the whole transaction, is returned raw, with abort true: the
// group must be rolled back whole.
func (s *SQLiteStore) runInGroup(stx *sqliteTx, g *groupCall) (abort bool, err error) {
	ctx := context.Background()
	release := stx.stmt(&stx.release, s.stmts.release)
	if _, err := stx.stmt(&stx.savepoint, s.stmts.savepoint).ExecContext(ctx); err != nil {
		return true, err
	}
	if err = g.inTx(stx, g); err == nil {
		if _, err := release.ExecContext(ctx); err != nil {
			return true, err
		}
		return false, nil
	}
	if _, uerr := stx.stmt(&stx.undo, s.stmts.undo).ExecContext(ctx); uerr != nil {
		return true, err
	}
	if _, rerr := release.ExecContext(ctx); rerr != nil {
		return true, err
	}
	// Its changes are taken back and will never commit: not applied,
	// whatever the error.
	f := s.fault(g.op, g.key, err)
	var se *StorageError
	if errors.As(f, &se) {
		se.Unknown = false
	}
	return false, f
}

// abortGroup rolls the group's transaction back after the call at failed
// failed with err in a way no savepoint could contain. Once the rollback is
// certain (SQLite had already rolled back, or the rollback succeeded), no
// call of the group is applied, the failed one included. Otherwise the
// failed call is labelled as fault labels a failed autocommit statement,
// and the calls before it that changed rows are of unknown outcome.
func (s *SQLiteStore) abortGroup(tx *sql.Tx, group []*groupCall, errs []error, ran []bool, failed int, err error) {
	rolledBack := s.rollback(tx)
	cause := fmt.Errorf("a write committed in the same transaction failed: %w", err)
	for i, g := range group {
		switch {
		case errs[i] != nil:
			// Skipped or failed on its own, before the abort.
		case i == failed && rolledBack:
			errs[i] = &StorageError{Op: g.op, Key: g.key, Err: err}
		case i == failed:
			errs[i] = s.fault(g.op, g.key, err)
		default:
			errs[i] = &StorageError{Op: g.op, Key: g.key, Err: cause, Unknown: !rolledBack && ran[i] && g.res.wrote}
		}
	}
}

// rollback ends the group's transaction and reports whether it certainly
// ended without committing. SQLite rolls a transaction back by itself
// after some failures (a full disk, an I/O error); Rollback then fails
// with "no transaction is active", which is as good.
func (s *SQLiteStore) rollback(tx *sql.Tx) bool {
	err := tx.Rollback()
	if err == nil || errors.Is(err, sql.ErrTxDone) || noTransaction(err) {
		return true
	}
	// database/sql has given the connection back: end whatever SQLite may
	// have kept open on it, so that it can never commit later.
	_, err = s.w.ExecContext(context.Background(), "ROLLBACK")
	return err == nil || noTransaction(err)
}

// noTransaction reports whether err is SQLite refusing to end a
// transaction because none is open.
func noTransaction(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && strings.Contains(e.Error(), "no transaction is active")
}

// failedCommit records the failure of the group's commit in every call
// that ran. A call that changed rows gets the commit's own classification
// (commitFault: outcome unknown after an I/O error); a call that changed
// nothing was not applied whatever became of the transaction, but its
// result was read in a transaction that did not commit, so it fails too.
func (s *SQLiteStore) failedCommit(group []*groupCall, errs []error, ran []bool, err error) {
	for i, g := range group {
		switch {
		case !ran[i]:
		case g.res.wrote:
			errs[i] = s.commitFault(g.op, g.key, err)
		default:
			errs[i] = &StorageError{Op: g.op, Key: g.key, Err: err}
		}
	}
}

// stmt returns st prepared on the group's transaction, preparing it the
// first time.
func (t *sqliteTx) stmt(cached **sql.Stmt, st *sql.Stmt) *sql.Stmt {
	return t.stmtCtx(context.Background(), cached, st)
}

// stmtCtx is stmt, preparing with ctx.
func (t *sqliteTx) stmtCtx(ctx context.Context, cached **sql.Stmt, st *sql.Stmt) *sql.Stmt {
	if *cached == nil {
		*cached = t.tx.StmtContext(ctx, st)
	}
	return *cached
}
