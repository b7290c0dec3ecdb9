package runlease

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"
)

// A Postgres store whose subscribers wait on a key marks the key in the
// table, so that a write that notifies does so only when someone waits:
// NOTIFY serialises the commits of the transactions that send it on one
// lock, held until the commit's WAL is flushed, so releases that all
// notified could not share flushes with each other (group commit). With the
// marks, a release nobody waits for is a plain conditional write plus an
// index probe; one that somebody waits for notifies in its own statement,
// and the waiter takes over at once: two round trips in all.
//
// A mark is a row WaitPrefix + key + "\x1f" + the store's id, whose value is
// the server time, in milliseconds as 20 digits (so that text order is
// number order), until which it stands. The store writes it when a key's
// first subscriber comes, refreshes it while any remain, and deletes it
// pgListenLinger after the last one left, unless another came meanwhile (a
// driver that claims at every superstep would otherwise write and delete
// it at every claim); a process that dies leaves marks that expire
// after pgMarkTTL and that any waiting store deletes. A write that notifies
// looks for a live mark of its key in the same statement, under the
// statement's snapshot: a mark that commits after that snapshot is missed,
// which is why a mark, once written, wakes its key's subscribers to read
// again. Marks are hints, like notifications: one missed or stale costs a
// poll or a needless notification, never a wrong answer.
//
// A write that notifies could still miss a mark that commits after its
// statement's snapshot while the write itself has not committed yet: the
// mark's wake-up would then have its subscribers read the row before the
// write, and nothing would tell them of the write. An advisory lock per key
// orders the two: a notifying write takes it shared in the statement before
// the one that looks for marks (so that statement's snapshot comes after the
// lock), and a mark is written under it exclusive. A mark written first is
// then seen by the write; a write first makes the mark wait for its commit,
// so that the mark's wake-up reads the written row. Writes do not block each
// other on it.
//
// Marks are written without waiting for their WAL flush
// (synchronous_commit off): a mark lost to a crash of the server only costs
// a poll.

const (
	pgMarkTTL     = 30 * time.Second
	pgMarkRefresh = 10 * time.Second
	pgMarkSep     = "\x1f"
)

const (
	pgMarkPut = `INSERT INTO %s AS t (key, value) SELECT k, $2 FROM unnest($1::text[]) AS u(k) ORDER BY k
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`
	pgMarkDelete  = `DELETE FROM %s WHERE key = ANY($1::text[])`
	pgMarkExpired = `DELETE FROM %s WHERE key >= $1 AND key < $2 AND value < $3`
	pgAsyncCommit = `SELECT set_config('synchronous_commit', 'off', true)`
	// pgMarkLock takes the locks of keys given in ascending order: unnest
	// yields them in that order, so marks never wait for each other in a
	// cycle.
	pgMarkLock = `SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS u(k)`
	// pgPinNotify leads a notifying write: it takes the key's lock,
	// shared, and pins the write's durability (pgDurable; a statement
	// that always runs once, where the write's RETURNING runs only for a
	// row written and already has its notification to compute).
	pgPinNotify = `SELECT pg_advisory_xact_lock_shared($1), ` + pgDurable
)

// pgMarkLockKey is the advisory lock of key in the table whose channel is
// channel: a hash, since advisory locks are database-wide numbers; keys
// whose hashes collide only wait for each other now and then.
func pgMarkLockKey(channel, key string) int64 {
	h := fnv.New64a()
	h.Write([]byte(channel))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int64(h.Sum64())
}

// pgWaiters is what a store knows of its own subscribers' marks. mu is a
// leaf lock; marks are written by the mark loop alone, outside it.
type pgWaiters struct {
	id     string
	kick   chan struct{} // wakes the mark loop; buffered, one pending
	mu     sync.Mutex
	subs   map[string]int       // key → its subscriptions
	marked map[string]int64     // key → the until_ms of its mark in the table
	left   map[string]time.Time // key nobody subscribes → when its last subscription ended
}

func newPgWaiters() pgWaiters {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return pgWaiters{id: hex.EncodeToString(b[:]), kick: make(chan struct{}, 1),
		subs: map[string]int{}, marked: map[string]int64{}, left: map[string]time.Time{}}
}

// pgMarkRange returns the keys between which the marks of key lie.
func pgMarkRange(key string) (from, to string) {
	return WaitPrefix + key + pgMarkSep, WaitPrefix + key + "\x20"
}

// pgMarkTime is t as a mark's value.
func pgMarkTime(ms int64) string { return fmt.Sprintf("%020d", max(ms, 0)) }

func (w *pgWaiters) markKey(key string) string { return WaitPrefix + key + pgMarkSep + w.id }

// add counts a subscription of key and has the loop mark it.
func (w *pgWaiters) add(key string) {
	w.mu.Lock()
	w.subs[key]++
	delete(w.left, key)
	w.mu.Unlock()
	w.poke()
}

// remove ends a subscription of key; the loop deletes the mark of a key
// nobody has waited on for pgListenLinger.
func (w *pgWaiters) remove(key string) {
	w.mu.Lock()
	if w.subs[key]--; w.subs[key] <= 0 {
		delete(w.subs, key)
		w.left[key] = time.Now()
	}
	w.mu.Unlock()
	w.poke()
}

func (w *pgWaiters) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// markLoop keeps the marks of the store's subscriptions until ctx ends,
// when it deletes them.
func (s *PostgresStore) markLoop(ctx context.Context) {
	tick := time.NewTicker(pgMarkRefresh)
	defer tick.Stop()
	linger := time.NewTimer(time.Hour)
	defer linger.Stop()
	sweep := true
	for {
		if next := s.syncMarks(ctx, sweep); next > 0 {
			linger.Reset(next)
		}
		sweep = false
		select {
		case <-linger.C: // a mark's linger ended
		case <-ctx.Done():
			// Delete every mark on a context of its own: the loop's has
			// ended. A mark left behind expires.
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			s.dropMarks(dctx)
			cancel()
			return
		case <-s.waiters.kick:
		case <-tick.C:
			sweep = true
		}
	}
}

// dropMarks deletes every mark the store holds, as the mark loop ends.
// A subscription that came meanwhile, and found the loop ending, started a
// new one: the marks it needs are written again (see syncMarks).
func (s *PostgresStore) dropMarks(ctx context.Context) {
	w := &s.waiters
	var del []string
	w.mu.Lock()
	for key := range w.marked {
		del = append(del, w.markKey(key))
	}
	w.mu.Unlock()
	if len(del) > 0 {
		s.deleteMarks(ctx, del)
	}
}

// deleteMarks deletes the marks del, and forgets them: a key subscribed
// meanwhile is marked again by the next round of the loop.
func (s *PostgresStore) deleteMarks(ctx context.Context, del []string) {
	w := &s.waiters
	if s.markExec(ctx, s.q.markDelete, del) != nil {
		return
	}
	again := false
	w.mu.Lock()
	for _, mk := range del {
		key := mk[len(WaitPrefix) : len(mk)-len(pgMarkSep)-len(w.id)]
		delete(w.marked, key)
		if w.subs[key] == 0 {
			delete(w.left, key)
		}
		again = again || w.subs[key] > 0
	}
	w.mu.Unlock()
	if again {
		w.poke()
	}
}

// syncMarks writes the marks of keys waited on that have none, or one due
// for refresh, deletes those of keys nobody has waited on for
// pgListenLinger, and, when sweep, every expired mark of any store. It
// wakes the subscribers of the keys it marked afresh, so that they read
// what a write that missed the mark did not tell them. A failure leaves the
// work for the next round. It returns how long until the linger of a mark
// it kept ends (0: none lingers).
//
// A lingering mark is not refreshed: it stands for pgMarkTTL from its last
// write, and a mark is written again once less than pgMarkTTL less
// pgMarkRefresh and a second is left, far more than pgListenLinger. A key
// subscribed again while its mark lingers keeps the mark, which has stood
// all along: writes since it was written have notified, so there is
// nothing to wake its subscribers for.
func (s *PostgresStore) syncMarks(ctx context.Context, sweep bool) (next time.Duration) {
	w := &s.waiters
	now, _ := s.ClockNow()
	nowMS := now.UnixMilli()
	until := nowMS + pgMarkTTL.Milliseconds()
	var put, del, putKeys, fresh []string
	mono := time.Now()
	w.mu.Lock()
	for key := range w.subs {
		if w.marked[key]-nowMS < (pgMarkTTL - pgMarkRefresh - time.Second).Milliseconds() {
			put, putKeys = append(put, w.markKey(key)), append(putKeys, key)
			if w.marked[key] == 0 {
				fresh = append(fresh, key)
			}
		}
	}
	for key := range w.left {
		if _, ok := w.marked[key]; !ok {
			delete(w.left, key) // never marked, or its mark deleted: nothing lingers
		}
	}
	for key := range w.marked {
		if w.subs[key] > 0 {
			continue
		}
		if left, ok := w.left[key]; ok {
			if rest := pgListenLinger - mono.Sub(left); rest > 0 {
				if next == 0 || rest < next {
					next = rest
				}
				continue
			}
		}
		del = append(del, w.markKey(key))
	}
	w.mu.Unlock()
	if len(put) > 0 && s.putMarks(ctx, putKeys, put, pgMarkTime(until)) == nil {
		w.mu.Lock()
		for _, key := range putKeys {
			w.marked[key] = until
		}
		w.mu.Unlock()
		for _, key := range fresh { // a refreshed mark has nothing new to tell
			s.listen.subs.Wake(key, "")
		}
	}
	if len(del) > 0 {
		s.deleteMarks(ctx, del)
	}
	if sweep {
		end, _ := PrefixEnd(WaitPrefix)
		_ = s.markExec(ctx, s.q.markExpired, WaitPrefix, end, pgMarkTime(nowMS))
	}
	return next
}

// putMarks writes the marks put of keys, under their locks.
func (s *PostgresStore) putMarks(ctx context.Context, keys, put []string, until string) error {
	locks := make([]int64, len(keys))
	for i, key := range keys {
		locks[i] = pgMarkLockKey(s.channel, key)
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = send(ctx, conn.Conn(), pgStmt{pgAsyncCommit, nil},
		pgStmt{pgMarkLock, []any{locks}}, pgStmt{s.q.markPut, []any{put, until}})
	return err
}

// markExec runs one statement on marks, committed without a flush.
func (s *PostgresStore) markExec(ctx context.Context, sql string, args ...any) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = send(ctx, conn.Conn(), pgStmt{pgAsyncCommit, nil}, pgStmt{sql, args})
	return err
}

// formatMarks fills the table name into the statements on marks.
func formatMarks(q *pgQueries, table string) {
	q.markPut = fmt.Sprintf(pgMarkPut, table)
	q.markDelete = fmt.Sprintf(pgMarkDelete, table)
	q.markExpired = fmt.Sprintf(pgMarkExpired, table)
}
