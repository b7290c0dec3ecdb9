package storetest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// testTwoHandles checks two handles on one storage, as two processes or
// nodes have: what one writes, the other sees at once, in its reads and in
// the conditions of its writes, and their races have one winner. A store
// that caches rows per handle, or acknowledges a write before others can
// see it, fails here.
func testTwoHandles(t *testing.T, h Harness) {
	pair := func(writable bool, fn func(t *testing.T, a, b runlease.Store)) func(*testing.T) {
		return func(t *testing.T) {
			t.Parallel()
			if h.Reopen == nil {
				t.Skip("Harness.Reopen is not set: set it to check that handles on one storage see each other's writes")
			}
			if writable && h.ReopenReadOnly {
				t.Skip("Harness.ReopenReadOnly is set: the second handle cannot write")
			}
			a := h.New(t)
			require.NotNil(t, a, "Harness.New returned a nil Store")
			b := h.Reopen(t, a)
			require.NotNil(t, b, "Harness.Reopen returned a nil Store")
			fn(t, a, b)
		}
	}
	t.Run("a_write_through_one_handle_is_seen_at_once_by_reads_through_the_other", pair(false, func(t *testing.T, a, b runlease.Store) {
		requireSeen(t, a, b, "ab/")
		if !h.ReopenReadOnly {
			requireSeen(t, b, a, "ba/")
		}
	}))
	t.Run("a_write_through_one_handle_is_seen_at_once_by_conditions_through_the_other", pair(true, func(t *testing.T, a, b runlease.Store) {
		requireConditionsSee(t, a, b, "ab/")
		requireConditionsSee(t, b, a, "ba/")
	}))
	t.Run("racing_swaps_through_two_handles_have_exactly_one_winner", pair(true, testRacingHandles))
}

// requireSeen writes through w and reads through r after each write. r
// reads every key before it is written too, so that a cache of r's, filled
// by that read, would be caught serving it afterwards.
func requireSeen(t *testing.T, w, r runlease.Store, p string) {
	k := p + "k"
	requireAbsent(t, r, k)
	require.Empty(t, scan(t, r, p))
	create(t, w, k, "v1")
	requireValue(t, r, k, "v1")
	require.Equal(t, []runlease.Row{{Key: k, Value: "v1"}}, scan(t, r, p))
	require.True(t, cas(t, w, k, ptr("v1"), "v2"))
	requireValue(t, r, k, "v2")
	deleted, err := w.MetaDelete(t.Context(), k, "v2")
	require.NoError(t, err)
	require.True(t, deleted)
	requireAbsent(t, r, k)
	require.Empty(t, scan(t, r, p))
	if bw, ok := w.(runlease.Batcher); ok {
		requireAbsent(t, r, p+"b")
		require.True(t, batch(t, bw, []runlease.Cond{runlease.IfAbsent(k)}, runlease.Put(k, "v3"), runlease.Put(p+"b", "w")))
		requireValue(t, r, k, "v3")
		requireValue(t, r, p+"b", "w")
	}
	if mw, ok := w.(runlease.MultiCASer); ok {
		requireAbsent(t, r, p+"m")
		_, err := mw.MetaCASMany(t.Context(), []runlease.CASWrite{{Key: p + "m", Value: "m1"}})
		require.NoError(t, err)
		requireValue(t, r, p+"m", "m1")
	}
}

// requireConditionsSee writes through w and makes conditional writes
// through c that hold only if c sees w's writes, and others that hold only
// if it does not.
func requireConditionsSee(t *testing.T, w, c runlease.Store, p string) {
	k := p + "k"
	requireAbsent(t, c, k)
	create(t, w, k, "v1")
	require.False(t, cas(t, c, k, nil, "stale"), "a create through one handle of a key the other created")
	require.True(t, cas(t, c, k, ptr("v1"), "v2"), "a swap through one handle from the value the other wrote")
	requireValue(t, w, k, "v2")
	require.False(t, cas(t, w, k, ptr("v1"), "stale"), "a swap from the value the other handle replaced")
	require.True(t, cas(t, w, k, ptr("v2"), "v3"))
	deleted, err := c.MetaDelete(t.Context(), k, "v2")
	require.NoError(t, err)
	require.False(t, deleted, "a delete through one handle of the value the other replaced")
	deleted, err = c.MetaDelete(t.Context(), k, "v3")
	require.NoError(t, err)
	require.True(t, deleted, "a delete through one handle of the value the other wrote")
	requireAbsent(t, w, k)
	if bc, ok := c.(runlease.Batcher); ok {
		create(t, w, p+"c", "on")
		require.True(t, batch(t, bc, []runlease.Cond{runlease.IfEquals(p+"c", "on")}, runlease.Put(k, "b")),
			"a batch through one handle conditioned on the value the other wrote")
	}
}

// testRacingHandles races swaps from one value, half through each handle:
// exactly one wins, and both handles then read its value.
func testRacingHandles(t *testing.T, a, b runlease.Store) {
	handles := []runlease.Store{a, b}
	for round := range raceRounds() / 4 {
		key := fmt.Sprintf("race/handles/%04d", round)
		create(t, handles[round%2], key, "start")
		w := oneWinner(t, round, "swap over two handles", func(i int) (bool, error) {
			return handles[i%2].MetaCAS(t.Context(), key, ptr("start"), fmt.Sprintf("swapped by %d", i))
		})
		requireValue(t, a, key, fmt.Sprintf("swapped by %d", w))
		requireValue(t, b, key, fmt.Sprintf("swapped by %d", w))
	}
}
