// Command pglockbench measures runlease's Acquire+Release on Postgres
// against cirello.io/pglock v1.16.1's, the closest peer, and against the
// bare INSERT and DELETE pair, in the same run on the same server: closed
// loops of fresh run ids (lock names) per goroutine, the library and each
// baseline taking turns in slices as the bench harness does, medians of
// several runs.
//
//	go run . -dsn=postgres://root@127.0.0.1:5432/test?sslmode=disable \
//		-duration=5s -runs=3 -goroutines=1,4,16
//
// It is a module of its own so that pglock and its driver (lib/pq, the
// driver pglock.New accepts) never reach the library's go.mod.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cirello.io/pglock"
	"github.com/lib/pq"

	"github.com/areev/runlease/internal/benchkit"
)

type config struct {
	dsn        string
	duration   time.Duration
	runs       int
	goroutines []int
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "pglockbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rows, err := measure(ctx, cfg, os.Stderr)
	if err == nil {
		err = benchkit.WriteTable(os.Stdout, rows)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pglockbench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("pglockbench", flag.ContinueOnError)
	fs.StringVar(&cfg.dsn, "dsn", os.Getenv("RUNLEASE_TEST_POSTGRES"), "Postgres DSN (default $RUNLEASE_TEST_POSTGRES)")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "how long each side's loops run per measurement")
	fs.IntVar(&cfg.runs, "runs", 3, "measurements per goroutine count; the table shows their medians")
	gs := fs.String("goroutines", "1,4,16", "goroutine counts, comma-separated")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.dsn == "" {
		return cfg, errors.New("no Postgres DSN: give -dsn or set RUNLEASE_TEST_POSTGRES")
	}
	if cfg.runs < 1 || cfg.duration <= 0 {
		return cfg, errors.New("-runs and -duration must be positive")
	}
	for _, g := range strings.Split(*gs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(g))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-goroutines: %q is not a positive number", g)
		}
		cfg.goroutines = append(cfg.goroutines, n)
	}
	return cfg, nil
}

// measure runs both comparisons, cfg.runs times at each goroutine count,
// on one Env, and returns their rows: runlease against pglock, then
// against the bare statements.
func measure(ctx context.Context, cfg config, progress io.Writer) ([]benchkit.Row, error) {
	env, err := benchkit.OpenPostgres(ctx, cfg.dsn)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	vsPglock, err := pglockScenario(env)
	if err != nil {
		return nil, err
	}
	scenarios := []benchkit.Scenario{vsPglock, benchkit.AcquireReleaseDelete}
	var rows []benchkit.Row
	for _, sc := range scenarios {
		for _, g := range cfg.goroutines {
			rows = append(rows, benchkit.Row{Scenario: sc.Title, Store: "postgres", G: g})
		}
	}
	for run := 1; run <= cfg.runs; run++ {
		for i, sc := range scenarios {
			for j, g := range cfg.goroutines {
				res, err := benchkit.Run(ctx, env, sc, g, benchkit.Limit{Duration: cfg.duration}, nil)
				if err != nil {
					return nil, fmt.Errorf("%s, g=%d: %w", sc.Name, g, err)
				}
				row := &rows[i*len(cfg.goroutines)+j]
				row.Runs = append(row.Runs, res)
				fmt.Fprintf(progress, "%-22s g=%-2d run %d/%d: %7.0f ops/s %.2f trips/op | base %7.0f ops/s %.2f trips/op | ratio %.2f\n",
					sc.Name, g, run, cfg.runs, res.Store.Rate, res.Store.TripsPerOp(),
					res.Base.Rate, res.Base.TripsPerOp(), res.Ratio())
			}
		}
	}
	return rows, nil
}

// pglockScenario is runlease's Acquire of a fresh run id and Release
// against pglock's Acquire of a fresh lock name and Release, on a pglock
// table of its own on the Env's server (dropped with the Env), through
// lib/pq with its round trips counted alike. pglock runs without
// heartbeats, as a caller that renews on its own would.
func pglockScenario(env *benchkit.Env) (benchkit.Scenario, error) {
	conn, err := pq.NewConnector(env.DSN())
	if err != nil {
		return benchkit.Scenario{}, err
	}
	conn.Dialer(countingDialer{env})
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(benchkit.PoolConns)
	db.SetMaxIdleConns(benchkit.PoolConns)
	var b [8]byte
	_, _ = rand.Read(b[:])
	client, err := pglock.New(db, pglock.WithCustomTable("pglock_bench_"+hex.EncodeToString(b[:])),
		pglock.WithLeaseDuration(time.Minute), pglock.WithHeartbeatFrequency(0))
	if err != nil {
		db.Close()
		return benchkit.Scenario{}, err
	}
	if err := client.CreateTable(); err != nil {
		db.Close()
		return benchkit.Scenario{}, err
	}
	env.OnClose(func() error { return errors.Join(client.DropTable(), db.Close()) })
	sc := benchkit.AcquireRelease
	sc.Name, sc.Title = "acquire-release-pglock", "Acquire+Release vs pglock v1.16.1"
	sc.BaseDesc = "pglock: SELECT nextval; INSERT … ON CONFLICT DO UPDATE … RETURNING; DELETE"
	sc.Base = func(ctx context.Context, e *benchkit.Env, w int) (*benchkit.Worker, error) {
		return &benchkit.Worker{Op: func(ctx context.Context) error {
			name := fmt.Sprintf("w%d-%d", w, e.Seq())
			l, err := client.AcquireContext(ctx, name, pglock.FailIfLocked())
			if err != nil {
				return err
			}
			return client.ReleaseContext(ctx, l)
		}}, nil
	}
	return sc, nil
}

// countingDialer dials the server for lib/pq with the Env's round-trip
// counter on every connection.
type countingDialer struct{ env *benchkit.Env }

func (d countingDialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

func (d countingDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, network, address)
}

func (d countingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return d.env.CountConn(c), nil
}
