package runlease

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/areev/runlease/internal/wakeup"
)

// Writes that notify: the same conditional writes as MetaCAS, whose
// RETURNING notifies when the key has a live mark (see
// store_postgres_waiters.go), so a notification is queued exactly when the
// row is written and someone waits, and delivered when it commits.
const (
	pgInsertNotify = `INSERT INTO %[1]s (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING
RETURNING CASE WHEN EXISTS (SELECT 1 FROM %[1]s w WHERE w.key >= $3 AND w.key < $4 AND w.value > $5) THEN pg_notify($6, $7) END`
	pgUpdateNotify = `UPDATE %[1]s SET value = $3 WHERE key = $1 AND value = $2
RETURNING CASE WHEN EXISTS (SELECT 1 FROM %[1]s w WHERE w.key >= $4 AND w.key < $5 AND w.value > $6) THEN pg_notify($7, $8) END`
)

// pgPayloadRow leads every notification: pgPayloadRow, the key's length
// in bytes, ':', the key, then the row written, or nothing when the row is
// too long for a notification (the subscribers then read it). A payload
// without it is a bare key, as notifiers that send no rows write.
const pgPayloadRow = "runlease-row:"

// pgMaxPayload is the longest payload Postgres accepts: it refuses 8000
// bytes and more. A key ([MaxKeyLen]) always fits.
const pgMaxPayload = 7999

// pgPayload is the notification for a write of value at key.
func pgPayload(key, value string) string {
	head := pgPayloadRow + strconv.Itoa(len(key)) + ":" + key
	if len(head)+len(value) > pgMaxPayload {
		return head
	}
	return head + value
}

// pgParsePayload returns the key a notification names, and the row it
// carries: "" when it is too long to carry, and hasRow false for a bare
// key.
func pgParsePayload(payload string) (key, row string, hasRow bool) {
	rest, ok := strings.CutPrefix(payload, pgPayloadRow)
	if !ok {
		return payload, "", false
	}
	digits, rest, ok := strings.Cut(rest, ":")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n <= 0 || n > len(rest) || strconv.Itoa(n) != digits {
		return payload, "", false
	}
	return rest[:n], rest[n:], true
}

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

// pgListenLinger is how long the store goes on listening, and keeps a
// key's mark, after the last subscription (of any key, of the key) ended.
// A waiter's subscription lasts one ClaimSlotsWait call, and a driver that
// claims again at its next superstep subscribes again a moment later:
// without the linger, each call would open a listening connection (a new
// server process, taken from the pool, which opens another in its place
// and prepares its statements there afresh), write the mark and delete it
// again, several times the cost of the claim itself. While it lingers,
// writes of a marked key notify a listener that wakes nobody, which costs
// those writes the notify lock (see store_postgres_waiters.go) for at
// most that long.
const pgListenLinger = 2 * time.Second

// pgListener holds one connection that LISTENs on the table's channel while
// anyone subscribes, and for pgListenLinger after, and fans notifications
// out by key.
type pgListener struct {
	subs    wakeup.Set
	mu      sync.Mutex
	cancel  context.CancelFunc // stops the listening goroutine; nil when none runs
	stopped chan struct{}      // closed when it has exited
	linger  *time.Timer        // stops it once nobody subscribed for pgListenLinger; nil until first needed
	// running counts the listening goroutines' runs not yet exited, each
	// added under mu as it starts: Close waits for every one, those its
	// linger's timer stopped included, for they still use the pool.
	running sync.WaitGroup
}

// MetaCASNotify implements [Notifier]: MetaCAS that, when it writes while
// a subscriber in any process sharing the table waits on key, wakes it
// through LISTEN/NOTIFY with the row written, in the same statement.
func (s *PostgresStore) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := s.check(key); err != nil {
		return false, err
	}
	if err := CheckValue(value); err != nil {
		return false, err
	}
	now, _ := s.ClockNow()
	from, to := pgMarkRange(key)
	marks := []any{from, to, pgMarkTime(now.UnixMilli()), s.channel, pgPayload(key, value)}
	write := pgStmt{s.q.insertNotify, append([]any{key, value}, marks...)}
	if expected != nil {
		if CheckValue(*expected) != nil {
			return s.neverMatches(ctx, "MetaCASNotify", key)
		}
		write = pgStmt{s.q.updateNotify, append([]any{key, *expected, value}, marks...)}
	}
	var n int64
	var run pgRun
	err := s.do(ctx, "MetaCASNotify", key, true, func(c *pgx.Conn) error {
		defer func() { run = runOf(c) }()
		// pgPinNotify pins the write's durability and takes the key's
		// lock.
		res, err := send(ctx, c, pgStmt{pgPinNotify, []any{pgMarkLockKey(s.channel, key)}}, write)
		if err == nil {
			n = res[1].CommandTag.RowsAffected()
		}
		return err
	})
	s.note(err, n == 1, run, key)
	return n == 1, err
}

// Subscribe implements [Notifier]. The store listens on one connection of
// its pool while anyone subscribes (and for pgListenLinger after), and
// marks key in the table (a row under [WaitPrefix]) so that writes of it
// notify; see store_postgres_waiters.go.
func (s *PostgresStore) Subscribe(key string) (<-chan struct{}, func()) {
	ch, cancel := s.listen.subs.Subscribe(key)
	return ch, s.listening(key, cancel)
}

// SubscribeRows implements [RowNotifier], as Subscribe does. A row too long
// for a notification (about 8,000 bytes with its key) wakes without it.
func (s *PostgresStore) SubscribeRows(key string) (<-chan string, func()) {
	ch, cancel := s.listen.subs.SubscribeRows(key)
	return ch, s.listening(key, cancel)
}

// listening marks key as waited on and starts the listening goroutines if
// none run, and returns the function that ends a subscription of key whose
// own cancel is cancel.
func (s *PostgresStore) listening(key string, cancel func()) func() {
	s.waiters.add(key)
	s.listen.mu.Lock()
	if s.listen.cancel == nil && !s.closed.Load() {
		ctx, stop := context.WithCancel(context.Background())
		stopped := make(chan struct{})
		s.listen.cancel, s.listen.stopped = stop, stopped
		// Keys are marked only once the store listens: a mark asks
		// writers to notify, and the wake-up that follows it makes its
		// subscribers read what they may have missed until then.
		ready := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { s.listenLoop(ctx, ready) })
		wg.Go(func() {
			select {
			case <-ready:
				s.markLoop(ctx)
			case <-ctx.Done():
			}
		})
		s.listen.running.Add(1)
		go func() {
			defer s.listen.running.Done()
			wg.Wait()
			close(stopped)
		}()
	}
	s.listen.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			s.waiters.remove(key)
			s.lingerListening()
		})
	}
}

// lingerListening has the listening goroutine stopped pgListenLinger from
// now, when nobody subscribes: a subscription that comes before then
// finds it running, and one that ends later pushes the stop back.
func (s *PostgresStore) lingerListening() {
	s.listen.mu.Lock()
	defer s.listen.mu.Unlock()
	if s.listen.cancel == nil || s.listen.subs.Count() > 0 {
		return
	}
	if s.listen.linger == nil {
		s.listen.linger = time.AfterFunc(pgListenLinger, func() { s.stopListening(true) })
		return
	}
	s.listen.linger.Reset(pgListenLinger)
}

// stopListening stops the listening goroutine, if one runs (and, when
// ifIdle, nobody subscribes), and waits for it to close its connection.
func (s *PostgresStore) stopListening(ifIdle bool) {
	s.listen.mu.Lock()
	if ifIdle && s.listen.subs.Count() > 0 {
		s.listen.mu.Unlock()
		return
	}
	if !ifIdle && s.listen.linger != nil {
		s.listen.linger.Stop()
	}
	cancel, stopped := s.listen.cancel, s.listen.stopped
	s.listen.cancel = nil
	s.listen.mu.Unlock()
	if cancel != nil {
		cancel()
		<-stopped
	}
	if !ifIdle {
		// Close: a run the linger's timer stopped may not have exited
		// yet. No new one starts once the store is closed (listening
		// looks under mu, after Close marked it closed), so the count
		// only falls.
		s.listen.running.Wait()
	}
}

// listenLoop keeps a LISTEN connection until ctx ends, reconnecting after
// failures.
func (s *PostgresStore) listenLoop(ctx context.Context, ready chan struct{}) {
	var once sync.Once
	up := func() { once.Do(func() { close(ready) }) }
	for ctx.Err() == nil {
		s.listenOnce(ctx, up) // returns on a fault, after which it reconnects
		if ctx.Err() != nil {
			return
		}
		s.listen.subs.WakeAll() // notifications may have been missed: re-read
		select {
		case <-ctx.Done():
		case <-time.After(pgListenRetry):
		}
	}
}

// listenOnce listens on one connection until it fails or ctx ends. The
// connection is closed rather than returned to the pool: it is subscribed.
func (s *PostgresStore) listenOnce(ctx context.Context, up func()) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	c := conn.Hijack()
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return err
	}
	up()
	s.listen.subs.WakeAll() // anything released before LISTEN took effect
	for {
		n, err := c.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		key, row, _ := pgParsePayload(n.Payload)
		s.listen.subs.Wake(key, row)
	}
}
