// Command scale keeps many leases alive from one process on a Postgres
// store and reports whether any was lost, the CPU it used, and the memory
// each held lease costs. It is the measurement behind the "100,000 leases"
// section of BENCHMARKS.md:
//
//	go run ./internal/scale -dsn "$RUNLEASE_TEST_POSTGRES" -leases 100000 -ttl 30s -duration 2m
//
// It creates a fresh table and drops it at the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("RUNLEASE_TEST_POSTGRES"), "Postgres DSN")
	n := flag.Int("leases", 100_000, "leases to keep alive")
	ttl := flag.Duration("ttl", 30*time.Second, "lease TTL")
	duration := flag.Duration("duration", 2*time.Minute, "how long to keep them after all are acquired")
	workers := flag.Int("acquirers", 16, "goroutines acquiring the leases")
	flag.Parse()
	if err := run(*dsn, *n, *ttl, *duration, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

type counters struct {
	renewals, faults, lost atomic.Int64
	mu                     sync.Mutex
	latencies              []time.Duration
	minLeft                time.Duration
}

func run(dsn string, n int, ttl, duration time.Duration, workers int) error {
	ctx := context.Background()
	var tok [6]byte
	_, _ = rand.Read(tok[:])
	table := "runlease_scale_" + hex.EncodeToString(tok[:])
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(workers + 4)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	store, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(table))
	if err != nil {
		return err
	}
	defer store.Close()

	c := &counters{minLeft: ttl}
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

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0 := cpuTime()

	var renewer runlease.Renewer
	keepers := make([]*runlease.Keeper, n)
	start := time.Now()
	if err := acquireAll(ctx, store, &renewer, keepers, ttl, hooks, workers); err != nil {
		return err
	}
	acquired := time.Since(start)
	cpu1 := cpuTime()

	runtime.GC()
	var held runtime.MemStats
	runtime.ReadMemStats(&held)
	perLease := float64(held.HeapAlloc-before.HeapAlloc) / float64(n)
	c.renewals.Store(0)
	c.faults.Store(0)

	time.Sleep(duration)
	cpu2 := cpuTime()
	alive := 0
	for _, k := range keepers {
		if k.Err() == nil {
			alive++
		}
	}
	renewer.Close()
	report(c, n, alive, ttl, duration, acquired, cpu1-cpu0, cpu2-cpu1, perLease)
	return nil
}

func acquireAll(ctx context.Context, store runlease.Store, r *runlease.Renewer, keepers []*runlease.Keeper,
	ttl time.Duration, hooks runlease.Hooks, workers int) error {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(keepers) {
					return
				}
				l, err := runlease.Acquire(ctx, store, "run-"+strconv.Itoa(i), "scale#node", runlease.WithTTL(ttl),
					runlease.WithHooks(hooks))
				if err == nil {
					keepers[i], err = r.Keep(ctx, l)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
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

func report(c *counters, n, alive int, ttl, duration, acquired, acquireCPU, keepCPU time.Duration, perLease float64) {
	c.mu.Lock()
	lat := slices.Clone(c.latencies)
	minLeft := c.minLeft
	c.mu.Unlock()
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(p*float64(len(lat)-1))]
	}
	fmt.Printf("| leases | TTL | kept for | alive at end | lost | renewals | renewal faults | renew p50 | renew p99 | least trust left | CPU while keeping | heap per lease |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Printf("| %d | %v | %v | %d | %d | %d | %d | %v | %v | %v | %.1f%% of one core | %.0f B |\n",
		n, ttl, duration, alive, c.lost.Load(), c.renewals.Load(), c.faults.Load(),
		pct(0.5).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), minLeft.Round(time.Millisecond),
		100*keepCPU.Seconds()/duration.Seconds(), perLease)
	fmt.Printf("\nacquired %d leases in %v (CPU %v)\n", n, acquired.Round(time.Millisecond), acquireCPU.Round(time.Millisecond))
}
