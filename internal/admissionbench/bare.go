package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease/internal/benchkit"
)

// bareContender is the least SQL that does the job: a waiters table
// indexed on (scope, priority, seq), a slots table of limit rows, an
// enqueue that inserts the waiter and admits whoever the free units go to
// in one transaction, a release that frees the unit and hands it to the
// head in one transaction, and LISTEN/NOTIFY to tell a waiter it was
// admitted. Each transaction is one pipelined batch: two round trips per
// admission. Lower priority numbers go first.
type bareContender struct {
	pool    *pgxpool.Pool
	trip    *benchkit.TripCounter
	schema  string
	channel string
	admitQ  string
	lockQ   string
	insertQ string
	freeQ   string
	seq     atomic.Int64

	listener *pgx.Conn
	lcancel  context.CancelFunc
	mu       sync.Mutex
	waiting  map[int64]chan struct{}
	done     chan struct{}
	sweeping sync.WaitGroup
	swept    atomic.Int64 // admissions the sweep made: lost wake-ups, which the lock should leave none of
	closing  atomic.Bool
}

// bareSweep is how often one goroutine per process runs the admission on
// its own, a safety net that the scope's lock (below) leaves nothing to
// catch; its round trips are counted with the rest. It is one per
// process, not one per waiter, so that a long queue does not poll.
const bareSweep = time.Second

func newBare(ctx context.Context, dsn string, limit int) (*bareContender, error) {
	c := &bareContender{trip: &benchkit.TripCounter{}, waiting: map[int64]chan struct{}{}, done: make(chan struct{})}
	pool, err := benchkit.OpenCountedPool(ctx, dsn, 0, c.trip)
	if err != nil {
		return nil, err
	}
	c.pool = pool
	c.schema = "admissionbench_bare_" + randHex()
	c.channel = c.schema
	s := pgx.Identifier{c.schema}.Sanitize()
	ddl := fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.waiters (id bigint PRIMARY KEY, scope text NOT NULL, priority int NOT NULL, seq bigserial NOT NULL);
CREATE INDEX ON %[1]s.waiters (scope, priority, seq);
CREATE TABLE %[1]s.slots (scope text NOT NULL, slot int NOT NULL, holder bigint, PRIMARY KEY (scope, slot));
INSERT INTO %[1]s.slots (scope, slot) SELECT 'bench', g FROM generate_series(0, %[2]d - 1) g;`, s, limit)
	if _, err := pool.Exec(ctx, ddl); err != nil {
		pool.Close()
		return nil, err
	}
	// The free units of the scope, paired in order with as many waiters
	// from the head; the pairs' waiters leave the queue and take the units,
	// and each is notified.
	c.admitQ = fmt.Sprintf(`WITH f AS (
  SELECT slot, row_number() OVER (ORDER BY slot) AS rn FROM (
    SELECT slot FROM %[1]s.slots WHERE scope = 'bench' AND holder IS NULL ORDER BY slot FOR UPDATE SKIP LOCKED) x),
h AS (
  SELECT id, row_number() OVER (ORDER BY priority, seq) AS rn FROM (
    SELECT id, priority, seq FROM %[1]s.waiters WHERE scope = 'bench' ORDER BY priority, seq
    LIMIT (SELECT count(*) FROM f) FOR UPDATE SKIP LOCKED) y),
p AS (SELECT f.slot, h.id FROM f JOIN h USING (rn)),
d AS (DELETE FROM %[1]s.waiters w USING p WHERE w.id = p.id),
u AS (UPDATE %[1]s.slots s SET holder = p.id FROM p WHERE s.scope = 'bench' AND s.slot = p.slot RETURNING p.id)
SELECT id, pg_notify('%[2]s', id::text) FROM u`, s, c.channel)
	// Enqueues and releases of the scope take its lock first, in their
	// own batch: without it, a release and an enqueue that commit at the
	// same moment can each miss the other (the release sees no waiter, the
	// enqueue no free unit), and the unit stays free until the next
	// release. The admission's snapshot, taken after the lock, sees every
	// earlier holder's commit.
	c.lockQ = fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, int64(rand.Uint64()))
	c.insertQ = fmt.Sprintf(`INSERT INTO %s.waiters (id, scope, priority) VALUES ($1, 'bench', $2)`, s)
	c.freeQ = fmt.Sprintf(`UPDATE %s.slots SET holder = NULL WHERE scope = 'bench' AND holder = $1`, s)

	conn, err := pool.Acquire(ctx)
	if err != nil {
		c.close()
		return nil, err
	}
	c.listener = conn.Hijack()
	if _, err := c.listener.Exec(ctx, "LISTEN "+pgx.Identifier{c.channel}.Sanitize()); err != nil {
		c.listener.Close(ctx)
		c.listener = nil
		c.close()
		return nil, err
	}
	lctx, lcancel := context.WithCancel(context.Background())
	c.lcancel = lcancel
	c.sweeping.Add(1)
	go c.listen(lctx)
	go c.sweep(lctx)
	return c, nil
}

// sweep runs the admission every bareSweep, until ctx ends.
func (c *bareContender) sweep(ctx context.Context) {
	defer c.sweeping.Done()
	t := time.NewTicker(bareSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b := &pgx.Batch{}
		b.Queue(c.lockQ)
		b.Queue(c.admitQ)
		if ids, err := c.run(ctx, b); err == nil && len(ids) > 0 {
			c.swept.Add(int64(len(ids)))
		}
	}
}

func (c *bareContender) listen(ctx context.Context) {
	defer close(c.done)
	for {
		n, err := c.listener.WaitForNotification(ctx)
		if err != nil {
			return
		}
		id, err := strconv.ParseInt(n.Payload, 10, 64)
		if err != nil {
			continue
		}
		c.mu.Lock()
		ch := c.waiting[id]
		c.mu.Unlock()
		if ch != nil {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

func (c *bareContender) name() string     { return "bare" }
func (c *bareContender) trips() int64     { return c.trip.Load() }
func (c *bareContender) tripUnit() string { return "round trips" }

// run sends stmts as one pipelined batch (one implicit transaction) and
// returns the ids the admission statement, which must be last, admitted.
func (c *bareContender) run(ctx context.Context, b *pgx.Batch) ([]int64, error) {
	br := c.pool.SendBatch(ctx, b)
	defer br.Close()
	for range b.Len() - 1 {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		var ignored any
		if err := rows.Scan(&id, &ignored); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return ids, br.Close()
}

func (c *bareContender) admit(ctx context.Context, w int, ahead bool, queued func()) (func(context.Context) error, error) {
	id := c.seq.Add(1)
	prio := 1
	if ahead {
		prio = 0
	}
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	c.waiting[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiting, id)
		c.mu.Unlock()
	}()
	b := &pgx.Batch{}
	b.Queue(c.insertQ, id, prio)
	b.Queue(c.lockQ)
	b.Queue(c.admitQ)
	ids, err := c.run(ctx, b)
	if err != nil {
		return nil, err
	}
	if queued != nil {
		queued()
	}
	if !contains(ids, id) {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, c.abandon(id, ctx.Err())
		}
	}
	return func(ctx context.Context) error {
		b := &pgx.Batch{}
		b.Queue(c.lockQ)
		b.Queue(c.freeQ, id)
		b.Queue(c.admitQ)
		_, err := c.run(ctx, b)
		return err
	}, nil
}

// abandon takes a cancelled waiter out of the queue, or gives back the
// unit it was admitted to meanwhile.
func (c *bareContender) abandon(id int64, cause error) error {
	if c.closing.Load() {
		return cause
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(fmt.Sprintf(`DELETE FROM %s.waiters WHERE id = $1`, pgx.Identifier{c.schema}.Sanitize()), id)
	b.Queue(c.lockQ)
	b.Queue(c.freeQ, id)
	b.Queue(c.admitQ)
	_, err := c.run(ctx, b)
	return errors.Join(cause, err)
}

// refusedClaim times an enqueue that finds every unit held: the insert
// and the admission in one transaction, rolled back so that the queue
// stays as it was.
func (c *bareContender) refusedClaim(ctx context.Context) (time.Duration, error) {
	id := -c.seq.Add(1)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(c.insertQ, id, 1)
	b.Queue(c.lockQ)
	b.Queue(c.admitQ)
	b.Queue("ROLLBACK")
	t := time.Now()
	br := c.pool.SendBatch(ctx, b)
	_, err1 := br.Exec()
	_, err2 := br.Exec()
	_, err5 := br.Exec()
	rows, err3 := br.Query()
	n := 0
	if err3 == nil {
		for rows.Next() {
			n++
		}
		err3 = rows.Err()
	}
	_, err4 := br.Exec()
	err := errors.Join(err1, err2, err5, err3, err4, br.Close())
	d := time.Since(t)
	if err == nil && n > 0 {
		err = errors.New("bare: a claim was admitted while every unit was held")
	}
	return d, err
}

func (c *bareContender) close() error {
	c.closing.Store(true)
	var err error
	if c.listener != nil {
		c.lcancel()
		<-c.done
		c.sweeping.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = c.listener.Close(ctx)
		cancel()
	}
	derr := drop(c.pool, "DROP SCHEMA IF EXISTS "+pgx.Identifier{c.schema}.Sanitize()+" CASCADE")
	c.pool.Close()
	return errors.Join(err, derr)
}

func contains(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
