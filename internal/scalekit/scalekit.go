// Package scalekit keeps many leases alive from one process on any store
// and reports whether any was lost, the CPU it used, and the memory each
// held lease costs. The scale commands (internal/scale for Postgres,
// etcdstore/internal/scale for etcd) open a store and hand it here.
package scalekit

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/benchkit"
)

// Config is what a run does.
type Config struct {
	Leases    int           // leases to keep alive
	TTL       time.Duration // their TTL
	Duration  time.Duration // how long to keep them once all are acquired
	Acquirers int           // goroutines acquiring them
	// CPUProfile, when set, is the file a CPU profile of the whole run
	// (acquiring and keeping) is written to.
	CPUProfile string
	// HeapProfile, when set, is the file a heap profile is written to once
	// every lease is acquired and kept.
	HeapProfile string
}

// Report is what a run measured.
type Report struct {
	Config
	Alive, Lost         int
	Renewals, Faults    int64
	P50, P99, LeastLeft time.Duration
	Acquired            time.Duration // wall time to acquire and keep every lease
	AcquireCPU, KeepCPU time.Duration
	HeapPerLease        float64 // bytes
}

type counters struct {
	renewals, faults, lost atomic.Int64
	mu                     sync.Mutex
	latencies              []time.Duration
	minLeft                time.Duration
}

// Run acquires cfg.Leases leases on store, keeps them with one Renewer for
// cfg.Duration, then stops keeping them (leaving the rows to expire) and
// reports.
func Run(ctx context.Context, store runlease.Store, cfg Config) (Report, error) {
	c := &counters{minLeft: cfg.TTL}
	hooks := runlease.Hooks{
		Renewed: func(e runlease.RenewEvent) {
			c.renewals.Add(1)
			if e.Err != nil {
				c.faults.Add(1)
			}
			c.mu.Lock()
			if len(c.latencies) < 1_000_000 {
				c.latencies = append(c.latencies, e.Latency)
			}
			c.minLeft = min(c.minLeft, e.TimeLeft)
			c.mu.Unlock()
		},
		Lost: func(runlease.LossEvent) { c.lost.Add(1) },
	}

	stopProfile, err := benchkit.StartCPUProfile(cfg.CPUProfile)
	if err != nil {
		return Report{}, err
	}
	defer stopProfile() // on an early return; a second call does nothing
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0 := cpuTime()

	var renewer runlease.Renewer
	defer renewer.Close()
	keepers := make([]*runlease.Keeper, cfg.Leases)
	start := time.Now()
	if err := acquireAll(ctx, store, &renewer, keepers, cfg, hooks); err != nil {
		return Report{}, err
	}
	rep := Report{Config: cfg, Acquired: time.Since(start)}
	cpu1 := cpuTime()
	rep.AcquireCPU = cpu1 - cpu0

	runtime.GC()
	var held runtime.MemStats
	runtime.ReadMemStats(&held)
	rep.HeapPerLease = float64(int64(held.HeapAlloc)-int64(before.HeapAlloc)) / float64(cfg.Leases)
	if err := writeHeapProfile(cfg.HeapProfile); err != nil {
		return Report{}, err
	}
	c.renewals.Store(0)
	c.faults.Store(0)
	c.mu.Lock()
	c.latencies = c.latencies[:0]
	c.mu.Unlock()

	time.Sleep(cfg.Duration)
	rep.KeepCPU = cpuTime() - cpu1
	if err := stopProfile(); err != nil {
		return Report{}, err
	}
	for _, k := range keepers {
		if k.Err() == nil {
			rep.Alive++
		}
	}
	renewer.Close()

	c.mu.Lock()
	lat := slices.Clone(c.latencies)
	rep.LeastLeft = c.minLeft
	c.mu.Unlock()
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(p*float64(len(lat)-1))]
	}
	rep.P50, rep.P99 = pct(0.5), pct(0.99)
	rep.Lost = int(c.lost.Load())
	rep.Renewals, rep.Faults = c.renewals.Load(), c.faults.Load()
	return rep, nil
}

func acquireAll(ctx context.Context, store runlease.Store, r *runlease.Renewer, keepers []*runlease.Keeper,
	cfg Config, hooks runlease.Hooks) error {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range max(cfg.Acquirers, 1) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(keepers) {
					return
				}
				l, err := runlease.Acquire(ctx, store, "run-"+strconv.Itoa(i), "scale#node", runlease.WithTTL(cfg.TTL),
					runlease.WithHooks(hooks))
				if err == nil {
					keepers[i], err = r.Keep(ctx, l)
				}
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("lease %d: %w", i, err) })
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Print writes the report as the table BENCHMARKS.md shows.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "| leases | TTL | kept for | alive at end | lost | renewals | renewal faults | renew p50 | renew p99 | least trust left | CPU while keeping | heap per lease |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(w, "| %d | %v | %v | %d | %d | %d | %d | %v | %v | %v | %.1f%% of one core | %.0f B |\n",
		r.Leases, r.TTL, r.Duration, r.Alive, r.Lost, r.Renewals, r.Faults,
		r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.LeastLeft.Round(time.Millisecond),
		100*r.KeepCPU.Seconds()/r.Duration.Seconds(), r.HeapPerLease)
	fmt.Fprintf(w, "\nacquired %d leases in %v (CPU %v)\n", r.Leases, r.Acquired.Round(time.Millisecond), r.AcquireCPU.Round(time.Millisecond))
}

// writeHeapProfile writes a heap profile to path; with no path it does
// nothing.
func writeHeapProfile(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
