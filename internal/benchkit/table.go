package benchkit

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Row is one line of the results table: a scenario on a store at some
// goroutine count, summarised over several runs.
type Row struct {
	Scenario string
	Store    string
	G        int
	Runs     []Result
	// Latency marks a row whose ratio compares latencies (the baseline's
	// median over the library's), as for a handoff, not throughputs.
	Latency bool
}

// Summary is the median over runs of every figure of a Row, and the median
// of the per-run ratios (each run measures library and baseline together).
type Summary struct {
	Rate, BaseRate        float64
	P50, P99              time.Duration
	BaseP50, BaseP99      time.Duration
	TripsPerOp, BaseTrips float64
	Ratio                 float64
}

// Summarize returns the medians of r's runs.
func (r Row) Summarize() Summary {
	var s Summary
	pick := func(f func(Result) float64) float64 {
		v := make([]float64, len(r.Runs))
		for i, run := range r.Runs {
			v[i] = f(run)
		}
		return Median(v)
	}
	dur := func(f func(Result) time.Duration) time.Duration {
		return time.Duration(pick(func(x Result) float64 { return float64(f(x)) }))
	}
	s.Rate = pick(func(x Result) float64 { return x.Store.Rate })
	s.BaseRate = pick(func(x Result) float64 { return x.Base.Rate })
	s.P50 = dur(func(x Result) time.Duration { return x.Store.P50() })
	s.P99 = dur(func(x Result) time.Duration { return x.Store.P99() })
	s.BaseP50 = dur(func(x Result) time.Duration { return x.Base.P50() })
	s.BaseP99 = dur(func(x Result) time.Duration { return x.Base.P99() })
	s.TripsPerOp = pick(func(x Result) float64 { return x.Store.TripsPerOp() })
	s.BaseTrips = pick(func(x Result) float64 { return x.Base.TripsPerOp() })
	s.Ratio = pick(func(x Result) float64 {
		if r.Latency {
			if x.Store.P50() == 0 {
				return 0
			}
			return float64(x.Base.P50()) / float64(x.Store.P50())
		}
		return x.Ratio()
	})
	return s
}

// Median returns the median of v (the mean of the middle two when v has an
// even length), or 0 for none.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// WriteTable writes rows as one markdown table.
func WriteTable(w io.Writer, rows []Row) error {
	var b strings.Builder
	b.WriteString("| scenario | store | g | ops/s | p50 | p99 | round trips/op | baseline ops/s | baseline p50 | baseline p99 | ratio |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		s := r.Summarize()
		rate, baseRate, ratio := fmt.Sprintf("%.0f", s.Rate), fmt.Sprintf("%.0f", s.BaseRate), fmt.Sprintf("%.2f", s.Ratio)
		if r.Latency {
			rate, baseRate, ratio = "—", "—", ratio+" (p50)"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %.2f | %s | %s | %s | %s |\n",
			r.Scenario, r.Store, r.G, rate, FormatDuration(s.P50), FormatDuration(s.P99),
			s.TripsPerOp, baseRate, FormatDuration(s.BaseP50), FormatDuration(s.BaseP99), ratio)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// FormatDuration prints d with three significant digits, in µs below a
// millisecond and in ms above.
func FormatDuration(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	switch {
	case us < 10:
		return fmt.Sprintf("%.2f µs", us)
	case us < 100:
		return fmt.Sprintf("%.1f µs", us)
	case us < 1000:
		return fmt.Sprintf("%.0f µs", us)
	case us < 10000:
		return fmt.Sprintf("%.2f ms", us/1000)
	case us < 100000:
		return fmt.Sprintf("%.1f ms", us/1000)
	}
	return fmt.Sprintf("%.0f ms", us/1000)
}
