package runlease

// BenchmarkSQLiteRenewParallel measures Lease.Renew on the embedded store
// with group commit, against the same store committing one transaction per
// call, in the same run: the two take turns in slices of 200 renewals so
// that a noisy machine weighs on both alike. g goroutines each renew a lease
// of their own in a closed loop. It reports ops/s and p50-us for group
// commit, base-ops/s and base-p50-us for one transaction per call, and
// ratio (ops/s over base-ops/s), and writes/commit, the mean number of
// renewals a group commit carried.
//
//	go test -run '^$' -bench SQLiteRenewParallel -benchtime 4000x -count 3 .

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func BenchmarkSQLiteRenewParallel(b *testing.B) {
	for _, g := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			grouped := newRenewBench(b, "grouped.db", false, g)
			base := newRenewBench(b, "base.db", true, g)
			const slice = 200
			b.ResetTimer()
			for done := 0; done < b.N; done += slice {
				n := min(slice, b.N-done)
				// Alternate which goes first, so that neither always
				// follows the other's writes.
				first, second := grouped, base
				if done/slice%2 == 1 {
					first, second = base, grouped
				}
				first.run(b, n)
				second.run(b, n)
			}
			b.StopTimer()
			b.ReportMetric(grouped.rate(), "ops/s")
			b.ReportMetric(grouped.p50(), "p50-us")
			b.ReportMetric(base.rate(), "base-ops/s")
			b.ReportMetric(base.p50(), "base-p50-us")
			b.ReportMetric(grouped.rate()/base.rate(), "ratio")
			if c := grouped.commits.Load(); c > 0 {
				b.ReportMetric(float64(grouped.grouped.Load())/float64(c), "writes/commit")
			}
		})
	}
}

// renewBench is one store and the leases its goroutines renew.
type renewBench struct {
	leases  []*Lease
	elapsed time.Duration
	ops     int
	lat     []time.Duration

	commits, grouped atomic.Int64 // groups run, and the writes they carried
}

func newRenewBench(b *testing.B, name string, oneTxPerCall bool, g int) *renewBench {
	b.Helper()
	s, err := OpenSQLite(filepath.Join(b.TempDir(), name))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	s.oneTxPerCall = oneTxPerCall
	r := &renewBench{}
	s.hooks = &sqliteHooks{committed: func(n int) {
		r.commits.Add(1)
		r.grouped.Add(int64(n))
	}}
	for i := range g {
		l, err := Acquire(b.Context(), s, fmt.Sprintf("run-%d", i), "bench")
		if err != nil {
			b.Fatal(err)
		}
		r.leases = append(r.leases, l)
	}
	return r
}

// run makes n renewals, shared out among the goroutines.
func (r *renewBench) run(b *testing.B, n int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	lats := make([][]time.Duration, len(r.leases))
	began := time.Now()
	for i, l := range r.leases {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				if err := l.Renew(b.Context()); err != nil {
					b.Error(err)
					return
				}
				lats[i] = append(lats[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	r.elapsed += time.Since(began)
	r.ops += n
	for _, l := range lats {
		r.lat = append(r.lat, l...)
	}
}

func (r *renewBench) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

func (r *renewBench) p50() float64 {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	return float64(r.lat[len(r.lat)/2]) / float64(time.Microsecond)
}
