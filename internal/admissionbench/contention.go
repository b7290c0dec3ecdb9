package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// contentionResult is one measurement of closed-loop waiters on one
// scope.
type contentionResult struct {
	rate      float64 // admissions per second
	p50, p99  time.Duration
	maxInUse  int64
	trips     float64 // round trips (or store calls) per admission
	errs      int64
	lastErr   string
	admitted  int64
	elapsed   time.Duration
	tripUnit  string
	bareRatio float64 // rate over bare's in the same run; 0 without bare
}

type contentionRow struct {
	contender string
	runs      []contentionResult
}

// workers runs n closed-loop waiters on c until ctx ends: admit, hold,
// release, again. It returns once they all stopped.
func workers(ctx context.Context, c contender, n int, ahead bool, hold time.Duration, rec *recorder, queued func()) func() {
	var wg sync.WaitGroup
	role := roleWorker
	if ahead {
		role = roleProbe
	}
	wctx := withRole(ctx, role)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := queued
			for ctx.Err() == nil {
				t0 := time.Now()
				release, err := c.admit(wctx, w, ahead, first)
				first = nil
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					rec.failed(err)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				rec.admitted(time.Since(t0))
				if hold > 0 {
					time.Sleep(hold)
				}
				rec.released()
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				if err := release(rctx); err != nil {
					rec.failed(err)
				}
				cancel()
			}
		}()
	}
	return wg.Wait
}

func runContention(ctx context.Context, cfg config, c contender) (contentionResult, error) {
	rec := newRecorder()
	wctx, cancel := context.WithCancel(ctx)
	wait := workers(wctx, c, cfg.waiters, false, cfg.hold, rec, nil)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			wait()
		}
	}
	defer stop()
	if !sleepCtx(ctx, cfg.warmup) {
		return contentionResult{}, ctx.Err()
	}
	tr0 := c.trips()
	rec.start()
	t0 := time.Now()
	if !sleepCtx(ctx, cfg.duration) {
		return contentionResult{}, ctx.Err()
	}
	rec.stop()
	elapsed := time.Since(t0)
	tr1 := c.trips()
	stop()
	r := contentionResult{admitted: rec.count.Load(), elapsed: elapsed, maxInUse: rec.maxInUse.Load(),
		errs: rec.errs.Load(), tripUnit: c.tripUnit()}
	if s, ok := rec.lastErr.Load().(string); ok {
		r.lastErr = s
	}
	r.rate = float64(r.admitted) / elapsed.Seconds()
	r.p50, r.p99 = rec.percentiles()
	if r.admitted > 0 {
		r.trips = float64(tr1-tr0) / float64(r.admitted)
	}
	return r, nil
}

func measureContention(ctx context.Context, cfg config, progress io.Writer) ([]contentionRow, error) {
	rows := make([]contentionRow, len(cfg.contenders))
	for i, name := range cfg.contenders {
		rows[i].contender = name
	}
	for run := 1; run <= cfg.runs; run++ {
		bareRate := 0.0
		for i, name := range cfg.contenders {
			c, err := open(ctx, cfg, name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			r, err := runContention(ctx, cfg, c)
			if cerr := c.close(); err == nil && cerr != nil {
				err = fmt.Errorf("closing: %w", cerr)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if name == "bare" {
				bareRate = r.rate
			}
			rows[i].runs = append(rows[i].runs, r)
			fmt.Fprintf(progress, "contention %-18s run %d/%d: %8.1f admissions/s p50 %v p99 %v max in use %d, %.2f %s/admission, %d errors %s\n",
				name, run, cfg.runs, r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.maxInUse, r.trips, r.tripUnit, r.errs, r.lastErr)
		}
		if bareRate > 0 {
			for i := range rows {
				rr := &rows[i].runs[len(rows[i].runs)-1]
				rr.bareRatio = rr.rate / bareRate
			}
		}
	}
	return rows, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func writeContention(w io.Writer, cfg config, rows []contentionRow) {
	who := "runlease's naming no principal"
	if cfg.principals > 0 {
		who = fmt.Sprintf("runlease's over %d fair-share principals", cfg.principals)
	}
	fmt.Fprintf(w, "\n### Contention: one scope of limit %d, %d closed-loop waiters (%s), hold %v, %v per run after %v warm-up (medians of %d runs)\n\n",
		cfg.limit, cfg.waiters, who, cfg.hold, cfg.duration, cfg.warmup, cfg.runs)
	fmt.Fprintln(w, "| contender | admissions/s | vs bare | p50 wait | p99 wait | max in use | round trips/admission | errors |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		var rate, ratio, p50, p99, mx, trips, errs []float64
		unit := ""
		for _, x := range r.runs {
			rate = append(rate, x.rate)
			ratio = append(ratio, x.bareRatio)
			p50 = append(p50, float64(x.p50))
			p99 = append(p99, float64(x.p99))
			trips = append(trips, x.trips)
			errs = append(errs, float64(x.errs))
			unit = x.tripUnit
			mx = append(mx, float64(x.maxInUse))
		}
		ratioS := "—"
		if median(ratio) > 0 {
			ratioS = fmt.Sprintf("%.2f", median(ratio))
		}
		tripS := fmt.Sprintf("%.2f", median(trips))
		if unit != "round trips" {
			tripS += " (" + unit + ")"
		}
		fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s | %.0f (of %d) | %s | %.0f |\n", r.contender, median(rate), ratioS,
			fmtDur(time.Duration(median(p50))), fmtDur(time.Duration(median(p99))), maxOf(mx), cfg.limit, tripS, median(errs))
	}
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}
