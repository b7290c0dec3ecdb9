// Command scale keeps many leases alive from one process on a Postgres
// store and reports whether any was lost, the CPU it used, and the memory
// each held lease costs. It is the measurement behind the "100,000 leases"
// section of BENCHMARKS.md:
//
//	go run ./internal/scale -dsn "$RUNLEASE_TEST_POSTGRES" -leases 100000 -ttl 30s -duration 2m
//
// It creates a fresh table and drops it at the end. internal/scalekit does
// the measuring; etcdstore/internal/scale runs the same on etcd.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/scalekit"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("RUNLEASE_TEST_POSTGRES"), "Postgres DSN")
	n := flag.Int("leases", 100_000, "leases to keep alive")
	ttl := flag.Duration("ttl", 30*time.Second, "lease TTL")
	duration := flag.Duration("duration", 2*time.Minute, "how long to keep them after all are acquired")
	workers := flag.Int("acquirers", 16, "goroutines acquiring the leases")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the run (acquiring and keeping) to this file")
	heap := flag.String("heapprofile", "", "write a heap profile, taken once every lease is kept, to this file")
	flag.Parse()
	cfg := scalekit.Config{Leases: *n, TTL: *ttl, Duration: *duration, Acquirers: *workers, CPUProfile: *profile, HeapProfile: *heap}
	if err := run(*dsn, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func run(dsn string, sc scalekit.Config) error {
	ctx := context.Background()
	var tok [6]byte
	_, _ = rand.Read(tok[:])
	table := "runlease_scale_" + hex.EncodeToString(tok[:])
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(sc.Acquirers + 4)
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
	rep, err := scalekit.Run(ctx, store, sc)
	if err != nil {
		return err
	}
	rep.Print(os.Stdout)
	return nil
}
