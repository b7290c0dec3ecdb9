package chaos

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func admit(run string, t0, t1, trust int64, gen int, keys ...string) Event {
	return Event{Kind: KindAdmit, Run: run, T0: t0, T1: t1, Trust: trust, Gen: gen, Keys: keys}
}

func TestQueueBeliefsAndCheckQueueCap(t *testing.T) {
	t.Parallel()
	limits := map[string]int{"gpu": 4, "db": 2}

	t.Run("a_weighted_claim_holds_several_slots_of_a_scope_and_that_is_fine", func(t *testing.T) {
		t.Parallel()
		events := []Event{
			admit("a", 0, 10, 100, 0, "runslot:gpu:0", "runslot:gpu:1"),
			admit("b", 0, 12, 100, 0, "runslot:gpu:2", "runslot:db:0"),
			{Kind: KindEnd, Run: "a", T0: 50, Trust: 100},
			{Kind: KindEnd, Run: "b", T0: 60, Trust: 100},
			admit("c", 20, 55, 200, 0, "runslot:gpu:0", "runslot:gpu:1"), // after a's end
		}
		beliefs, problems := QueueBeliefs(append(events, Event{Kind: KindEnd, Run: "c", T0: 90, Trust: 200}), nil)
		require.Empty(t, problems)
		require.Len(t, beliefs, 6)
		peaks, out := CheckQueueCap(beliefs, limits)
		assert.Empty(t, out)
		assert.Equal(t, map[string]int{"gpu": 3, "db": 1}, peaks)
	})

	t.Run("two_runs_in_one_slot_are_caught", func(t *testing.T) {
		t.Parallel()
		beliefs, _ := QueueBeliefs([]Event{
			admit("a", 0, 10, 100, 0, "runslot:gpu:0"),
			admit("b", 0, 20, 100, 1, "runslot:gpu:0"),
			{Kind: KindEnd, Run: "a", T0: 50, Trust: 100},
			{Kind: KindEnd, Run: "b", T0: 60, Trust: 100},
		}, nil)
		_, out := CheckQueueCap(beliefs, limits)
		require.Len(t, out, 1)
		assert.Contains(t, out[0], "two competitors in one slot")
	})

	t.Run("more_units_than_the_limit_are_caught_even_in_distinct_slots", func(t *testing.T) {
		t.Parallel()
		beliefs, _ := QueueBeliefs([]Event{
			admit("a", 0, 10, 100, 0, "runslot:db:0", "runslot:db:1"),
			admit("b", 0, 20, 100, 1, "runslot:db:2"), // a host with a higher limit wrote slot 2
			{Kind: KindEnd, Run: "a", T0: 50, Trust: 100},
			{Kind: KindEnd, Run: "b", T0: 60, Trust: 100},
		}, nil)
		peaks, out := CheckQueueCap(beliefs, limits)
		require.Len(t, out, 1)
		assert.Contains(t, out[0], `3 units of scope "db"`)
		assert.Equal(t, 3, peaks["db"])
	})

	t.Run("a_belief_ends_at_the_trust_window_and_a_paused_holder_overlaps_nobody", func(t *testing.T) {
		t.Parallel()
		// a was paused from 30 to 200: it "feels" it held the slot until
		// 200, but its keeper's trust ended at 40, before b was admitted.
		beliefs, problems := QueueBeliefs([]Event{
			admit("a", 0, 10, 40, 0, "runslot:db:0"),
			admit("b", 0, 100, 300, 1, "runslot:db:0"),
			{Kind: KindEnd, Run: "a", T0: 200, Trust: 40},
			{Kind: KindEnd, Run: "b", T0: 250, Trust: 300},
		}, nil)
		require.Empty(t, problems)
		_, out := CheckQueueCap(beliefs, limits)
		assert.Empty(t, out)
	})

	t.Run("a_killed_holder_believes_until_the_kill_or_its_admission_trust", func(t *testing.T) {
		t.Parallel()
		beliefs, problems := QueueBeliefs([]Event{
			admit("a", 0, 10, 80, 3, "runslot:db:0"),
			admit("b", 0, 90, 300, 1, "runslot:db:0"),
			{Kind: KindEnd, Run: "b", T0: 250, Trust: 300},
		}, map[int]int64{3: 500})
		require.Empty(t, problems)
		require.Len(t, beliefs, 2)
		assert.EqualValues(t, 80, beliefs[0].End)
		_, out := CheckQueueCap(beliefs, limits)
		assert.Empty(t, out)
	})

	t.Run("histories_that_do_not_add_up_are_reported", func(t *testing.T) {
		t.Parallel()
		_, problems := QueueBeliefs([]Event{
			admit("a", 0, 10, 80, 0, "runslot:db:0"),
			admit("a", 0, 20, 80, 0, "runslot:db:1"),
			{Kind: KindEnd, Run: "z", T0: 30},
		}, nil)
		assert.Len(t, problems, 3, "admitted twice, an end with no admission, and one never ended")
	})
}

func entry(scope, run, waiter, principal string, tag int64) QueueEntry {
	return QueueEntry{Scope: scope, Run: run, Waiter: waiter, Principal: principal, Units: 1, Tag: tag}
}

func TestCheckQueueOrder(t *testing.T) {
	t.Parallel()
	waits := []Event{
		{Kind: KindWait, Run: "y", T0: 5, Principal: "p"},
		{Kind: KindWait, Run: "x", T0: 30, Principal: "p"},
	}
	y, x := entry("gpu", "y", "wy", "p", 100), entry("gpu", "x", "wx", "p", 200)
	snaps := []QueueSnap{
		{Start: 10, At: 20, Entries: []QueueEntry{y}},
		{Start: 40, At: 50, Entries: []QueueEntry{y, x}},
	}

	t.Run("a_later_waiter_behind_an_earlier_one_is_fine", func(t *testing.T) {
		t.Parallel()
		checked, out := CheckQueueOrder(snaps, waits)
		assert.Equal(t, 1, checked)
		assert.Empty(t, out)
	})

	t.Run("a_later_waiter_ranked_ahead_is_caught", func(t *testing.T) {
		t.Parallel()
		bad := entry("gpu", "x", "wx", "p", 50)
		checked, out := CheckQueueOrder([]QueueSnap{snaps[0], {Start: 40, At: 50, Entries: []QueueEntry{y, bad}}}, waits)
		assert.Equal(t, 1, checked)
		require.Len(t, out, 1)
		assert.Contains(t, out[0], "ranks ahead of it")
	})

	t.Run("pairs_the_check_cannot_judge_are_skipped", func(t *testing.T) {
		t.Parallel()
		bad := entry("gpu", "x", "wx", "p", 50)
		tests := map[string]struct {
			snaps  []QueueSnap
			events []Event
		}{
			"y_first_seen_after_x_began": {[]QueueSnap{{Start: 40, At: 50, Entries: []QueueEntry{y, bad}}}, waits},
			"y_requeued":                 {[]QueueSnap{snaps[0], {Start: 40, At: 50, Entries: []QueueEntry{y, bad}}}, append(waits, Event{Kind: KindRequeue, Run: "y", T0: 25})},
			"x_requeued":                 {[]QueueSnap{snaps[0], {Start: 40, At: 50, Entries: []QueueEntry{y, bad}}}, append(waits, Event{Kind: KindRequeue, Run: "x", T0: 35})},
			"another_principal": {[]QueueSnap{snaps[0], {Start: 40, At: 50, Entries: []QueueEntry{y, entry("gpu", "x", "wx", "q", 50)}}},
				waits},
			"another_scope": {[]QueueSnap{snaps[0], {Start: 40, At: 50, Entries: []QueueEntry{y, entry("db", "x", "wx", "p", 50)}}},
				waits},
		}
		for name, tt := range tests {
			checked, out := CheckQueueOrder(tt.snaps, tt.events)
			assert.Zero(t, checked, name)
			assert.Empty(t, out, name)
		}
	})
}

func TestQueueMeasure(t *testing.T) {
	t.Parallel()
	events := []Event{
		{Kind: KindWait, Run: "a", T0: 0, Principal: "p"},
		{Kind: KindWait, Run: "b", T0: 1, Principal: "q"},
		{Kind: KindWait, Run: "c", T0: 2, Principal: "p"},
		{Kind: KindRelease, Run: "z", T0: 100, Keys: []string{"runslot:gpu:0"}},
		admit("c", 2, 110, 500, 0, "runslot:gpu:0"), // overtook a, ranked ahead
		admit("a", 0, 150, 500, 0, "runslot:gpu:1"),
		{Kind: KindRequeue, Run: "b", T0: 120},
		admit("b", 1, 200, 500, 0, "runslot:db:0"),
	}
	snaps := []QueueSnap{{Start: 50, At: 60, Entries: []QueueEntry{
		entry("gpu", "a", "wa", "p", 0), entry("db", "b", "wb", "q", 0), entry("gpu", "c", "wc", "p", 100),
		entry("gpu", "d", "wd", "q", 100)}}}
	st := QueueMeasure(snaps, events, []string{"p", "q"}, nil, 0)
	assert.Equal(t, 3, st.Admissions)
	assert.Equal(t, []time.Duration{108, 150}, st.Waits, "b was requeued")
	assert.Equal(t, []time.Duration{10}, st.Released)
	assert.Equal(t, 1, st.Inversions)
	// In gpu both principals waited; in db only q did.
	assert.Equal(t, map[string]map[string]int{"gpu": {"p": 2}}, st.Units)

	// d, q's only waiter in gpu, is in a process paused shortly before the
	// scan (or killed before it): q was not able to take gpu units then, so
	// the admissions are not counted as shares.
	for _, f := range []Fault{
		{Kind: FaultPause, Gen: 7, T0: 10, T1: 40},
		{Kind: FaultPause, Gen: 7, T0: 55}, // not resumed yet
		{Kind: FaultKill, Gen: 7, T0: 30, T1: 35},
	} {
		events := append(slices.Clone(events), Event{Kind: KindWait, Run: "d", Gen: 7, T0: 3, Principal: "q"})
		st := QueueMeasure(snaps, events, []string{"p", "q"}, []Fault{f}, 30)
		assert.Empty(t, st.Units, "fault %+v", f)
	}
	// A pause that ended a stall window before the scan no longer counts.
	events = append(events, Event{Kind: KindWait, Run: "d", Gen: 7, T0: 3, Principal: "q"})
	st = QueueMeasure(snaps, events, []string{"p", "q"}, []Fault{{Kind: FaultPause, Gen: 7, T0: 10, T1: 20}}, 30)
	assert.Equal(t, map[string]map[string]int{"gpu": {"p": 2}}, st.Units)
}

func TestUnexplainedRequeues(t *testing.T) {
	t.Parallel()
	faults := []Fault{{Kind: FaultPause, Gen: 1, T0: 100, T1: 200}, {Kind: FaultKill, Gen: 2, T0: 100, T1: 200}}
	events := []Event{
		{Kind: KindRequeue, Run: "a", Gen: 1, T0: 210},    // right after its process resumed
		{Kind: KindRequeue, Run: "b", Gen: 1, T0: 900},    // long after
		{Kind: KindRequeue, Run: "c", Gen: 3, T0: 210},    // another process
		{Kind: KindRequeue, Run: "d", Gen: 1, T0: 150},    // during the pause: impossible, not explained
		{Kind: KindAdmit, Run: "e", Gen: 3, T0: 0, T1: 5}, // not a requeue
	}
	out := UnexplainedRequeues(events, faults, 100)
	require.Len(t, out, 3)
	assert.Contains(t, out[0], "run b")
	assert.Contains(t, out[1], "run c")
	assert.Contains(t, out[2], "run d")
}
