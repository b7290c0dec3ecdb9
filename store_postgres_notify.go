package runlease

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Writes that notify: the same conditional writes as MetaCAS, with
// pg_notify in RETURNING, so a notification is queued exactly when the row
// is written, and delivered when it commits.
const (
	pgInsertNotify = `INSERT INTO %s (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING pg_notify($3, $1)`
	pgUpdateNotify = `UPDATE %s SET value = $3 WHERE key = $1 AND value = $2 RETURNING pg_notify($4, $1)`
)

// pgListenRetry is the wait before a failed listener connection is opened
// again. Waiters poll meanwhile, so a lost notification only costs latency.
const pgListenRetry = time.Second

// pgChannel is the notification channel of a table: one per table, so that
// stores on other tables of the same database do not wake each other. table
// is the schema-qualified name that the store's table name resolved to at
// open, not the name as written, so that stores naming one table
// differently (with or without its schema) share its channel and wake each
// other. A hash keeps the channel a short identifier; two tables whose
// hashes collide would only wake each other's waiters for a re-read.
func pgChannel(table string) string {
	h := fnv.New64a()
	h.Write([]byte(table))
	return fmt.Sprintf("runlease_%016x", h.Sum64())
}

// pgListener holds one connection that LISTENs on the table's channel while
// anyone subscribes, and fans notifications out by key.
type pgListener struct {
	subs    subscribers
	mu      sync.Mutex
	cancel  context.CancelFunc // stops the listening goroutine; nil when none runs
	stopped chan struct{}      // closed when it has exited
}

// MetaCASNotify implements [Notifier]: MetaCAS that, when it writes, wakes
// the key's subscribers in every process sharing the table, through
// LISTEN/NOTIFY, in the same single statement.
func (s *PostgresStore) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := s.check(key); err != nil {
		return false, err
	}
	if err := CheckValue(value); err != nil {
		return false, err
	}
	if expected == nil {
		return s.exec(ctx, "MetaCASNotify", key, s.q.insertNotify, key, value, s.channel)
	}
	if CheckValue(*expected) != nil {
		return s.neverMatches(ctx, "MetaCASNotify", key)
	}
	return s.exec(ctx, "MetaCASNotify", key, s.q.updateNotify, key, *expected, value, s.channel)
}

// Subscribe implements [Notifier]. The store listens on one connection of
// its pool while anyone subscribes.
func (s *PostgresStore) Subscribe(key string) (<-chan struct{}, func()) {
	ch, cancel := s.listen.subs.subscribe(key)
	s.listen.mu.Lock()
	if s.listen.cancel == nil && !s.closed.Load() {
		ctx, stop := context.WithCancel(context.Background())
		s.listen.cancel, s.listen.stopped = stop, make(chan struct{})
		go s.listenLoop(ctx, s.listen.stopped)
	}
	s.listen.mu.Unlock()
	return ch, func() {
		cancel()
		s.stopListening(true)
	}
}

// stopListening stops the listening goroutine, if one runs (and, when
// ifIdle, nobody subscribes), and waits for it to close its connection.
func (s *PostgresStore) stopListening(ifIdle bool) {
	s.listen.mu.Lock()
	if ifIdle && s.listen.subs.count() > 0 {
		s.listen.mu.Unlock()
		return
	}
	cancel, stopped := s.listen.cancel, s.listen.stopped
	s.listen.cancel = nil
	s.listen.mu.Unlock()
	if cancel != nil {
		cancel()
		<-stopped
	}
}

// listenLoop keeps a LISTEN connection until ctx ends, reconnecting after
// failures.
func (s *PostgresStore) listenLoop(ctx context.Context, stopped chan struct{}) {
	defer close(stopped)
	for ctx.Err() == nil {
		s.listenOnce(ctx) // returns on a fault, after which it reconnects
		if ctx.Err() != nil {
			return
		}
		s.listen.subs.wakeAll() // notifications may have been missed: re-read
		select {
		case <-ctx.Done():
		case <-time.After(pgListenRetry):
		}
	}
}

// listenOnce listens on one connection until it fails or ctx ends. The
// connection is closed rather than returned to the pool: it is subscribed.
func (s *PostgresStore) listenOnce(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	c := conn.Hijack()
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return err
	}
	s.listen.subs.wakeAll() // anything released before LISTEN took effect
	for {
		n, err := c.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		s.listen.subs.wake(n.Payload)
	}
}
