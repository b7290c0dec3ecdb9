// Command benchharness measures runlease against the physical limit of the
// machine it runs on: each scenario runs as closed loops for a fixed time
// through the library and, in the same run, as the bare statements the
// library sends, and the harness prints one markdown table of the medians
// of several runs, with the ratio of the two and the round trips per
// operation. The scenarios are those of the package's go test benchmarks
// (internal/benchkit).
//
//	go run ./internal/benchharness -store=sqlite,postgres \
//		-dsn=postgres://root@127.0.0.1:5432/test?sslmode=disable \
//		-duration=10s -runs=3 -goroutines=1,4,16 -scenarios=all,handoff
//
// Progress goes to standard error; the table alone to standard output.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/areev/runlease/internal/benchkit"
)

type config struct {
	stores     []string
	dsn, dir   string
	duration   time.Duration
	runs       int
	goroutines []int
	scenarios  []benchkit.Scenario
	handoff    bool
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchharness:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rows, err := run(ctx, cfg)
	if err == nil {
		err = benchkit.WriteTable(os.Stdout, rows)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchharness:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("benchharness", flag.ContinueOnError)
	stores := fs.String("store", "sqlite", "stores to measure, comma-separated: sqlite, postgres")
	fs.StringVar(&cfg.dsn, "dsn", os.Getenv("RUNLEASE_TEST_POSTGRES"), "Postgres DSN (default $RUNLEASE_TEST_POSTGRES); each scenario uses a fresh table, dropped after")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the SQLite files (default: a temporary directory, removed after)")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long the library's loops run per measurement; the baseline's run as long, the two taking turns in slices of 0.5 s")
	fs.IntVar(&cfg.runs, "runs", 3, "measurements per scenario, store and goroutine count; the table shows their medians")
	gs := fs.String("goroutines", "1,4,16", "goroutine counts, comma-separated: each goroutine is one closed loop")
	names := fs.String("scenarios", "all,handoff", "scenarios, comma-separated: all, handoff, claim, or any of "+scenarioNames())
	fs.BoolVar(&benchkit.PostgresBaselinePrepared, "pg-prepared-baseline", false, "run the Postgres baseline's bare statements prepared (pgx's default cache), not parsed at every call")
	fs.StringVar(&benchkit.SQLiteSynchronous, "sqlite-synchronous", benchkit.SQLiteSynchronous, "synchronous pragma of the SQLite baseline: keep it equal to the store's")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	cfg.stores = split(*stores)
	for _, s := range cfg.stores {
		if s != "sqlite" && s != "postgres" {
			return cfg, fmt.Errorf("-store: unknown store %q", s)
		}
		if s == "postgres" && cfg.dsn == "" {
			return cfg, fmt.Errorf("-store=postgres needs -dsn or RUNLEASE_TEST_POSTGRES")
		}
	}
	for _, g := range split(*gs) {
		n, err := strconv.Atoi(g)
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-goroutines: %q is not a positive number", g)
		}
		cfg.goroutines = append(cfg.goroutines, n)
	}
	var err error
	if cfg.scenarios, err = benchkit.Select(split(*names)); err != nil {
		return cfg, err
	}
	for _, n := range split(*names) {
		cfg.handoff = cfg.handoff || n == "handoff"
	}
	if cfg.runs < 1 || cfg.duration <= 0 {
		return cfg, fmt.Errorf("-runs and -duration must be positive")
	}
	return cfg, nil
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func scenarioNames() string {
	var n []string
	for _, s := range benchkit.Scenarios() {
		n = append(n, s.Name)
	}
	return strings.Join(n, ", ")
}

// run measures every scenario on every store, each on an Env of its own.
func run(ctx context.Context, cfg config) ([]benchkit.Row, error) {
	if cfg.dir == "" {
		dir, err := os.MkdirTemp("", "runlease-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.dir = dir
	}
	var rows []benchkit.Row
	for _, sc := range cfg.scenarios {
		for _, store := range cfg.stores {
			r, err := measure(ctx, cfg, sc, store)
			if err != nil {
				return nil, err
			}
			rows = append(rows, r...)
		}
	}
	if cfg.handoff && slices.Contains(cfg.stores, "postgres") {
		r, err := measureHandoffs(ctx, cfg)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// measure runs sc on a fresh Env of store, cfg.runs times at each goroutine
// count, the counts taking turns so that each run spans the same stretch
// of a noisy machine's time.
func measure(ctx context.Context, cfg config, sc benchkit.Scenario, store string) ([]benchkit.Row, error) {
	env, err := benchkit.Open(ctx, store, cfg.dir, cfg.dsn)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	rows := make([]benchkit.Row, len(cfg.goroutines))
	for i, g := range cfg.goroutines {
		rows[i] = benchkit.Row{Scenario: sc.Title, Store: store, G: g}
	}
	for run := 1; run <= cfg.runs; run++ {
		for i, g := range cfg.goroutines {
			res, err := benchkit.Run(ctx, env, sc, g, benchkit.Limit{Duration: cfg.duration}, nil)
			if err != nil {
				return nil, fmt.Errorf("%s on %s, g=%d: %w", sc.Name, store, g, err)
			}
			rows[i].Runs = append(rows[i].Runs, res)
			fmt.Fprintf(os.Stderr, "%-16s %-8s g=%-2d run %d/%d: %8.0f ops/s  p50 %-9s p99 %-9s %.2f trips/op | base %8.0f ops/s  p50 %-9s | ratio %.2f\n",
				sc.Name, store, g, run, cfg.runs, res.Store.Rate, benchkit.FormatDuration(res.Store.P50()),
				benchkit.FormatDuration(res.Store.P99()), res.Store.TripsPerOp(), res.Base.Rate,
				benchkit.FormatDuration(res.Base.P50()), res.Ratio())
		}
	}
	return rows, nil
}

// measureHandoffs runs the handoff in each mode, cfg.runs times, on one
// Postgres Env.
func measureHandoffs(ctx context.Context, cfg config) ([]benchkit.Row, error) {
	env, err := benchkit.OpenPostgres(ctx, cfg.dsn)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	var rows []benchkit.Row
	for _, mode := range benchkit.HandoffModes {
		row := benchkit.Row{Scenario: "handoff, " + mode.Name, Store: "postgres", G: 1, Latency: true}
		for run := 1; run <= cfg.runs; run++ {
			res, err := benchkit.Handoff(ctx, env, mode, benchkit.Limit{Duration: cfg.duration})
			if err != nil {
				return nil, fmt.Errorf("handoff %s: %w", mode.Name, err)
			}
			row.Runs = append(row.Runs, res)
			fmt.Fprintf(os.Stderr, "handoff %-9s run %d/%d: %d handoffs  p50 %-9s p99 %-9s %.2f trips/op | base p50 %-9s p99 %s\n",
				mode.Name, run, cfg.runs, res.Store.Ops, benchkit.FormatDuration(res.Store.P50()),
				benchkit.FormatDuration(res.Store.P99()), res.Store.TripsPerOp(),
				benchkit.FormatDuration(res.Base.P50()), benchkit.FormatDuration(res.Base.P99()))
		}
		rows = append(rows, row)
	}
	return rows, nil
}
