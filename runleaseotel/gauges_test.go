package runleaseotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/runleaseotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

const (
	leaseCount = "runlease.lease.count"
	slotCount  = "runlease.slot.count"
	slotMax    = "runlease.slot.max"
	slotLost   = "runlease.slot.lost"
	mismatches = "runlease.slot.limit_mismatches"
)

func state(s string) attribute.KeyValue { return runleaseotel.LeaseStateKey.String(s) }
func scope(s string) attribute.KeyValue { return runleaseotel.ScopeKey.String(s) }

var held = runleaseotel.SlotStateKey.String("held")

func Test_leases_are_counted_by_state_at_collection_time(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := t.Context()
	live, err := runlease.Acquire(ctx, b.store, "run-live", "driver-a")
	require.NoError(t, err)
	_, err = runlease.Acquire(ctx, b.store, "run-old", "driver-a", runlease.WithTTL(5*time.Second),
		runlease.WithClock(func() time.Time { return time.Now().Add(-time.Hour) }))
	require.NoError(t, err)
	done, err := runlease.Acquire(ctx, b.store, "run-done", "driver-a")
	require.NoError(t, err)
	require.NoError(t, done.Release(ctx))
	ok, err := b.store.MetaCAS(ctx, runlease.LeasePrefix+"run-broken", nil, "{")
	require.NoError(t, err)
	require.True(t, ok)

	c := b.collect(t)
	for _, s := range []string{"live", "expired", "released", "corrupt"} {
		assert.EqualValues(t, 1, c.value(t, leaseCount, state(s)), s)
	}

	require.NoError(t, live.Release(ctx))
	c = b.collect(t)
	assert.EqualValues(t, 0, c.value(t, leaseCount, state("live")), "a state with no lease reads 0, not absent")
	assert.EqualValues(t, 2, c.value(t, leaseCount, state("released")))
}

func Test_slot_use_limit_refusals_and_mismatches_are_reported_per_scope(t *testing.T) {
	t.Parallel()
	b := newBench(t, runleaseotel.WithScopes(runlease.NamedScope("gpu", 2), runlease.NamedScope("idle", 4)))
	ctx := t.Context()
	claim := func(run string, limit int) error {
		lease, err := runlease.Acquire(ctx, b.store, run, "driver-a", b.hooks())
		require.NoError(t, err)
		_, err = lease.ClaimSlots(ctx, []runlease.Scope{runlease.NamedScope("gpu", limit)})
		return err
	}
	require.NoError(t, claim("run-a", 2))
	require.NoError(t, claim("run-b", 2))
	c := b.collect(t)
	assert.EqualValues(t, 2, c.value(t, slotCount, scope("gpu"), held))
	assert.EqualValues(t, 2, c.value(t, slotMax, scope("gpu")))
	assert.EqualValues(t, 0, c.value(t, slotCount, scope("idle"), held), "a scope passed to WithScopes reads 0 while empty")
	assert.EqualValues(t, 4, c.value(t, slotMax, scope("idle")))
	_, found := c.metric(mismatches)
	assert.False(t, found, "no mismatch yet")

	require.ErrorIs(t, claim("run-c", 2), runlease.ErrConcurrencyLimit)
	// A host with a lower limit finds run-b's slot 1 at or above it.
	require.ErrorIs(t, claim("run-d", 1), runlease.ErrConcurrencyLimit)
	c = b.collect(t)
	assert.EqualValues(t, 1, c.value(t, mismatches, scope("gpu")))
	assert.EqualValues(t, 2, c.value(t, slotCount, scope("gpu"), held), "refused claims hold nothing")
}

func Test_a_kept_slot_taken_by_another_run_is_counted_as_lost(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := t.Context()
	own, _, _, slotsLost := events()
	lease, err := runlease.Acquire(ctx, b.store, "run-a", "driver-a", runlease.WithTTL(5*time.Second),
		runlease.WithHooks(runleaseotel.Chain(b.metrics.Hooks(), own)))
	require.NoError(t, err)
	cpu := []runlease.Scope{runlease.NamedScope("cpu", 1)}
	slots, err := lease.ClaimSlots(ctx, cpu)
	require.NoError(t, err)
	keeper, err := runlease.Keep(ctx, lease, runlease.KeepInterval(100*time.Millisecond), runlease.KeepSlots(slots))
	require.NoError(t, err)
	t.Cleanup(keeper.Stop)
	// A claimant whose clock is past the TTL sees the slot expired.
	_, err = runlease.ClaimSlots(ctx, b.store, "run-b", cpu, ahead(time.Minute), b.hooks())
	require.NoError(t, err)
	require.ErrorIs(t, await(t, slotsLost, "slot loss").Err, runlease.ErrTakenOver)

	c := b.collect(t)
	assert.EqualValues(t, 1, c.value(t, slotLost, scope("cpu"), runleaseotel.ReasonKey.String("taken_over")))
	assert.EqualValues(t, 1, c.value(t, slotCount, scope("cpu"), held), "run-b holds it now")
}

func Test_scopes_beyond_the_maximum_are_reported_as_other(t *testing.T) {
	t.Parallel()
	b := newBench(t, runleaseotel.WithMaxScopes(2))
	for _, name := range []string{"s1", "s2", "s3", "s4"} {
		_, err := runlease.ClaimSlots(t.Context(), b.store, "run-"+name, []runlease.Scope{runlease.NamedScope(name, 1)})
		require.NoError(t, err)
	}
	c := b.collect(t)
	assert.EqualValues(t, 1, c.value(t, slotCount, scope("s1"), held))
	assert.EqualValues(t, 1, c.value(t, slotCount, scope("s2"), held))
	assert.EqualValues(t, 2, c.value(t, slotCount, scope("_OTHER"), held))
	_, points := c.int64s(t, slotCount)
	assert.Equal(t, 6, points, "three scope values, held and corrupt")
}

func Test_a_scan_younger_than_the_min_interval_is_reused(t *testing.T) {
	t.Parallel()
	b := newBench(t, runleaseotel.WithMinScanInterval(time.Hour))
	_, err := runlease.Acquire(t.Context(), b.store, "run-1", "driver-a")
	require.NoError(t, err)
	assert.EqualValues(t, 1, b.collect(t).value(t, leaseCount, state("live")))
	_, err = runlease.Acquire(t.Context(), b.store, "run-2", "driver-a")
	require.NoError(t, err)
	assert.EqualValues(t, 1, b.collect(t).value(t, leaseCount, state("live")), "the store was not read again")
}

// stalledStore answers no scan before the caller's context ends (or the
// test gives up and closes unstall): a store that hangs, which a real
// SQLite file cannot be made to do.
type stalledStore struct {
	runlease.Store
	unstall chan struct{}
}

func (s stalledStore) MetaScan(ctx context.Context, _ string) ([]runlease.Row, error) {
	select {
	case <-ctx.Done():
		return nil, &runlease.StorageError{Op: "MetaScan", Err: ctx.Err()}
	case <-s.unstall:
		return nil, errors.New("the test gave up waiting")
	}
}

func Test_a_collection_gives_up_on_the_store_after_its_timeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		store func(b *bench, unstall chan struct{}) runlease.Store
		want  error
	}{
		{"a store that hangs", func(b *bench, unstall chan struct{}) runlease.Store {
			return stalledStore{b.store, unstall}
		}, context.DeadlineExceeded},
		{"a closed store", func(b *bench, _ chan struct{}) runlease.Store {
			_ = b.store.Close()
			return b.store
		}, runlease.ErrStoreClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			reader := sdkmetric.NewManualReader()
			provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
			unstall := make(chan struct{})
			m, err := runleaseotel.NewMetrics(provider, runleaseotel.WithStore(tc.store(b, unstall)),
				runleaseotel.WithCollectTimeout(50*time.Millisecond))
			require.NoError(t, err)
			t.Cleanup(func() { _ = m.Close() })
			m.Hooks().Acquired(runlease.AcquireEvent{RunID: "run-1", Latency: time.Millisecond})

			var rm metricdata.ResourceMetrics
			collected := make(chan error, 1)
			go func() { collected <- reader.Collect(context.Background(), &rm) }()
			select {
			case err = <-collected:
			case <-time.After(20 * time.Second):
				close(unstall) // so that the cleanups, which wait for the collection, can run
				t.Fatal("the collection waited for the store, not for its timeout")
			}
			require.ErrorIs(t, err, tc.want)
			c := collectedOf(rm)
			_, found := c.metric(leaseCount)
			assert.False(t, found, "no gauge from a failed scan")
			assert.EqualValues(t, 1, c.value(t, attempts, acquired), "the other metrics are still collected")
		})
	}
}

func Test_after_Close_the_store_is_not_read(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	_, err := runlease.Acquire(t.Context(), b.store, "run-1", "driver-a")
	require.NoError(t, err)
	require.NoError(t, b.metrics.Close())
	require.NoError(t, b.metrics.Close(), "closing twice does nothing")
	require.NoError(t, b.store.Close()) // a scan would now fail
	_, found := b.collect(t).metric(leaseCount)
	assert.False(t, found)
}

func Test_NewMetrics_refuses_invalid_arguments(t *testing.T) {
	t.Parallel()
	provider := sdkmetric.NewMeterProvider()
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	for _, tc := range []struct {
		name     string
		provider *sdkmetric.MeterProvider
		opt      runleaseotel.Option
	}{
		{"nil provider", nil, nil},
		{"zero timeout", provider, runleaseotel.WithCollectTimeout(0)},
		{"negative scan interval", provider, runleaseotel.WithMinScanInterval(-time.Second)},
		{"no scopes", provider, runleaseotel.WithMaxScopes(0)},
		{"zero scope", provider, runleaseotel.WithScopes(runlease.Scope{})},
		{"zero limit", provider, runleaseotel.WithScopes(runlease.NamedScope("gpu", 0))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.provider == nil {
				_, err = runleaseotel.NewMetrics(nil)
			} else {
				_, err = runleaseotel.NewMetrics(tc.provider, tc.opt)
			}
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			assert.True(t, errors.Is(err, runlease.ErrInvalidArgument) && runlease.Code(err) == runlease.CodeInvalidArgument)
		})
	}
}
