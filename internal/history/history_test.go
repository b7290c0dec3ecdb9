package history

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func byKey(iv Interval) string    { return iv.Key }
func byHolder(iv Interval) string { return iv.Holder }

func TestOverlaps(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		ivs     []Interval
		overlap int
	}{
		{"disjoint_tenures_of_one_key_are_fine", []Interval{
			{Key: "r", Holder: "a", Start: 10, End: 20},
			{Key: "r", Holder: "b", Start: 21, End: 30},
		}, 0},
		{"touching_tenures_are_not_an_overlap", []Interval{
			{Key: "r", Holder: "a", Start: 10, End: 20},
			{Key: "r", Holder: "b", Start: 20, End: 30},
		}, 0},
		{"tenures_of_different_keys_may_overlap", []Interval{
			{Key: "r1", Holder: "a", Start: 10, End: 20},
			{Key: "r2", Holder: "b", Start: 15, End: 30},
		}, 0},
		{"a_second_holder_inside_the_first_tenure_is_caught", []Interval{
			{Key: "r", Holder: "b", Start: 15, End: 16},
			{Key: "r", Holder: "a", Start: 10, End: 20},
		}, 1},
		{"an_overlap_hidden_behind_a_short_tenure_is_caught", []Interval{
			{Key: "r", Holder: "a", Start: 10, End: 100},
			{Key: "r", Holder: "b", Start: 20, End: 30},
			{Key: "r", Holder: "c", Start: 50, End: 60},
		}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Len(t, Overlaps(tt.ivs, byKey), tt.overlap)
		})
	}
}

func TestOverlapsGroupsByTheGivenFunction(t *testing.T) {
	t.Parallel()
	ivs := []Interval{
		{Key: "slot0", Holder: "run1", Start: 10, End: 20},
		{Key: "slot1", Holder: "run1", Start: 15, End: 30},
	}
	assert.Empty(t, Overlaps(ivs, byKey))
	assert.Len(t, Overlaps(ivs, byHolder), 1, "one run in two slots at once")
}

func TestFences(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		fences     []uint64 // in the order the tenures began
		contiguous bool
		problems   int
	}{
		{"fences_1_to_n_in_order_are_fine", []uint64{1, 2, 3}, true, 0},
		{"a_repeated_fence_is_caught", []uint64{1, 2, 2}, true, 2},
		{"a_fence_out_of_order_is_caught", []uint64{2, 1, 3}, false, 1},
		{"a_gap_is_caught_when_contiguous", []uint64{1, 3}, true, 1},
		{"a_gap_is_fine_otherwise", []uint64{1, 3}, false, 0},
		{"fences_must_start_at_1_when_contiguous", []uint64{2, 3}, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var ivs []Interval
			for i, f := range tt.fences {
				ivs = append(ivs, Interval{Key: "r", Fence: f, Start: int64(10 * i), End: int64(10*i + 5)})
			}
			assert.Len(t, Fences(ivs, tt.contiguous), tt.problems)
		})
	}
}

func TestPeak(t *testing.T) {
	t.Parallel()
	ivs := []Interval{
		{Key: "s0", Start: 0, End: 10},
		{Key: "s1", Start: 5, End: 15},
		{Key: "s2", Start: 10, End: 20}, // touches s0: not counted with it
		{Key: "s0", Start: 12, End: 13},
	}
	peak, at := Peak(ivs)
	require.Equal(t, 3, peak)
	assert.Equal(t, []Interval{ivs[1], ivs[2], ivs[3]}, at)

	peak, _ = Peak(nil)
	assert.Zero(t, peak)
}
