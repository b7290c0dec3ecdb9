package runleaseotel_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/areev/runlease"
	"github.com/areev/runlease/runleaseotel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Expose runlease's metrics on a Prometheus endpoint through OpenTelemetry's
// Prometheus exporter. A program that already has a MeterProvider passes it
// to NewMetrics instead.
func ExampleNewMetrics_prometheus() {
	dir, err := os.MkdirTemp("", "runleaseotel-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := runlease.OpenSQLite(filepath.Join(dir, "runs.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		log.Fatal(err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer provider.Shutdown(context.Background())
	metrics, err := runleaseotel.NewMetrics(provider,
		runleaseotel.WithStore(store), runleaseotel.WithScopes(runlease.MemScope(8)))
	if err != nil {
		log.Fatal(err)
	}
	defer metrics.Close()

	ctx := context.Background()
	hooks := runlease.WithHooks(metrics.Hooks())
	if _, err := runlease.Acquire(ctx, store, "run-42", "billing-1", hooks); err != nil {
		log.Fatal(err)
	}
	if _, err := runlease.Acquire(ctx, store, "run-42", "billing-2", hooks); err == nil {
		log.Fatal("a second holder acquired a live lease")
	}

	// Mount the handler on the program's admin server; httptest stands in
	// for it here.
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	server := httptest.NewServer(mux)
	defer server.Close()
	resp, err := http.Get(server.URL + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if name, ok := strings.CutPrefix(lines.Text(), "# TYPE runlease_"); ok {
			fmt.Println("runlease_" + name)
		}
	}
	// Output:
	// runlease_lease_acquire_attempts_total counter
	// runlease_lease_acquire_duration_seconds histogram
	// runlease_lease_count gauge
	// runlease_slot_count gauge
	// runlease_slot_max gauge
}
