package runlease_test

// BenchmarkMetaRangesHead reads the first 8 rows of a prefix holding 100,
// 10,000 and 100,000 rows, with MetaRanges and, as the baseline, with a
// MetaScan of the whole prefix (what the library did before it could read
// a head alone). The three prefixes share one table, on SQLite (a fresh
// file) and Postgres (a fresh table; skipped without
// RUNLEASE_TEST_POSTGRES). With MetaRanges the time of a read should not
// grow with the prefix:
//
//	go test -run '^$' -bench MetaRangesHead -count 5

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// rangeHeadSizes are the sizes of the prefixes BenchmarkMetaRangesHead reads.
var rangeHeadSizes = []int{100, 10_000, 100_000}

func BenchmarkMetaRangesHead(b *testing.B) {
	b.Run("store=sqlite", func(b *testing.B) {
		s, err := runlease.OpenSQLite(filepath.Join(b.TempDir(), "ranges.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		benchRangeHeads(b, s, func() {})
	})
	b.Run("store=postgres", func(b *testing.B) {
		pool := pgtest.Pool(b)
		table := pgtest.NewTable(b, pool)
		s, err := runlease.NewPostgres(b.Context(), pool, runlease.WithTable(table))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		// Vacuumed and analyzed once filled, as autovacuum leaves a
		// table that has long held its rows, so that it does not do it
		// in the middle of the measurements.
		benchRangeHeads(b, s, func() {
			if _, err := pool.Exec(b.Context(), "VACUUM ANALYZE "+pgx.Identifier{table}.Sanitize()); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// rangeStore is what BenchmarkMetaRangesHead needs of a built-in store.
type rangeStore interface {
	runlease.Store
	runlease.MultiCASer
	runlease.RangeReader
}

func benchRangeHeads(b *testing.B, s rangeStore, settle func()) {
	ctx := b.Context()
	for _, n := range rangeHeadSizes {
		fillRangePrefix(b, s, rangeHeadPrefix(n), n)
	}
	settle()
	for _, n := range rangeHeadSizes {
		p := rangeHeadPrefix(n)
		b.Run(fmt.Sprintf("rows=%d/read=ranges", n), func(b *testing.B) {
			rows := 0
			for b.Loop() {
				got, err := s.MetaRanges(ctx, []runlease.Range{{Prefix: p, Limit: 8}})
				if err != nil {
					b.Fatal(err)
				}
				rows = len(got[0])
			}
			if rows != 8 {
				b.Fatalf("MetaRanges returned %d rows, want 8", rows)
			}
			b.ReportMetric(float64(rows), "rows/op")
		})
		b.Run(fmt.Sprintf("rows=%d/read=scan", n), func(b *testing.B) {
			rows := 0
			for b.Loop() {
				got, err := s.MetaScan(ctx, p)
				if err != nil {
					b.Fatal(err)
				}
				rows = len(got)
			}
			if rows != n {
				b.Fatalf("MetaScan returned %d rows, want %d", rows, n)
			}
			b.ReportMetric(float64(rows), "rows/op")
		})
	}
}

// rangeHeadPrefix is the prefix of n rows, shaped as a scope's queue.
func rangeHeadPrefix(n int) string { return fmt.Sprintf("runqueue:%d:bench:", n) }

// fillRangePrefix writes n rows under p, their keys in rank order, with
// values the size of a queue entry's.
func fillRangePrefix(b *testing.B, s rangeStore, p string, n int) {
	b.Helper()
	value := fmt.Sprintf(`{"run":"bench","scopes":["bench"],"expires":%d,"tag":%d}`, int64(1)<<40, 7)
	for lo := 0; lo < n; lo += runlease.MaxMultiCAS {
		writes := make([]runlease.CASWrite, 0, runlease.MaxMultiCAS)
		for i := lo; i < min(lo+runlease.MaxMultiCAS, n); i++ {
			writes = append(writes, runlease.CASWrite{Key: fmt.Sprintf("%s%012d:run-%d", p, i, i), Value: value})
		}
		if _, err := s.MetaCASMany(context.Background(), writes); err != nil {
			b.Fatal(err)
		}
	}
}
