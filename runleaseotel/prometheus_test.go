package runleaseotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/runleaseotel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// scrape fetches the handler's page over HTTP, as Prometheus would.
func scrape(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// sample returns the value of the first sample of name whose labels match
// the regular expression labels, and whether there is one.
func sample(page, name, labels string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{[^}]*` + labels + `[^}]*\} (\S+)$`)
	m := re.FindStringSubmatch(page)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

func Test_a_Prometheus_scrape_shows_every_metric_after_real_lease_operations(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	require.NoError(t, err)
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	m, err := runleaseotel.NewMetrics(provider, runleaseotel.WithStore(store),
		runleaseotel.WithScopes(runlease.NamedScope("gpu", 2)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	server := httptest.NewServer(promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	t.Cleanup(server.Close)
	hooks := runlease.WithHooks(m.Hooks())

	// A kept run with a slot renews, then loses both to a contender
	// whose clock is past the TTL.
	own, renewed, lostCh, slotsLost := events()
	lease, err := runlease.Acquire(ctx, store, "run-a", "driver-a", runlease.WithTTL(5*time.Second),
		runlease.WithHooks(runleaseotel.Chain(m.Hooks(), own)))
	require.NoError(t, err)
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 2)}
	slots, err := lease.ClaimSlots(ctx, gpu)
	require.NoError(t, err)
	keeper, err := runlease.Keep(ctx, lease, runlease.KeepInterval(100*time.Millisecond), runlease.KeepSlots(slots))
	require.NoError(t, err)
	t.Cleanup(keeper.Stop)
	require.NoError(t, await(t, renewed, "renewal").Err)
	_, err = runlease.Acquire(ctx, store, "run-a", "driver-b", hooks)
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	_, err = runlease.ClaimSlots(ctx, store, "run-b", []runlease.Scope{runlease.NamedScope("gpu", 1)}, ahead(time.Minute), hooks)
	require.NoError(t, err) // takes run-a's slot 0
	await(t, slotsLost, "slot loss")
	_, err = runlease.Acquire(ctx, store, "run-a", "driver-b", ahead(time.Minute), hooks)
	require.NoError(t, err)
	await(t, lostCh, "loss")
	// run-c fills the scope with slot 1, which a host with limit 1 then
	// finds at or above its limit.
	_, err = runlease.ClaimSlots(ctx, store, "run-c", gpu, hooks)
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(ctx, store, "run-e", []runlease.Scope{runlease.NamedScope("gpu", 1)}, hooks)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)

	page := scrape(t, server.URL)
	for _, name := range []string{
		"runlease_lease_acquire_attempts_total",
		"runlease_lease_acquire_duration_seconds",
		"runlease_lease_renew_duration_seconds",
		"runlease_lease_renew_time_left_seconds",
		"runlease_lease_lost_total",
		"runlease_slot_lost_total",
		"runlease_slot_limit_mismatches_total",
		"runlease_lease_count",
		"runlease_slot_count",
		"runlease_slot_max",
	} {
		assert.Regexp(t, `(?m)^# TYPE `+name+` `, page, "the page lists %s", name)
	}
	for _, tc := range []struct {
		name, metric, labels string
		want                 float64
	}{
		{"acquired", "runlease_lease_acquire_attempts_total", `runlease_outcome="acquired"`, 2},
		{"refused", "runlease_lease_acquire_attempts_total", `runlease_outcome="refused"`, 1},
		{"taken over", "runlease_lease_lost_total", `runlease_loss_reason="taken_over"`, 1},
		{"slot taken", "runlease_slot_lost_total", `runlease_scope="gpu"`, 1},
		{"mismatch", "runlease_slot_limit_mismatches_total", `runlease_scope="gpu"`, 1},
		{"live leases", "runlease_lease_count", `runlease_lease_state="live"`, 1},
		{"slots held", "runlease_slot_count", `runlease_scope="gpu",runlease_slot_state="held"`, 2},
		{"limit", "runlease_slot_max", `runlease_scope="gpu"`, 2},
	} {
		v, ok := sample(page, tc.metric, tc.labels)
		if assert.True(t, ok, "%s: no %s{%s} in the page", tc.name, tc.metric, tc.labels) {
			assert.Equal(t, tc.want, v, tc.name)
		}
	}
}
