package benchkit

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHistogram_quantiles_are_within_two_percent(t *testing.T) {
	t.Parallel()
	var h Histogram
	for i := 1; i <= 100_000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, tc := range []struct {
		name string
		q    float64
		want time.Duration
	}{
		{"median", 0.5, 50 * time.Millisecond},
		{"p99", 0.99, 99 * time.Millisecond},
		{"max", 1, 100 * time.Millisecond},
	} {
		got := h.Quantile(tc.q)
		assert.InEpsilon(t, float64(tc.want), float64(got), 0.02, tc.name)
	}
	assert.Equal(t, uint64(100_000), h.Count())
}

func TestHistogram_small_values_are_exact_and_merge_adds(t *testing.T) {
	t.Parallel()
	var a, b Histogram
	a.Record(3)
	b.Record(5)
	b.Record(-1) // counted as zero
	a.Merge(&b)
	assert.Equal(t, uint64(3), a.Count())
	assert.Equal(t, time.Duration(3), a.Quantile(0.5))
	assert.Equal(t, time.Duration(5), a.Max())
	assert.Zero(t, (&Histogram{}).Quantile(0.5))
}

func TestHistogram_every_bucket_round_trips(t *testing.T) {
	t.Parallel()
	for i := range histBuckets {
		v := histValue(i)
		if v < 0 {
			break // beyond int64
		}
		require.Equal(t, i, histIndex(v), "value %d", v)
	}
}

func TestTripCounter_counts_requests_not_writes(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer server.Close()
	var c TripCounter
	conn := c.Wrap(client)
	defer conn.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := server.Read(buf)
			if err != nil {
				return
			}
			if bytes.Contains(buf[:n], []byte("sync")) {
				_, _ = server.Write([]byte("reply"))
			}
		}
	}()
	request := func(parts ...string) {
		for _, p := range parts {
			_, err := conn.Write([]byte(p))
			require.NoError(t, err)
		}
		_, err := io.ReadFull(conn, make([]byte, len("reply")))
		require.NoError(t, err)
	}
	request("parse", "bind", "sync") // one request in three writes
	request("sync")
	assert.Equal(t, int64(2), c.Load())
}

func TestMedian_and_table(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 2.0, Median([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}))
	run := func(rate, base float64) Result {
		r := Result{Store: Phase{Ops: 10, Rate: rate, Trips: 10}, Base: Phase{Ops: 10, Rate: base, Trips: 10}}
		r.Store.Hist.Record(time.Millisecond)
		r.Base.Hist.Record(time.Millisecond)
		return r
	}
	row := Row{Scenario: "Lease.Renew", Store: "postgres", G: 4, Runs: []Result{run(90, 100), run(50, 100), run(95, 100)}}
	s := row.Summarize()
	assert.Equal(t, 90.0, s.Rate)
	assert.InDelta(t, 0.9, s.Ratio, 1e-9)
	var out strings.Builder
	require.NoError(t, WriteTable(&out, []Row{row}))
	assert.Contains(t, out.String(), "| Lease.Renew | postgres | 4 | 90 | 1.00 ms | 1.00 ms | 1.00 | 100 |")
}
