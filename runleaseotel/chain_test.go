package runleaseotel_test

import (
	"testing"

	"github.com/areev/runlease"
	"github.com/areev/runlease/runleaseotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func Test_Chain_calls_every_hook_in_order_and_leaves_unset_fields_nil(t *testing.T) {
	t.Parallel()
	var calls []string
	first := runlease.Hooks{
		Acquired: func(runlease.AcquireEvent) { calls = append(calls, "first acquired") },
		Lost:     func(runlease.LossEvent) { calls = append(calls, "first lost") },
	}
	second := runlease.Hooks{
		Acquired: func(runlease.AcquireEvent) { calls = append(calls, "second acquired") },
	}
	h := runleaseotel.Chain(first, runlease.Hooks{}, second)
	require.NotNil(t, h.Acquired)
	h.Acquired(runlease.AcquireEvent{})
	h.Lost(runlease.LossEvent{})
	assert.Equal(t, []string{"first acquired", "second acquired", "first lost"}, calls)
	assert.Nil(t, h.Renewed)
	assert.Nil(t, h.SlotsLost)
	assert.Nil(t, h.LimitMismatch)
}

func Test_metrics_and_own_hooks_both_see_a_real_acquisition(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	var seen []runlease.AcquireEvent
	own := runlease.Hooks{Acquired: func(e runlease.AcquireEvent) { seen = append(seen, e) }}
	_, err := runlease.Acquire(t.Context(), b.store, "run-1", "driver-a",
		runlease.WithHooks(runleaseotel.Chain(b.metrics.Hooks(), own)))
	require.NoError(t, err)
	require.Len(t, seen, 1)
	assert.EqualValues(t, 1, seen[0].Fence)
	assert.EqualValues(t, 1, b.collect(t).value(t, attempts, acquired))
}
