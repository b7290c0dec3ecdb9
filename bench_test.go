package runlease_test

// Benchmarks of every Store call and every Lease and Slots operation, on
// SQLite (a fresh file in b.TempDir()) and Postgres (a fresh table; skipped
// without RUNLEASE_TEST_POSTGRES), each at 1, 4 and 16 goroutines, each
// beside its baseline: the same SQL sent directly, in the same run. See
// BENCHMARKS.md for the machine, the commands and the results, and
// internal/benchharness for the same scenarios as one table.
//
// g=N means N goroutines, each running its own closed loop (the next
// operation starts when the last returns) on keys of its own; b.N
// operations are shared out among them. Each benchmark reports:
//
//	ops/s          operations per second through the library
//	p50-us, p99-us latency of one operation, in microseconds
//	trips/op       Postgres: socket round trips per operation, counted on
//	               the pool's connections; SQLite: store calls per
//	               operation (there is no network)
//	base-…         the same for the baseline
//	ratio          ops/s over base-ops/s: 1 is the physical limit
//
// The library and the baseline each run b.N operations, in slices that take
// turns so that a noisy machine's load weighs on both alike; ns/op covers
// the library's slices only. BenchmarkHandoff reports
// latencies; its ratio is base-p50-us over p50-us.
//
//	go test -run '^$' -bench . -benchtime 2000x

import (
	"fmt"
	"testing"
	"time"

	"github.com/areev/runlease/internal/benchkit"
	"github.com/areev/runlease/internal/pgtest"
)

var benchGoroutines = []int{1, 4, 16}

func BenchmarkMetaGet(b *testing.B)        { benchScenario(b, benchkit.Get) }
func BenchmarkMetaCASCreate(b *testing.B)  { benchScenario(b, benchkit.CASCreate) }
func BenchmarkMetaCASSwap(b *testing.B)    { benchScenario(b, benchkit.CASSwap) }
func BenchmarkMetaDelete(b *testing.B)     { benchScenario(b, benchkit.Delete) }
func BenchmarkMetaScan(b *testing.B)       { benchScenario(b, benchkit.Scan) }
func BenchmarkMetaBatch(b *testing.B)      { benchScenario(b, benchkit.Batch) }
func BenchmarkAcquire(b *testing.B)        { benchScenario(b, benchkit.Acquire) }
func BenchmarkAcquireRelease(b *testing.B) { benchScenario(b, benchkit.AcquireRelease) }
func BenchmarkRenew(b *testing.B)          { benchScenario(b, benchkit.Renew) }

// BenchmarkAcquireReleaseVsPlain is BenchmarkAcquireRelease against a
// baseline whose release sends no pg_notify: what waking waiters costs.
func BenchmarkAcquireReleaseVsPlain(b *testing.B) { benchScenario(b, benchkit.AcquireReleasePlain) }

// BenchmarkAcquireReleaseVsDelete is BenchmarkAcquireRelease against an
// INSERT and a DELETE: the cheapest way to take and free a key.
func BenchmarkAcquireReleaseVsDelete(b *testing.B) { benchScenario(b, benchkit.AcquireReleaseDelete) }
func BenchmarkWrite(b *testing.B)                  { benchScenario(b, benchkit.Write) }
func BenchmarkSlotsRenew(b *testing.B)             { benchScenario(b, benchkit.SlotsRenew) }
func BenchmarkPeek(b *testing.B)                   { benchScenario(b, benchkit.Peek) }
func BenchmarkOccupancy(b *testing.B)              { benchScenario(b, benchkit.Occupancy) }

// BenchmarkClaimSlots claims the one free slot of a scope whose other
// slots are all held, then releases it, at limits 1, 10 and 1000: the
// round trips per claim must not grow with the limit.
func BenchmarkClaimSlots(b *testing.B) {
	forEachStore(b, func(b *testing.B, env *benchkit.Env) {
		for _, limit := range []int{1, 10, 1000} {
			b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
				benchGoroutinesOn(b, env, benchkit.Claim(limit))
			})
		}
	})
}

// BenchmarkHandoff measures, on Postgres, a release by one node (a store
// on its own pool) until another node's AcquireWait on the same table
// returns: with notifications, and with polling alone every 50 ms.
func BenchmarkHandoff(b *testing.B) {
	b.Run("postgres", func(b *testing.B) {
		env := openEnv(b, "postgres")
		for _, mode := range benchkit.HandoffModes {
			b.Run(mode.Name, func(b *testing.B) {
				res, err := benchkit.Handoff(b.Context(), env, mode, benchkit.Limit{N: b.N})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(us(res.Store.P50()), "p50-us")
				b.ReportMetric(us(res.Store.P99()), "p99-us")
				b.ReportMetric(res.Store.TripsPerOp(), "trips/op")
				b.ReportMetric(us(res.Base.P50()), "base-p50-us")
				b.ReportMetric(us(res.Base.P99()), "base-p99-us")
				b.ReportMetric(res.Base.TripsPerOp(), "base-trips/op")
				b.ReportMetric(float64(res.Base.P50())/float64(res.Store.P50()), "ratio")
			})
		}
	})
}

func benchScenario(b *testing.B, sc benchkit.Scenario) {
	forEachStore(b, func(b *testing.B, env *benchkit.Env) { benchGoroutinesOn(b, env, sc) })
}

// forEachStore runs fn on a fresh Env of each store kind.
func forEachStore(b *testing.B, fn func(*testing.B, *benchkit.Env)) {
	for _, kind := range benchkit.Kinds {
		b.Run(kind, func(b *testing.B) { fn(b, openEnv(b, kind)) })
	}
}

func benchGoroutinesOn(b *testing.B, env *benchkit.Env, sc benchkit.Scenario) {
	for _, g := range benchGoroutines {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			res, err := benchkit.Run(b.Context(), env, sc, g, benchkit.Limit{N: b.N}, b)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(res.Store.Rate, "ops/s")
			b.ReportMetric(us(res.Store.P50()), "p50-us")
			b.ReportMetric(us(res.Store.P99()), "p99-us")
			b.ReportMetric(res.Store.TripsPerOp(), "trips/op")
			b.ReportMetric(res.Base.Rate, "base-ops/s")
			b.ReportMetric(us(res.Base.P50()), "base-p50-us")
			b.ReportMetric(us(res.Base.P99()), "base-p99-us")
			b.ReportMetric(res.Base.TripsPerOp(), "base-trips/op")
			b.ReportMetric(res.Ratio(), "ratio")
		})
	}
}

// openEnv opens a fresh Env of kind for b, closed when b ends; Postgres is
// skipped without RUNLEASE_TEST_POSTGRES.
func openEnv(b *testing.B, kind string) *benchkit.Env {
	b.Helper()
	var dir, dsn string
	if kind == "postgres" {
		dsn = pgtest.DSN(b)
	} else {
		dir = b.TempDir()
	}
	env, err := benchkit.Open(b.Context(), kind, dir, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := env.Close(); err != nil {
			b.Error(err)
		}
	})
	return env
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
