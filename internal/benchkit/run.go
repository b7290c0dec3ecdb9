package benchkit

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Worker is one goroutine's share of a scenario: Op is the measured
// operation, called in a closed loop. Prep, when set, runs before every Op,
// outside the measurement, for set-up work an Op consumes (such as rows to
// delete); it returns how many round trips it made, which are taken out of
// the count, and should do nothing on most calls.
type Worker struct {
	Op   func(ctx context.Context) error
	Prep func(ctx context.Context) (trips int64, err error)
}

// Limit ends a phase: after N operations in all (shared out among the
// goroutines), or, when N is 0, after Duration.
type Limit struct {
	N        int
	Duration time.Duration
}

// Slices of a measurement: the library and the baseline take turns in
// slices of about sliceLength (or, counted in operations, of at least
// sliceOps per goroutine), at most maxSlices of each.
const (
	sliceLength = 500 * time.Millisecond
	sliceOps    = 50
	maxSlices   = 20
)

// slices returns how many turns each side takes to run lim with g
// goroutines.
func (l Limit) slices(g int) int {
	n := l.N / (sliceOps * g)
	if l.N == 0 {
		n = int(l.Duration / sliceLength)
	}
	return min(max(n, 1), maxSlices)
}

// slice returns the part of lim that turn i of n runs.
func (l Limit) slice(i, n int) Limit {
	if l.N == 0 {
		return Limit{Duration: l.Duration / time.Duration(n)}
	}
	return Limit{N: l.N*(i+1)/n - l.N*i/n}
}

// Phase is the measurement of one closed loop.
type Phase struct {
	Ops  int64
	Rate float64 // operations per second: see Run
	Hist Histogram
	// Trips is the round trips counted (see Env.Trips) less those of Prep.
	Trips int64
}

// P50 returns the median latency of one operation.
func (p *Phase) P50() time.Duration { return p.Hist.Quantile(0.50) }

// P99 returns the 99th percentile latency of one operation.
func (p *Phase) P99() time.Duration { return p.Hist.Quantile(0.99) }

// TripsPerOp returns the round trips per operation.
func (p *Phase) TripsPerOp() float64 {
	if p.Ops == 0 {
		return 0
	}
	return float64(p.Trips) / float64(p.Ops)
}

func (p *Phase) add(o *Phase) {
	secs := 0.0
	if p.Rate > 0 {
		secs += float64(p.Ops) / p.Rate
	}
	if o.Rate > 0 {
		secs += float64(o.Ops) / o.Rate
	}
	p.Ops += o.Ops
	p.Trips += o.Trips
	p.Hist.Merge(&o.Hist)
	p.Rate = 0
	if secs > 0 {
		p.Rate = float64(p.Ops) / secs
	}
}

// Result is a scenario measured through the library (Store) and as the
// bare statements (Base), in the same run.
type Result struct {
	Store, Base Phase
}

// Ratio returns the library's throughput over the baseline's.
func (r *Result) Ratio() float64 {
	if r.Base.Rate == 0 {
		return 0
	}
	return r.Store.Rate / r.Base.Rate
}

// Timer is the part of *testing.B the runner drives, so that a benchmark's
// ns/op covers the library's phase only. It may be nil.
type Timer interface {
	StartTimer()
	StopTimer()
}

// Run measures sc on e with g goroutines, each a closed loop (it issues its
// next operation when the last returns), through the library and as the
// baseline: each runs for lim, in slices that take turns (baseline,
// library, library, baseline, …), so that the load of a noisy machine
// weighs on both alike and their ratio holds even when absolute figures
// move. Set-up is not measured.
//
// A phase's Rate is the sum over its goroutines of operations divided by
// the time that goroutine spent outside Prep: for a loop without Prep,
// operations over wall time.
func Run(ctx context.Context, e *Env, sc Scenario, g int, lim Limit, t Timer) (Result, error) {
	var res Result
	if t != nil {
		t.StopTimer()
	}
	base, err := workers(ctx, e, sc.Base, g)
	if err != nil {
		return res, fmt.Errorf("%s baseline set-up: %w", sc.Name, err)
	}
	lib, err := workers(ctx, e, sc.Store, g)
	if err != nil {
		return res, fmt.Errorf("%s set-up: %w", sc.Name, err)
	}
	if err := e.Warm(ctx, g+2); err != nil {
		return res, err
	}
	n := lim.slices(g)
	for i := range n {
		for _, library := range []bool{i%2 == 1, i%2 == 0} {
			if err := runSlice(ctx, e, lim.slice(i, n), library, base, lib, &res, t); err != nil {
				return res, fmt.Errorf("%s: %w", sc.Name, err)
			}
		}
	}
	return res, nil
}

// runSlice runs one slice of the library's loop or the baseline's and adds
// it to res, with the benchmark timer running for the library's only.
func runSlice(ctx context.Context, e *Env, lim Limit, library bool, base, lib []*Worker, res *Result, t Timer) error {
	if !library {
		p, err := phase(ctx, base, lim, e.Raw.Trips)
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		res.Base.add(&p)
		return nil
	}
	if t != nil {
		t.StartTimer()
	}
	p, err := phase(ctx, lib, lim, e.Trips)
	if t != nil {
		t.StopTimer()
	}
	res.Store.add(&p)
	return err
}

func workers(ctx context.Context, e *Env, mk func(context.Context, *Env, int) (*Worker, error), g int) ([]*Worker, error) {
	ws := make([]*Worker, g)
	for i := range ws {
		w, err := mk(ctx, e, i)
		if err != nil {
			return nil, err
		}
		ws[i] = w
	}
	return ws, nil
}

// loopStats is what one goroutine of a phase measured.
type loopStats struct {
	ops       int64
	hist      Histogram
	busy      time.Duration // wall time less Prep
	prepTrips int64
	err       error
	until     time.Time // the deadline, for a phase limited by time
}

// phase runs every worker in a closed loop of its own until lim.
func phase(ctx context.Context, ws []*Worker, lim Limit, trips func() int64) (Phase, error) {
	var p Phase
	if lim.N == 0 && lim.Duration <= 0 || lim.N < 0 {
		return p, nil
	}
	stats := make([]loopStats, len(ws))
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for i, w := range ws {
		n := -1
		if lim.N > 0 {
			n = lim.N / len(ws)
			if i < lim.N%len(ws) {
				n++
			}
		}
		wg.Go(func() {
			<-startGate // stats[i].until is set by then
			loop(ctx, w, n, &stats[i])
		})
	}
	before := trips()
	start := time.Now()
	for i := range stats {
		stats[i].until = start.Add(lim.Duration)
	}
	close(startGate)
	wg.Wait()
	p.Trips = trips() - before
	for i := range stats {
		s := &stats[i]
		if s.err != nil {
			return p, s.err
		}
		p.Ops += s.ops
		p.Trips -= s.prepTrips
		p.Hist.Merge(&s.hist)
		if s.busy > 0 {
			p.Rate += float64(s.ops) / s.busy.Seconds()
		}
	}
	return p, nil
}

// loop runs w's operations, n of them or, when n < 0, until s.until.
func loop(ctx context.Context, w *Worker, n int, s *loopStats) {
	start := time.Now()
	var prep time.Duration
	for i := 0; n < 0 || i < n; i++ {
		if w.Prep != nil {
			t0 := time.Now()
			trips, err := w.Prep(ctx)
			prep += time.Since(t0)
			s.prepTrips += trips
			if err != nil {
				s.err = err
				break
			}
		}
		t0 := time.Now()
		err := w.Op(ctx)
		t1 := time.Now()
		if err != nil {
			s.err = err
			break
		}
		s.hist.Record(t1.Sub(t0))
		s.ops++
		if n < 0 && !t1.Before(s.until) {
			break
		}
	}
	s.busy = time.Since(start) - prep
}
