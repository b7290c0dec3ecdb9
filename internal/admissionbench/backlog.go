package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/areev/runlease/internal/benchkit"
)

// backlogResult is one measurement behind a queue of n waiters.
type backlogResult struct {
	n          int
	queued     int           // waiters in the queue when the admissions were measured
	queueTime  time.Duration // how long queueing them took
	enqRate    float64       // waiters queued per second, over the whole build
	enqRateEnd float64       // the same over its last tenth
	budgetHit  bool          // the build, or the admissions, ran out of -budget
	rate       float64       // admissions per second behind the backlog
	admitted   int
	claim      time.Duration // median refused plain claim; 0 when not applicable
	readDur    time.Duration // median store read by waiters while admitting
	readRows   float64       // median rows per such read
	readsPer   float64       // such reads per admission
	hasReads   bool
	trips      float64 // round trips (or store calls) per admission
	tripUnit   string
	errs       int64
	lastErr    string
	maxInUse   int64
	strays     int64 // backlog waiters admitted while the probes were measured
	buildStop  bool  // the build ran out of -budget
	admitShort bool  // the admissions ran out of -admit-budget
	note       string
}

type backlogRow struct {
	contender string
	n         int
	runs      []backlogResult
	base      []backlogResult // the same runs' empty-queue measurements
}

// runBacklog holds every unit, queues n waiters behind them (each a
// goroutine waiting for admission, several principals), times refused
// claims, then lets the probes (closed-loop waiters ranked ahead of the
// backlog) through and times their admissions while the backlog stays
// queued: what each admission costs with n waiters in the queue.
func runBacklog(ctx context.Context, cfg config, c contender, n int, progress io.Writer) (res backlogResult, err error) {
	res = backlogResult{n: n, tripUnit: c.tripUnit()}
	hctx := withRole(ctx, roleHarness)
	bctx, bcancel := context.WithCancel(ctx)
	pctx, pcancel := context.WithCancel(ctx)
	var bwg sync.WaitGroup
	waitProbes := func() {}
	// The contender is closed before the backlog's waiters are waited for:
	// a cancelled waiter takes its place out of the queue, which a
	// hundred thousand of them would take minutes to do, and the schema,
	// table or file goes anyway.
	var ch *children // the processes queueing the backlog, if not this one
	defer func() {
		pcancel()
		waitProbes()
		bcancel()
		if ch != nil {
			if cerr := ch.stop(); err == nil && cerr != nil {
				err = fmt.Errorf("the backlog's processes: %w", cerr)
			}
		}
		if cerr := c.close(); err == nil && cerr != nil {
			err = fmt.Errorf("closing: %w", cerr)
		}
		done := make(chan struct{})
		go func() { bwg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			fmt.Fprintf(progress, "backlog %s n=%d: waiters still running 2 minutes after their cancellation\n", c.name(), n)
		}
	}()

	// Every unit held, so that nothing of the backlog is admitted.
	var blockers []func(context.Context) error
	for i := range cfg.limit {
		bctx, cancel := context.WithTimeout(hctx, 30*time.Second)
		rel, err := c.admit(bctx, -1-i, false, nil)
		cancel()
		if err != nil {
			return res, fmt.Errorf("holding unit %d: %w", i, err)
		}
		blockers = append(blockers, rel)
	}

	// The backlog.
	var (
		queuedN  atomic.Int64
		strays   atomic.Int64
		tmu      sync.Mutex
		times    []time.Time
		launched int
		sem      = make(chan struct{}, cfg.inflight)
	)
	start := time.Now()
	lastReport := start
	strayCount := strays.Load
	if sp, ok := c.(spreader); ok && cfg.procs > 1 && n > 0 {
		if ch, err = spawnChildren(ctx, cfg, sp, n, cfg.procs, progress); err != nil {
			return res, err
		}
		strayCount = ch.strays.Load
		n = 0 // nothing to queue here
	}
	for i := range n {
		if time.Since(start) > cfg.budget {
			res.budgetHit = true
			break
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		launched++
		q := make(chan struct{})
		var once sync.Once
		queued := func() {
			once.Do(func() {
				queuedN.Add(1)
				tmu.Lock()
				times = append(times, time.Now())
				tmu.Unlock()
				close(q)
			})
		}
		bwg.Add(2)
		go func() {
			defer bwg.Done()
			// The next waiter starts once this one is queued (or after a
			// while, should the signal never come).
			select {
			case <-q:
			case <-time.After(10 * time.Second):
			case <-bctx.Done():
			}
			<-sem
		}()
		go func() {
			defer bwg.Done()
			rel, err := c.admit(bctx, i, false, queued)
			if err != nil {
				return
			}
			// Admitted while the units were meant to be held: a stray,
			// counted, and given back at once.
			strays.Add(1)
			_ = rel(context.WithoutCancel(bctx))
		}()
		if time.Since(lastReport) >= 15*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(progress, "backlog %s n=%d: %d queued after %v\n", c.name(), n, queuedN.Load(), time.Since(start).Round(time.Second))
		}
	}
	if ch != nil {
		times = waitChildren(ctx, ch, start, progress, c.name(), &res)
		launched = int(ch.total())
		queuedN.Store(ch.total())
	}
	// Let the waiters in flight settle.
	settle := time.Now()
	for int(queuedN.Load()) < launched && time.Since(settle) < 30*time.Second {
		if !sleepCtx(ctx, 5*time.Millisecond) {
			return res, ctx.Err()
		}
	}
	tmu.Lock()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	if len(times) > 0 {
		res.queueTime = times[len(times)-1].Sub(start)
		res.enqRate = float64(len(times)) / res.queueTime.Seconds()
		if k := len(times) / 10; k >= 2 {
			tail := times[len(times)-k:]
			if d := tail[len(tail)-1].Sub(tail[0]); d > 0 {
				res.enqRateEnd = float64(k-1) / d.Seconds()
			}
		}
	}
	tmu.Unlock()
	res.queued = int(queuedN.Load())
	if ql, ok := c.(interface {
		queueLen(context.Context) (int, error)
	}); ok {
		if m, err := ql.queueLen(ctx); err == nil {
			res.queued = m
		}
	}
	if res.budgetHit {
		res.buildStop = true
		res.note = fmt.Sprintf("build stopped at the %v budget", cfg.budget)
	}

	// Refused claims.
	if rf, ok := c.(refuser); ok {
		var ds []time.Duration
		cstart := time.Now()
		for i := range cfg.claimTrials {
			// Slow claims: as many as fit in 30 s, one at least.
			if i > 0 && time.Since(cstart) > 30*time.Second {
				break
			}
			d, err := rf.refusedClaim(hctx)
			if err != nil {
				return res, fmt.Errorf("refused claim: %w", err)
			}
			ds = append(ds, d)
		}
		res.claim = medianDur(ds)
	}

	// The probes queue ahead of the backlog, then the units are freed.
	rec := newRecorder()
	var probesQueued atomic.Int64
	waitProbes = workers(pctx, c, cfg.probes, true, cfg.hold, rec, func() { probesQueued.Add(1) })
	pstart := time.Now()
	for int(probesQueued.Load()) < cfg.probes && time.Since(pstart) < cfg.admitBudget {
		if !sleepCtx(ctx, time.Millisecond) {
			return res, ctx.Err()
		}
	}
	rec.start()
	rt, hasReads := c.(readTimer)
	if hasReads {
		rt.resetReads()
	}
	strays0 := strayCount()
	tr0, n0, t0 := c.trips(), int64(0), time.Now()
	deadline := t0.Add(cfg.admitBudget)
	for _, b := range blockers {
		if err := b(hctx); err != nil {
			return res, fmt.Errorf("releasing a held unit: %w", err)
		}
	}
	for rec.count.Load() < int64(cfg.warmAdmits) && time.Now().Before(deadline) {
		if !sleepCtx(ctx, 200*time.Microsecond) {
			return res, ctx.Err()
		}
	}
	// Without the warm-up done in the budget, the admissions are counted
	// from the release of the units.
	warm := rec.count.Load() >= int64(cfg.warmAdmits)
	if warm {
		if hasReads {
			rt.resetReads()
		}
		strays0 = strayCount()
		tr0, n0, t0 = c.trips(), rec.count.Load(), time.Now()
	}
	target := n0 + int64(cfg.admissions)
	stopProfile := func() error { return nil }
	if cfg.admitProf != "" && res.n > 0 {
		if stopProfile, err = benchkit.StartCPUProfile(cfg.admitProf); err != nil {
			return res, err
		}
	}
	for rec.count.Load() < target && time.Now().Before(deadline) {
		if !sleepCtx(ctx, 200*time.Microsecond) {
			_ = stopProfile()
			return res, ctx.Err()
		}
	}
	if err := stopProfile(); err != nil {
		return res, err
	}
	tr1, n1, elapsed := c.trips(), rec.count.Load(), time.Since(t0)
	res.admitted = int(n1 - n0)
	res.strays = strayCount() - strays0
	if res.admitted < cfg.admissions {
		res.budgetHit = true
		res.admitShort = true
		what := fmt.Sprintf("%d of %d admissions", res.admitted, cfg.admissions)
		if !warm {
			what = fmt.Sprintf("%d admissions, warm-up included,", res.admitted)
		}
		res.note = strings.TrimPrefix(res.note+fmt.Sprintf("; %s in the %v budget", what, cfg.admitBudget), "; ")
	}
	if res.admitted > 0 {
		res.rate = float64(res.admitted) / elapsed.Seconds()
		res.trips = float64(tr1-tr0) / float64(res.admitted)
	}
	if hasReads {
		durs, rows := rt.reads()
		res.hasReads = true
		res.readDur = medianDur(durs)
		fr := make([]float64, len(rows))
		for i, r := range rows {
			fr[i] = float64(r)
		}
		res.readRows = median(fr)
		if res.admitted > 0 {
			res.readsPer = float64(len(durs)) / float64(res.admitted)
		}
	}
	res.errs = rec.errs.Load()
	if s, ok := rec.lastErr.Load().(string); ok {
		res.lastErr = s
	}
	res.maxInUse = rec.maxInUse.Load()
	return res, nil
}

func measureBacklog(ctx context.Context, cfg config, progress io.Writer) ([]backlogRow, error) {
	var names []string
	for _, name := range cfg.contenders {
		// DBOS's default poll admits a few runs a second: too slow to say
		// anything behind a backlog.
		if name != "dbos-default-poll" {
			names = append(names, name)
		}
	}
	ns := append([]int{0}, cfg.backlogs...)
	var rows []backlogRow
	for _, name := range names {
		for _, n := range ns[1:] {
			rows = append(rows, backlogRow{contender: name, n: n})
		}
	}
	for run := 1; run <= cfg.runs; run++ {
		for _, name := range names {
			var base backlogResult
			for _, n := range ns {
				c, err := open(ctx, cfg, name)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", name, err)
				}
				r, err := runBacklog(ctx, cfg, c, n, progress)
				if err != nil {
					return nil, fmt.Errorf("%s n=%d: %w", name, n, err)
				}
				fmt.Fprintf(progress, "backlog %-18s n=%-6d run %d/%d: queued %d in %v (%.0f/s, last tenth %.0f/s); %d admissions at %.1f/s, claim %v, reads %.2f/admission of %.0f rows in %v, %.2f %s/admission, max in use %d, %d strays, %d errors %s %s\n",
					name, n, run, cfg.runs, r.queued, r.queueTime.Round(time.Millisecond), r.enqRate, r.enqRateEnd, r.admitted, r.rate,
					r.claim.Round(time.Microsecond), r.readsPer, r.readRows, r.readDur.Round(time.Microsecond), r.trips, r.tripUnit, r.maxInUse, r.strays, r.errs, r.lastErr, r.note)
				if n == 0 {
					base = r
					continue
				}
				for i := range rows {
					if rows[i].contender == name && rows[i].n == n {
						rows[i].runs = append(rows[i].runs, r)
						rows[i].base = append(rows[i].base, base)
					}
				}
			}
		}
	}
	return rows, nil
}

func ratioS(xs, bases []float64) string {
	var rs []float64
	for i := range xs {
		if bases[i] > 0 && xs[i] > 0 {
			rs = append(rs, xs[i]/bases[i])
		}
	}
	if len(rs) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", median(rs))
}

func writeBacklog(w io.Writer, cfg config, rows []backlogRow) {
	fmt.Fprintf(w, "\n### Backlog: one scope of limit %d; N waiters queued behind held units, then %d closed-loop probes ranked ahead of them, hold %v; %d admissions measured after %d (medians of %d runs; ratios to the same at an empty queue)\n\n",
		cfg.limit, cfg.probes, cfg.hold, cfg.admissions, cfg.warmAdmits, cfg.runs)
	fmt.Fprintln(w, "| contender | N | queued | queueing took | queued/s (last tenth) | admissions/s | vs empty | refused claim | vs empty | reads/admission | read | rows/read | vs empty | round trips/admission | vs empty | max in use | note |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range rows {
		var queued, qt, er, ere, rate, brate, claim, bclaim, rp, rd, brd, rr, trips, btrips, mx []float64
		unit, hasReads := "", false
		var builds, shorts, strays, errs int
		var shortN []string
		lastErr := ""
		for i, x := range r.runs {
			b := r.base[i]
			queued = append(queued, float64(x.queued))
			qt = append(qt, float64(x.queueTime))
			er = append(er, x.enqRate)
			ere = append(ere, x.enqRateEnd)
			rate = append(rate, x.rate)
			brate = append(brate, b.rate)
			claim = append(claim, float64(x.claim))
			bclaim = append(bclaim, float64(b.claim))
			rp = append(rp, x.readsPer)
			rd = append(rd, float64(x.readDur))
			brd = append(brd, float64(b.readDur))
			rr = append(rr, x.readRows)
			trips = append(trips, x.trips)
			btrips = append(btrips, b.trips)
			mx = append(mx, float64(x.maxInUse))
			unit = x.tripUnit
			hasReads = x.hasReads
			if x.buildStop {
				builds++
			}
			if x.admitShort {
				shorts++
				shortN = append(shortN, strconv.Itoa(x.admitted))
			}
			strays += int(x.strays)
			errs += int(x.errs)
			if x.lastErr != "" {
				lastErr = x.lastErr
			}
		}
		var noteList []string
		if builds > 0 {
			noteList = append(noteList, fmt.Sprintf("build stopped at the %v budget in %d of %d runs", cfg.budget, builds, len(r.runs)))
		}
		if shorts > 0 {
			noteList = append(noteList, fmt.Sprintf("admissions in the %v budget: %s of %d", cfg.admitBudget, strings.Join(shortN, ", "), cfg.admissions))
		}
		if strays > 0 {
			noteList = append(noteList, fmt.Sprintf("%d backlog waiters admitted ahead of the probes", strays))
		}
		if errs > 0 {
			noteList = append(noteList, fmt.Sprintf("%d errors, the last: %s", errs, lastErr))
		}
		readsS, readS, rowsS, readRatio := "—", "—", "—", "—"
		if hasReads {
			readsS = fmt.Sprintf("%.2f", median(rp))
			readS = fmtDur(time.Duration(median(rd)))
			rowsS = fmt.Sprintf("%.0f", median(rr))
			readRatio = ratioS(rd, brd)
		}
		tripS := fmt.Sprintf("%.2f", median(trips))
		if unit != "round trips" {
			tripS += " (" + unit + ")"
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %s | %.0f (%.0f) | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f (of %d) | %s |\n",
			r.contender, r.n, median(queued), fmtDur(time.Duration(median(qt))), median(er), median(ere),
			median(rate), ratioS(rate, brate), fmtDur(time.Duration(median(claim))), ratioS(claim, bclaim),
			readsS, readS, rowsS, readRatio, tripS, ratioS(trips, btrips), maxOf(mx), cfg.limit, strings.Join(noteList, "; "))
	}
}
