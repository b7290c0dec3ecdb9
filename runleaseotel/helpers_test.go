package runleaseotel_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/runleaseotel"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bench is a SQLite store in the test's directory, Metrics on an SDK
// provider, and the manual reader that collects them.
type bench struct {
	store   *runlease.SQLiteStore
	reader  *sdkmetric.ManualReader
	metrics *runleaseotel.Metrics
}

// newBench opens the store and makes Metrics reading it with opts.
func newBench(t *testing.T, opts ...runleaseotel.Option) *bench {
	t.Helper()
	store, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	m, err := runleaseotel.NewMetrics(provider, append([]runleaseotel.Option{runleaseotel.WithStore(store)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return &bench{store: store, reader: reader, metrics: m}
}

// hooks is the option that reports to the bench's metrics.
func (b *bench) hooks() runlease.Option { return runlease.WithHooks(b.metrics.Hooks()) }

// collect reads every metric now.
func (b *bench) collect(t *testing.T) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.reader.Collect(t.Context(), &rm))
	return collected{rm}
}

// collected is one collection, with lookups by name and attributes.
type collected struct{ rm metricdata.ResourceMetrics }

func collectedOf(rm metricdata.ResourceMetrics) collected { return collected{rm} }

// metric returns the metric named name, and whether it was collected.
func (c collected) metric(name string) (metricdata.Metrics, bool) {
	for _, sm := range c.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// has reports whether set holds every one of kvs.
func has(set attribute.Set, kvs []attribute.KeyValue) bool {
	for _, kv := range kvs {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// int64s sums the int64 points of the sum named name whose attributes hold
// every one of kvs, and counts them.
func (c collected) int64s(t *testing.T, name string, kvs ...attribute.KeyValue) (sum int64, points int) {
	t.Helper()
	m, ok := c.metric(name)
	require.True(t, ok, "metric %s was not collected", name)
	data, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "metric %s is a %T, not an int64 sum", name, m.Data)
	for _, dp := range data.DataPoints {
		if has(dp.Attributes, kvs) {
			sum += dp.Value
			points++
		}
	}
	return sum, points
}

// value is the sum of the int64 points named name with attributes kvs.
func (c collected) value(t *testing.T, name string, kvs ...attribute.KeyValue) int64 {
	t.Helper()
	v, _ := c.int64s(t, name, kvs...)
	return v
}

// histogram returns the one point of the float64 histogram named name
// whose attributes hold every one of kvs.
func (c collected) histogram(t *testing.T, name string, kvs ...attribute.KeyValue) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	m, ok := c.metric(name)
	require.True(t, ok, "metric %s was not collected", name)
	data, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "metric %s is a %T, not a float64 histogram", name, m.Data)
	var found []metricdata.HistogramDataPoint[float64]
	for _, dp := range data.DataPoints {
		if has(dp.Attributes, kvs) {
			found = append(found, dp)
		}
	}
	require.Len(t, found, 1, "points of %s with %v", name, kvs)
	return found[0]
}

// attributeKeys lists every attribute key on every point of every metric.
func (c collected) attributeKeys() map[attribute.Key]bool {
	keys := map[attribute.Key]bool{}
	add := func(set attribute.Set) {
		for _, kv := range set.ToSlice() {
			keys[kv.Key] = true
		}
	}
	for _, sm := range c.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					add(dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					add(dp.Attributes)
				}
			}
		}
	}
	return keys
}

// ahead is a clock that runs d ahead of this host's: a contender judging
// expiry by it sees leases and slots expire d early, which lets a test take
// over a live holder's run without waiting out the TTL.
func ahead(d time.Duration) runlease.Option {
	return runlease.WithClock(func() time.Time { return time.Now().Add(d) })
}

// events returns hooks that send each event to the returned channels, so a
// test waits for the library's own report rather than for time to pass.
func events() (runlease.Hooks, chan runlease.RenewEvent, chan runlease.LossEvent, chan runlease.SlotLossEvent) {
	renewed := make(chan runlease.RenewEvent, 1000)
	lost := make(chan runlease.LossEvent, 10)
	slotsLost := make(chan runlease.SlotLossEvent, 10)
	return runlease.Hooks{
		Renewed:   func(e runlease.RenewEvent) { renewed <- e },
		Lost:      func(e runlease.LossEvent) { lost <- e },
		SlotsLost: func(e runlease.SlotLossEvent) { slotsLost <- e },
	}, renewed, lost, slotsLost
}

// await returns the next value from ch, failing the test after 20s: the
// keepers here renew every 100ms.
func await[E any](t *testing.T, ch <-chan E, what string) E {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s within 20s", what)
		panic("unreachable")
	}
}

// rmOf wraps one metric as a collection of its own.
func rmOf(m metricdata.Metrics) metricdata.ResourceMetrics {
	return metricdata.ResourceMetrics{ScopeMetrics: []metricdata.ScopeMetrics{{Metrics: []metricdata.Metrics{m}}}}
}
