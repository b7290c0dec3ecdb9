// Package pgtest holds helpers for tests against PostgreSQL: the shared test
// server's DSN from the environment, a random table per test so tests run in
// parallel, and a private cluster that a test may stop and restart.
//
// Postgres tests are opt-in: without RUNLEASE_TEST_POSTGRES they skip, with a
// message that says how to enable them. CI sets it, which makes them
// mandatory there.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvDSN names the environment variable that holds the test server's DSN.
const EnvDSN = "RUNLEASE_TEST_POSTGRES"

// ExampleDSN is the DSN of the server the development machines run.
const ExampleDSN = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

// cleanupTimeout bounds each statement a cleanup runs, whose test's context
// has already ended.
const cleanupTimeout = 30 * time.Second

// DSN returns the test server's DSN from RUNLEASE_TEST_POSTGRES, and skips t
// when it is not set.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		skipped.Add(1)
		t.Skipf("set %s=%s to run the Postgres tests", EnvDSN, ExampleDSN)
	}
	return dsn
}

// Pool returns a pool on the test server, closed when t ends, and skips t
// when RUNLEASE_TEST_POSTGRES is not set. It fails t when the server cannot
// be reached.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DSN(t))
	if err != nil {
		t.Fatalf("pgtest: %s: %v", EnvDSN, err)
	}
	// Room for the parallel subtests of the conformance suite, well under
	// the server's default of 100 connections.
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatalf("pgtest: the server at %s is unreachable: %v", EnvDSN, err)
	}
	return pool
}

// NewTable returns a fresh table name, unique to this call, and drops the
// table when t ends. It does not create the table. pool must outlive t's
// cleanups, as one from [Pool] called before NewTable does.
func NewTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := UniqueName("runlease_test_")
	DropAtCleanup(t, pool, name)
	return name
}

// DropAtCleanup drops the table named name (a name as WithTable takes it,
// optionally schema-qualified) when t ends.
func DropAtCleanup(t testing.TB, pool *pgxpool.Pool, name string) {
	t.Helper()
	t.Cleanup(func() {
		execSQL(t, pool, "DROP TABLE IF EXISTS "+Ident(name))
	})
}

// NewSchema creates a schema with a fresh name and drops it, with everything
// in it, when t ends.
func NewSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := UniqueName("runlease_test_")
	execSQL(t, pool, "CREATE SCHEMA "+Ident(name))
	t.Cleanup(func() {
		execSQL(t, pool, "DROP SCHEMA IF EXISTS "+Ident(name)+" CASCADE")
	})
	return name
}

// Ident returns name, split at a dot into schema and table as WithTable
// does, as a quoted SQL identifier.
func Ident(name string) string {
	if schema, table, ok := strings.Cut(name, "."); ok {
		return pgx.Identifier{schema, table}.Sanitize()
	}
	return pgx.Identifier{name}.Sanitize()
}

func execSQL(t testing.TB, pool *pgxpool.Pool, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), cleanupTimeout)
	defer cancel()
	if _, err := pool.Exec(ctx, sql); err != nil {
		t.Errorf("pgtest: %s: %v", sql, err)
	}
}

// UniqueName returns prefix followed by 16 random hex digits, a name no
// other test run uses.
func UniqueName(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
