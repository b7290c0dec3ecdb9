package main

import (
	"context"
	"math"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// tripCounter counts round trips on network connections: a write that
// follows a read (or is a connection's first) starts a new request,
// however many Write calls the request takes, so statements pipelined
// together count once, as they cost one wait for the network and the
// server. It is safe for concurrent use.
type tripCounter struct{ n atomic.Int64 }

func (c *tripCounter) load() int64 { return c.n.Load() }

func (c *tripCounter) dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc := &countingConn{Conn: conn, c: c}
		cc.read.Store(true)
		return cc, nil
	}
}

type countingConn struct {
	net.Conn
	c *tripCounter
	// read is set by a read and cleared by the next write; pgx may read on
	// a goroutine of its own while it writes, hence atomic.
	read atomic.Bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	if c.read.Swap(false) {
		c.c.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.read.Store(true)
	}
	return n, err
}

// openPool opens a pool on dsn whose connections' round trips trips
// counts.
func openPool(ctx context.Context, dsn string, maxConns int32, trips *tripCounter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.DialFunc = trips.dial(cfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// drop runs a DROP statement, again when it fails: waiters cancelled a
// moment before may still be taking their places out of the queue, and a
// DROP among their transactions can be chosen as a deadlock's victim.
func drop(pool *pgxpool.Pool, stmt string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	for range 10 {
		if _, err = pool.Exec(ctx, stmt); err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

// recorder collects what the workers of one measurement see: admissions,
// their waits, and the units in use, which it tracks at every admission so
// that the most ever in use is exact rather than sampled.
type recorder struct {
	inUse     atomic.Int64
	maxInUse  atomic.Int64
	measuring atomic.Bool
	count     atomic.Int64
	errs      atomic.Int64
	lastErr   atomic.Value

	mu    sync.Mutex
	waits []time.Duration
}

func newRecorder() *recorder { return &recorder{} }

// admitted records an admission that waited wait; the unit is in use
// until released is called.
func (r *recorder) admitted(wait time.Duration) {
	n := r.inUse.Add(1)
	for {
		m := r.maxInUse.Load()
		if n <= m || r.maxInUse.CompareAndSwap(m, n) {
			break
		}
	}
	if !r.measuring.Load() {
		return
	}
	r.count.Add(1)
	r.mu.Lock()
	r.waits = append(r.waits, wait)
	r.mu.Unlock()
}

func (r *recorder) released() { r.inUse.Add(-1) }

func (r *recorder) failed(err error) {
	r.errs.Add(1)
	r.lastErr.Store(err.Error())
}

// start begins counting admissions and waits; the most in use is kept
// from the start of the workers, warm-up included.
func (r *recorder) start() {
	r.mu.Lock()
	r.waits = r.waits[:0]
	r.mu.Unlock()
	r.count.Store(0)
	r.measuring.Store(true)
}

func (r *recorder) stop() { r.measuring.Store(false) }

func (r *recorder) percentiles() (p50, p99 time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return pct(r.waits, 0.50), pct(r.waits, 0.99)
}

// pct is the nearest-rank q-quantile of ds.
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
