package benchkit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease"
)

// HandoffSpread bounds the random pause between a waiter starting to wait
// and the holder releasing: releases land at any point of a poll interval,
// as they do in production, not just after a poll.
const HandoffSpread = 50 * time.Millisecond

// HandoffMode is how the waiting node learns of a release.
type HandoffMode struct {
	Name   string
	Notify bool          // the stores are Notifiers (LISTEN/NOTIFY); otherwise polling only
	Poll   time.Duration // runlease.WithWaitPoll of the waiter
}

// HandoffModes are the modes measured: notifications (with the default 1 s
// poll as the fallback), and polling alone every 50 ms.
var HandoffModes = []HandoffMode{
	{Name: "notify", Notify: true, Poll: runlease.DefaultWaitPoll},
	{Name: "poll=50ms", Poll: 50 * time.Millisecond},
}

// pollOnly is a store without the Notifier capability: the waiter polls
// and the holder's release wakes no one. It keeps the store's clock.
type pollOnly struct {
	runlease.Store
	runlease.Clock
}

// Handoff measures, on a Postgres Env, the handoff of a lease from one node
// to another that waits for it in AcquireWait: from the start of the
// holder's Release to the waiter's AcquireWait returning, and its round
// trips. Each node is a store on a pool of its own over the same table.
// Base is the same handoff in bare SQL: a conditional UPDATE with
// pg_notify by one connection, and the other, already LISTENing, taking
// the row with its own conditional UPDATE when notified. The two take
// turns, one handoff each, until each has made lim.N handoffs or both
// together have run for twice lim.Duration.
func Handoff(ctx context.Context, e *Env, mode HandoffMode, lim Limit) (Result, error) {
	var res Result
	if e.pg == nil {
		return res, errors.New("benchkit: the handoff runs on Postgres only")
	}
	b, poolB, closeB, err := e.pg.peer(ctx)
	if err != nil {
		return res, err
	}
	defer closeB()
	var a, waiter runlease.Store = e.Store, b
	if mode.Notify {
		// Keep the waiting node's LISTEN connection open between handoffs,
		// as a node with other waiters does; it is set up outside the
		// measured window either way.
		_, cancel := b.Subscribe("bench:keep-listening")
		defer cancel()
	} else {
		a = pollOnly{e.Store, e.Store.(runlease.Clock)}
		waiter = pollOnly{b, b}
	}
	raw, err := newRawHandoff(ctx, e, poolB)
	if err != nil {
		return res, err
	}
	defer raw.close()
	run := handoffRun{e: e, a: a, b: waiter, mode: mode}
	err = loopHandoffs(ctx, lim, []func(context.Context) (time.Duration, int64, error){run.once, raw.once},
		[]*Phase{&res.Store, &res.Base})
	return res, err
}

// loopHandoffs runs handoffs until lim, each kind in turn, after one of
// each that warms the connections and the listeners up, and collects their
// latencies and round trips. Rate is handoffs per second of measured time:
// the inverse of the mean latency.
func loopHandoffs(ctx context.Context, lim Limit, kinds []func(context.Context) (time.Duration, int64, error), into []*Phase) error {
	busy := make([]time.Duration, len(kinds))
	for _, once := range kinds {
		if _, _, err := once(ctx); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(2 * lim.Duration)
	for i := 0; lim.N > 0 && i < lim.N || lim.N == 0 && time.Now().Before(deadline); i++ {
		for k, once := range kinds {
			d, trips, err := once(ctx)
			if err != nil {
				return err
			}
			p := into[k]
			p.Ops++
			p.Trips += trips
			p.Hist.Record(d)
			busy[k] += d
		}
	}
	for k, p := range into {
		if busy[k] > 0 {
			p.Rate = float64(p.Ops) / busy[k].Seconds()
		}
	}
	return nil
}

type handoffRun struct {
	e    *Env
	a, b runlease.Store
	mode HandoffMode
}

type acquired struct {
	l   *runlease.Lease
	err error
	at  time.Time
}

// once hands one fresh run from node a to node b.
func (h handoffRun) once(ctx context.Context) (time.Duration, int64, error) {
	runID := fmt.Sprintf("bench-handoff-%d", h.e.Seq())
	held, err := runlease.Acquire(ctx, h.a, runID, "bench#node-a", leaseOpts...)
	if err != nil {
		return 0, 0, err
	}
	refused := make(chan struct{}, 1)
	hooks := runlease.Hooks{Acquired: func(ev runlease.AcquireEvent) {
		if errors.Is(ev.Err, runlease.ErrTakenOver) {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
	}}
	got := make(chan acquired, 1)
	go func() {
		l, err := runlease.AcquireWait(ctx, h.b, runID, "bench#node-b",
			runlease.WithTTL(leaseTTL), runlease.WithWaitPoll(h.mode.Poll), runlease.WithHooks(hooks))
		got <- acquired{l, err, time.Now()}
	}()
	select {
	case <-refused: // the waiter is waiting
	case r := <-got:
		return 0, 0, fmt.Errorf("AcquireWait returned while the lease was held: %v", r.err)
	}
	time.Sleep(rand.N(HandoffSpread))
	trips, start := h.e.Trips(), time.Now()
	if err := held.Release(ctx); err != nil {
		return 0, 0, err
	}
	r := <-got
	trips = h.e.Trips() - trips
	if r.err != nil {
		return 0, 0, r.err
	}
	return r.at.Sub(start), trips, r.l.Release(ctx)
}

// rawHandoff is the baseline handoff in bare SQL.
type rawHandoff struct {
	e              *Env
	poolB          *pgxpool.Pool
	listener       *pgx.Conn
	channel        string
	release, takeB string
}

func newRawHandoff(ctx context.Context, e *Env, poolB *pgxpool.Pool) (*rawHandoff, error) {
	c, err := poolB.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	r := &rawHandoff{e: e, poolB: poolB, listener: c.Hijack(), channel: "bench_" + e.pg.table}
	r.release = fmt.Sprintf(pgUpdateNotify, e.pg.ident)
	r.takeB = fmt.Sprintf(pgUpdate, e.pg.ident)
	if _, err := r.listener.Exec(ctx, "LISTEN "+pgx.Identifier{r.channel}.Sanitize()); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *rawHandoff) close() { r.listener.Close(context.Background()) }

// once hands one row from the first pool to the listening connection's
// pool, as Handoff's Base describes.
func (r *rawHandoff) once(ctx context.Context) (time.Duration, int64, error) {
	key := fmt.Sprintf("bench:handoff:%d", r.e.Seq())
	held, released, taken := "held by a", "released", "held by b"
	if err := must(r.e.Raw.Insert(ctx, key, held)); err != nil {
		return 0, 0, err
	}
	got := make(chan acquired, 1)
	go func() {
		err := r.await(ctx, key)
		if err == nil {
			err = must(r.exec(ctx, r.poolB, r.takeB, key, released, taken))
		}
		got <- acquired{err: err, at: time.Now()}
	}()
	time.Sleep(rand.N(HandoffSpread))
	trips, start := r.e.Trips(), time.Now()
	if err := must(r.exec(ctx, r.e.pg.pool, r.release, key, held, released, r.channel)); err != nil {
		return 0, 0, err
	}
	res := <-got
	return res.at.Sub(start), r.e.Trips() - trips, res.err
}

// await waits for the notification of key.
func (r *rawHandoff) await(ctx context.Context, key string) error {
	for {
		n, err := r.listener.WaitForNotification(ctx)
		if err != nil || n.Payload == key {
			return err
		}
	}
}

func (r *rawHandoff) exec(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (bool, error) {
	tag, err := pool.Exec(ctx, sql, append([]any{pgMode()}, args...)...)
	return tag.RowsAffected() == 1, err
}
