package storetest

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// testMultiCAS checks the optional [runlease.MultiCASer] capability, when
// the store has it: every write applied or not on its own, exactly as
// MetaCAS would.
func testMultiCAS(t *testing.T, newStore newStoreFunc) {
	with := withCapability[runlease.MultiCASer](newStore)
	t.Run("each_write_applies_on_its_own", with(testMultiCASEach))
	t.Run("bad_writes_are_refused_and_write_nothing", with(testMultiCASBadInput))
	t.Run("concurrent_writes_apply_once_per_expected_value", with(testMultiCASRace))
}

func testMultiCASEach(t *testing.T, s runlease.Store, m runlease.MultiCASer) {
	create(t, s, "a", "1")
	create(t, s, "b", "1")
	create(t, s, "present", "p")
	swapped, err := m.MetaCASMany(t.Context(), []runlease.CASWrite{
		{Key: "a", Expected: ptr("1"), Value: "2"},       // applies
		{Key: "b", Expected: ptr("0"), Value: "2"},       // wrong expected
		{Key: "new", Value: "n"},                         // absent: created
		{Key: "present", Value: "q"},                     // present: not created
		{Key: "missing", Expected: ptr("x"), Value: "y"}, // absent: nothing to swap
	})
	require.NoError(t, err)
	require.Equal(t, []bool{true, false, true, false, false}, swapped)
	requireValue(t, s, "a", "2")
	requireValue(t, s, "b", "1")
	requireValue(t, s, "new", "n")
	requireValue(t, s, "present", "p")
	requireAbsent(t, s, "missing")
	swapped, err = m.MetaCASMany(t.Context(), nil)
	require.NoError(t, err)
	require.Empty(t, swapped)
}

func testMultiCASBadInput(t *testing.T, s runlease.Store, m runlease.MultiCASer) {
	create(t, s, "k", "v")
	before := scan(t, s, "")
	too := make([]runlease.CASWrite, runlease.MaxMultiCAS+1)
	for i := range too {
		too[i] = runlease.CASWrite{Key: "m" + strconv.Itoa(i), Value: "x"}
	}
	for name, writes := range map[string][]runlease.CASWrite{
		"two_writes_one_key": {{Key: "a", Value: "1"}, {Key: "a", Value: "2"}},
		"nul_in_key":         {{Key: "a", Value: "1"}, {Key: "b\x00", Value: "1"}},
		"invalid_value":      {{Key: "a", Value: "1"}, {Key: "b", Value: "\xff"}},
		"too_many":           too,
	} {
		_, err := m.MetaCASMany(t.Context(), writes)
		require.ErrorIs(t, err, runlease.ErrInvalidArgument, name)
		require.Equal(t, before, scan(t, s, ""), "%s: nothing written", name)
	}
}

// testMultiCASRace has 8 writers increment 6 counters, half of them with
// MetaCASMany over every counter at once and half with MetaCAS: the final
// sum equals the number of increments reported applied.
func testMultiCASRace(t *testing.T, s runlease.Store, m runlease.MultiCASer) {
	const counters = 6
	var applied atomic.Int64
	sum := raceCounters(t, s, counters, 8, shortOr(12, 30), 11, func(ctx context.Context, w int, rng *rand.Rand, key func(int) string) error {
		return multiIncrement(ctx, s, m, rng, key, counters, w%2 == 0, &applied)
	})
	require.Equal(t, int(applied.Load()), sum)
}

func multiIncrement(ctx context.Context, s runlease.Store, m runlease.MultiCASer, rng *rand.Rand,
	key func(int) string, counters int, many bool, applied *atomic.Int64) error {
	if !many {
		i := rng.IntN(counters)
		v, _, err := s.MetaGet(ctx, key(i))
		if err != nil {
			return err
		}
		ok, err := s.MetaCAS(ctx, key(i), &v, incr(v))
		if ok {
			applied.Add(1)
		}
		return err
	}
	writes := make([]runlease.CASWrite, counters)
	for i := range counters {
		v, _, err := s.MetaGet(ctx, key(i))
		if err != nil {
			return err
		}
		writes[i] = runlease.CASWrite{Key: key(i), Expected: &v, Value: incr(v)}
	}
	swapped, err := m.MetaCASMany(ctx, writes)
	for _, ok := range swapped {
		if ok {
			applied.Add(1)
		}
	}
	return err
}
