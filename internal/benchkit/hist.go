// Package benchkit holds what runlease's benchmarks and its benchmark
// harness (internal/benchharness) share: the stores under test with a
// direct line to the same storage for baselines, round-trip counters, a
// latency histogram, the closed-loop runner, and the scenarios themselves,
// so that `go test -bench` and the harness measure exactly the same thing.
package benchkit

import (
	"math/bits"
	"time"
)

// Histogram records durations in log-linear buckets, as HdrHistogram does:
// exact below 128 ns, then 64 buckets per power of two, so a quantile is
// within 1.6% of the true value. Recording is a few instructions and never
// allocates. The zero value is ready to use; it is not safe for concurrent
// use (give each goroutine its own and Merge them).
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	max    int64
}

const (
	histSubBits = 6                  // 64 sub-buckets per power of two
	histLinear  = 2 << histSubBits   // values below this have a bucket each
	histBuckets = histLinear + 58*64 // enough for any int64
)

// Record adds one duration. Negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := max(int64(d), 0)
	h.counts[histIndex(v)]++
	h.n++
	h.max = max(h.max, v)
}

func histIndex(v int64) int {
	if v < histLinear {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - histSubBits - 1
	top := int(v >> shift) // in [64, 128)
	return histLinear + (shift-1)<<histSubBits + top - histLinear/2
}

// histValue returns the midpoint of bucket i.
func histValue(i int) int64 {
	if i < histLinear {
		return int64(i)
	}
	j := i - histLinear
	shift := j>>histSubBits + 1
	top := int64(j&(1<<histSubBits-1) + histLinear/2)
	return top<<shift + (int64(1)<<shift)/2
}

// Count returns how many durations were recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Max returns the longest duration recorded.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Merge adds every duration recorded in o.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// Quantile returns the duration at quantile q (0.5 for the median), or 0
// when nothing was recorded.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(histValue(i), h.max))
		}
	}
	return time.Duration(h.max)
}
