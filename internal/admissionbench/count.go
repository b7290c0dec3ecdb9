package main

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

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
