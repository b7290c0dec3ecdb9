package runleaseotel_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/runleaseotel"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// BenchmarkCollect measures one collection of the store gauges on a SQLite
// store of n live leases, each holding a slot of one of 50 scopes: the cost
// the README quotes for large tables.
func BenchmarkCollect(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			store, err := runlease.OpenSQLite(filepath.Join(b.TempDir(), "runs.db"))
			require.NoError(b, err)
			b.Cleanup(func() { _ = store.Close() })
			fill(b, store, n)
			reader := sdkmetric.NewManualReader()
			provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			b.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
			m, err := runleaseotel.NewMetrics(provider, runleaseotel.WithStore(store),
				runleaseotel.WithCollectTimeout(time.Minute))
			require.NoError(b, err)
			b.Cleanup(func() { _ = m.Close() })
			var rm metricdata.ResourceMetrics
			for b.Loop() {
				require.NoError(b, reader.Collect(b.Context(), &rm))
			}
		})
	}
}

// BenchmarkHooks measures the hook a Keeper calls after every renewal.
func BenchmarkHooks(b *testing.B) {
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	m, err := runleaseotel.NewMetrics(provider)
	require.NoError(b, err)
	renewed := m.Hooks().Renewed
	e := runlease.RenewEvent{RunID: "run-1", Fence: 1, Latency: time.Millisecond, TimeLeft: time.Minute}
	for b.Loop() {
		renewed(e)
	}
}

// fill writes n live lease rows and their slot rows in batches.
func fill(b *testing.B, store *runlease.SQLiteStore, n int) {
	b.Helper()
	until := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	var ops []runlease.Op
	flush := func() {
		ok, err := store.MetaBatch(b.Context(), nil, ops)
		require.NoError(b, err)
		require.True(b, ok)
		ops = ops[:0]
	}
	for i := range n {
		run := "run-" + strconv.Itoa(i)
		ops = append(ops,
			runlease.Put(runlease.LeasePrefix+run, `{"holder":"driver","fence":1,"until_ms":`+until+`}`),
			runlease.Put(fmt.Sprintf("%sscope-%d:%d", runlease.SlotPrefix, i%50, i/50), `{"holder":"`+run+`","fence":0,"until_ms":`+until+`}`))
		if len(ops)+2 > runlease.MaxBatch {
			flush()
		}
	}
	if len(ops) > 0 {
		flush()
	}
}
