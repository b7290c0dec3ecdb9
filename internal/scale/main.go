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
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/scalekit"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("RUNLEASE_TEST_POSTGRES"), "Postgres DSN")
	scalekit.Main(func(cfg scalekit.Config) error { return run(*dsn, cfg) })
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
	return scalekit.Measure(ctx, store, sc, os.Stdout)
}
