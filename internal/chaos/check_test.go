package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/history"
)

// These tests feed hand-made histories to the checks, so that each check is
// shown, on every run, to report the violation it exists for, and to stay
// quiet on the timings that are legal but look odd (a driver paused between
// the store's write and its clock reading).

// tenure is a tenure of run "r".
func tenure(fence uint64, gen int, call, grant, end, stop int64) Tenure {
	return Tenure{Run: "r", Holder: "h" + string(rune('0'+fence)), Fence: fence, Gen: gen,
		Call: call, Grant: grant, End: end, Stop: stop}
}

func TestCheckFences(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		tenures  []Tenure
		problems int
	}{
		{"fences_granted_in_order_are_fine", []Tenure{
			tenure(1, 0, 0, 10, 20, 20), tenure(2, 1, 5, 30, 40, 40)}, 0},
		{"a_driver_paused_after_the_write_records_a_late_grant_and_that_is_fine", []Tenure{
			tenure(1, 0, 0, 100, 20, 100), tenure(2, 1, 50, 60, 70, 70)}, 0},
		{"a_fence_granted_twice_is_caught", []Tenure{
			tenure(1, 0, 0, 10, 20, 20), {Run: "r", Holder: "x", Fence: 1, Call: 30, Grant: 40}}, 1},
		{"a_higher_fence_granted_before_a_lower_one_was_asked_for_is_caught", []Tenure{
			tenure(2, 0, 0, 10, 20, 20), tenure(1, 1, 30, 40, 50, 50)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Len(t, CheckFences(tt.tenures), tt.problems)
		})
	}
}

func TestCheckTrust(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		tenures  []Tenure
		problems int
	}{
		{"a_successor_granted_after_the_window_is_fine", []Tenure{
			tenure(1, 0, 0, 10, 20, 20), tenure(2, 1, 5, 25, 40, 40)}, 0},
		{"a_successor_granted_inside_the_window_is_caught", []Tenure{
			tenure(1, 0, 0, 10, 30, 30), tenure(2, 1, 5, 25, 40, 40)}, 1},
		{"a_window_that_never_opened_is_ignored", []Tenure{
			tenure(1, 0, 0, 50, 20, 60), tenure(2, 1, 25, 30, 40, 40)}, 0},
		{"other_runs_may_overlap", []Tenure{
			tenure(1, 0, 0, 10, 30, 30), {Run: "s", Holder: "x", Fence: 1, Grant: 15, End: 25}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Len(t, CheckTrust(tt.tenures), tt.problems)
		})
	}
}

func TestTenuresEndAtTheEarliestOfStopTrustAndKill(t *testing.T) {
	t.Parallel()
	events := []Event{
		{Kind: KindGrant, Run: "r", Holder: "a", Fence: 1, T0: 1, T1: 2, Trust: 50, Gen: 0},
		{Kind: KindCkpt, Run: "r", Holder: "a", Fence: 1, Trust: 60, Gen: 0},
		{Kind: KindEnd, Run: "r", Holder: "a", Fence: 1, T0: 90, Trust: 70, Gen: 0}, // paused past its trust
		{Kind: KindGrant, Run: "r", Holder: "b", Fence: 2, T0: 80, T1: 95, Trust: 140, Gen: 1},
		{Kind: KindCkpt, Run: "r", Holder: "b", Fence: 2, Trust: 150, Gen: 1},
		{Kind: KindGrant, Run: "r", Holder: "c", Fence: 3, T0: 300, T1: 310, Trust: 350, Gen: 2},
		{Kind: KindGrant, Run: "r", Holder: "d", Fence: 4, T0: 400, T1: 410, Trust: 450, Gen: 3},
	}
	ts, problems := Tenures(events, map[int]int64{1: 120, 2: 400})
	assert.Equal(t, []string{`run r fence 4 (d): granted but never ended, and its process was not killed`}, problems)
	require.Len(t, ts, 3)
	assert.Equal(t, int64(70), ts[0].End, "trust ran out before the driver noticed")
	assert.Equal(t, int64(90), ts[0].Stop)
	assert.Equal(t, int64(120), ts[1].End, "killed before its trust ran out")
	assert.Zero(t, ts[1].Stop)
	assert.Equal(t, int64(350), ts[2].End, "killed after its trust ran out")
}

func TestCheckCheckpoints(t *testing.T) {
	t.Parallel()
	tenures := []Tenure{tenure(1, 0, 0, 10, 45, 48), tenure(2, 1, 40, 60, 90, 90)}
	clean := func() Checkpoints {
		return Checkpoints{
			Tenures: tenures,
			Attempts: []Write{
				{Run: "r", Fence: 1, Seq: 1, T0: 20, T1: 25, Res: ResOK},
				{Run: "r", Fence: 1, Seq: 2, T0: 55, T1: 58, Res: ResOK}, // before fence 2's Acquire returned
				{Run: "r", Fence: 1, Seq: 3, T0: 65, T1: 66, Res: ResLost},
				{Run: "r", Fence: 2, Seq: 1, T0: 70, T1: 75, Res: ResOK},
				{Run: "r", Fence: 2, Seq: 2, T0: 80, T1: 85, Res: ResUnknown},
			},
			Landed: []Write{{Run: "r", Fence: 1, Seq: 1}, {Run: "r", Fence: 1, Seq: 2}, {Run: "r", Fence: 2, Seq: 1}},
			Final:  map[string]string{"r": "2:1"},
			Killed: map[int]int64{},
		}
	}
	tests := []struct {
		name   string
		mutate func(*Checkpoints)
		want   string
	}{
		{"a_clean_history_passes", func(*Checkpoints) {}, ""},
		{"a_write_that_succeeded_after_the_successor_was_granted_is_caught", func(c *Checkpoints) {
			c.Attempts[2].Res = ResOK
			c.Landed = append(c.Landed, Write{Run: "r", Fence: 1, Seq: 3})
		}, "succeeded, begun 0.000s after a higher fence was granted"},
		{"a_stale_write_that_landed_while_its_caller_saw_a_fault_is_caught", func(c *Checkpoints) {
			c.Attempts[2].Res = ResUnknown
			c.Landed = append(c.Landed, Write{Run: "r", Fence: 1, Seq: 3})
		}, "landed (its caller saw a fault)"},
		{"a_write_reported_lost_that_landed_is_caught", func(c *Checkpoints) {
			c.Landed = append(c.Landed, Write{Run: "r", Fence: 1, Seq: 3})
		}, "reported lost (RUN-E021) but landed"},
		{"a_write_reported_written_that_did_not_land_is_caught", func(c *Checkpoints) {
			c.Landed = c.Landed[1:]
		}, "reported written but is not in the store's log"},
		{"a_final_value_older_than_a_success_is_caught", func(c *Checkpoints) {
			c.Final["r"] = "1:2"
		}, "final checkpoint 1:2 is older than 2:1"},
		{"a_write_nobody_recorded_is_caught", func(c *Checkpoints) {
			c.Landed = append(c.Landed, Write{Run: "r", Fence: 2, Seq: 9})
		}, "landed but no live driver recorded it"},
		{"a_write_a_killed_driver_could_not_record_is_fine", func(c *Checkpoints) {
			c.Landed = append(c.Landed, Write{Run: "r", Fence: 2, Seq: 9})
			c.Killed[1] = 100
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := clean()
			tt.mutate(&c)
			got := CheckCheckpoints(c)
			if tt.want == "" {
				assert.Empty(t, got)
				return
			}
			require.Len(t, got, 1, "%q", got)
			assert.Contains(t, got[0], tt.want)
		})
	}
}

func TestCheckDownstream(t *testing.T) {
	t.Parallel()
	w := func(fence uint64, seq int, t0, t1 int64, res string) Write {
		return Write{Run: "r", Fence: fence, Seq: seq, T0: t0, T1: t1, Res: res}
	}
	tests := []struct {
		name   string
		writes []Write
		final  FenceSeq
		killed bool // the holder of fence 3 was killed
		want   int
	}{
		{"fences_accepted_in_order_are_fine", []Write{
			w(1, 1, 0, 5, ResOK), w(2, 1, 10, 15, ResOK), w(1, 2, 20, 25, ResRefused)}, FenceSeq{2, 1}, false, 0},
		{"a_stale_fence_accepted_after_a_newer_one_is_caught", []Write{
			w(1, 1, 0, 5, ResOK), w(2, 1, 10, 15, ResOK), w(1, 2, 20, 25, ResOK)}, FenceSeq{2, 1}, false, 1},
		{"writes_whose_calls_overlap_are_not_ordered", []Write{
			w(2, 1, 10, 30, ResOK), w(1, 1, 20, 25, ResOK)}, FenceSeq{2, 1}, false, 0},
		{"a_final_row_below_an_accepted_write_is_caught", []Write{
			w(1, 1, 0, 5, ResOK), w(2, 1, 10, 15, ResOK)}, FenceSeq{1, 1}, false, 1},
		{"a_final_row_from_a_write_of_unknown_outcome_is_fine", []Write{
			w(1, 1, 0, 5, ResOK), w(2, 1, 10, 15, ResUnknown)}, FenceSeq{2, 1}, false, 0},
		{"a_final_row_nobody_wrote_is_caught", []Write{
			w(1, 1, 0, 5, ResOK)}, FenceSeq{3, 1}, false, 1},
		{"a_final_row_a_killed_driver_may_have_written_is_fine", []Write{
			w(1, 1, 0, 5, ResOK)}, FenceSeq{3, 1}, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := Downstream{Writes: tt.writes, Final: map[string]FenceSeq{"r": tt.final},
				Tenures: []Tenure{tenure(3, 7, 6, 7, 8, 0)}, Killed: map[int]int64{}}
			if tt.killed {
				d.Killed[7] = 9
			}
			assert.Len(t, CheckDownstream(d), tt.want)
		})
	}
}

func TestTakeovers(t *testing.T) {
	t.Parallel()
	s := int64(time.Second)
	ts := []Tenure{
		{Run: "r", Fence: 1, Gen: 0, Slot: 0, Grant: 1 * s, Stop: 0},
		{Run: "r", Fence: 2, Gen: 1, Slot: 1, Call: 2 * s, Grant: 8 * s, Stop: 9 * s},
		{Run: "q", Fence: 1, Gen: 1, Slot: 1, Grant: 1 * s, Stop: 3 * s}, // not the faulted child's
	}
	faults := []Fault{
		{Kind: FaultPause, Slot: 0, Gen: 0, T0: 2 * s, T1: 9 * s},
		{Kind: FaultPause, Slot: 0, Gen: 0, T0: 10 * s, T1: 11 * s}, // too short to count
	}
	got := Takeovers(ts, faults, 3, 5*time.Second, 0, 8*time.Second)
	require.Len(t, got, 1)
	assert.Equal(t, "r", got[0].Run)
	assert.Equal(t, 6*time.Second, got[0].Latency)
	assert.True(t, got[0].Eligible)

	// Other children down in turn leave one of them up at every instant.
	faults = append(faults, Fault{Kind: FaultKill, Slot: 1, Gen: 1, T0: 3 * s, T1: 5 * s},
		Fault{Kind: FaultPause, Slot: 2, Gen: 2, T0: 5 * s, T1: 15 * s})
	got = Takeovers(ts, faults, 3, 5*time.Second, 0, 8*time.Second)
	require.Len(t, got, 1)
	assert.True(t, got[0].Eligible)

	// With every other child down at once, the sample says nothing about
	// the lease.
	faults[2].T1 = 6 * s
	got = Takeovers(ts, faults, 3, 5*time.Second, 0, 8*time.Second)
	require.Len(t, got, 1)
	assert.False(t, got[0].Eligible)

	// A held run nobody took over is censored.
	got = Takeovers(ts[:1], faults[:1], 3, 5*time.Second, 0, 8*time.Second)
	require.Len(t, got, 1)
	assert.Equal(t, Censored, got[0].Latency)
}

func TestBeliefsAndCheckSlots(t *testing.T) {
	t.Parallel()
	claim := func(run, key string, t1, trust int64, gen int) Event {
		return Event{Kind: KindClaim, Run: run, Key: key, T1: t1, Trust: trust, Gen: gen}
	}
	events := []Event{
		claim("a", "s0", 10, 100, 0),
		claim("b", "s1", 12, 100, 0),
		claim("c", "s2", 14, 100, 1),
		{Kind: KindEnd, Run: "a", T0: 200, Trust: 100, Cap: 50}, // a failed slot renewal capped it at 50
		{Kind: KindEnd, Run: "b", T0: 40, Trust: 100},
		claim("d", "s1", 45, 140, 0), // b's slot, after b's belief ended
		claim("e", "s0", 60, 150, 1), // a's slot, after a's cap
	}
	beliefs, problems := Beliefs(events, map[int]int64{1: 70})
	assert.Equal(t, []string{"run d: claim at 45 never ended, and its process was not killed"}, problems)
	ends := map[string]int64{}
	for _, b := range beliefs {
		ends[b.Holder] = b.End
	}
	assert.Equal(t, map[string]int64{"a": 50, "b": 40, "c": 70, "e": 70}, ends)
	peak, violations := CheckSlots(beliefs, 3)
	assert.Equal(t, 3, peak)
	assert.Empty(t, violations)

	iv := func(key, holder string, start, end int64) history.Interval {
		return history.Interval{Key: key, Holder: holder, Start: start, End: end}
	}
	peak, violations = CheckSlots([]history.Interval{
		iv("s0", "a", 0, 10), iv("s1", "b", 1, 10), iv("s2", "c", 2, 10), iv("s0", "d", 5, 10),
	}, 3)
	assert.Equal(t, 4, peak)
	assert.Len(t, violations, 2, "over the limit, and two in slot s0: %q", violations)
	_, violations = CheckSlots([]history.Interval{iv("s0", "a", 0, 10), iv("s1", "a", 5, 15)}, 3)
	assert.Len(t, violations, 1, "one competitor in two slots: %q", violations)
	_, violations = CheckSlots([]history.Interval{iv("s0", "a", 0, 10), iv("s0", "b", 20, 10)}, 3)
	assert.Empty(t, violations, "a belief that never opened is left out")
}

func TestFrees(t *testing.T) {
	t.Parallel()
	s := int64(time.Second)
	snaps := []Snapshot{
		{At: 1 * s, Holders: map[string]string{"s0": "a", "s1": "b"}},
		{At: 3 * s, Holders: map[string]string{"s0": "a", "s1": "b"}},
		{At: 6 * s, Holders: map[string]string{"s1": "b"}},
		{At: 7 * s, Holders: map[string]string{"s0": "c", "s1": "c"}},
	}
	gens := map[string]int{"a": 0, "b": 1, "c": 2}
	got := Frees(snaps, []Fault{{Kind: FaultKill, Gen: 0, T0: 2 * s}, {Kind: FaultKill, Gen: 1, T0: 2 * s}}, gens, 5*time.Second)
	assert.Equal(t, []time.Duration{4 * time.Second, 5 * time.Second}, got)
	got = Frees(snaps, []Fault{{Kind: FaultPause, Gen: 0, T0: 2 * s, T1: 3 * s}}, gens, 5*time.Second)
	assert.Empty(t, got, "a short pause is not measured")
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	assert.Equal(t, time.Duration(50), Percentile(ds, 50))
	assert.Equal(t, time.Duration(99), Percentile(ds, 99))
	assert.Equal(t, time.Duration(100), Percentile(ds, 100))
	assert.Equal(t, time.Duration(7), Percentile([]time.Duration{7}, 99))
	assert.Zero(t, Percentile(nil, 50))
	assert.Equal(t, Censored, Percentile([]time.Duration{1, Censored}, 99))
}

func TestActsCountsZombieAndStaleWrites(t *testing.T) {
	t.Parallel()
	ts := []Tenure{tenure(1, 0, 0, 10, 30, 50), tenure(2, 1, 35, 40, 60, 60)}
	ws := []Write{
		{Run: "r", Fence: 1, T0: 20, Res: ResOK},      // inside the window
		{Run: "r", Fence: 1, T0: 35, Res: ResOK},      // a zombie: after the window, before the successor
		{Run: "r", Fence: 1, T0: 45, Res: ResRefused}, // a zombie and stale: after the successor's grant
		{Run: "x", Fence: 1, T0: 45, Res: ResOK},      // no such tenure
	}
	zombie, stale := Acts(ts, ws)
	assert.Equal(t, map[string]int{ResOK: 1, ResRefused: 1}, zombie)
	assert.Equal(t, map[string]int{ResRefused: 1}, stale)
}

// TestFormatFaultsListsFaultsInTheOrderTheyBegan: the fault line of a
// chaos run's report is in start order, with each start counted from the
// first fault's, so a slow takeover can be read against what else was
// down then.
func TestFormatFaultsListsFaultsInTheOrderTheyBegan(t *testing.T) {
	s := int64(time.Second)
	got := FormatFaults([]Fault{
		{Kind: FaultKill, Slot: 2, T0: 10 * s, T1: 10*s + int64(100*time.Millisecond)},
		{Kind: FaultPause, Slot: 0, T0: 7 * s, T1: 12 * s},
		{Kind: FaultKill, Slot: 1, T0: 11 * s},
	})
	assert.Equal(t, "[pause slot 0 +0s for 5s] [kill slot 2 +3s for 100ms] [kill slot 1 +4s for 0s]", got)
	assert.Empty(t, FormatFaults(nil))
}
