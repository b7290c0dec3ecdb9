package millis

import (
	"math"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	base := time.UnixMilli(1_700_000_000_000)
	far := time.UnixMilli(math.MaxInt64)
	past := time.UnixMilli(math.MinInt64)
	for _, tc := range []struct {
		name       string
		until, now time.Time
		want       int64
	}{
		{"ahead", base.Add(1500 * time.Millisecond), base, 1500},
		{"behind", base, base.Add(time.Second), -1000},
		{"equal", base, base, 0},
		{"sub_millisecond_is_dropped", base.Add(999 * time.Microsecond), base, 0},
		{"overflow_up_clamps", far, time.UnixMilli(-1), math.MaxInt64},
		{"overflow_down_clamps", past, time.UnixMilli(1), math.MinInt64},
		{"extremes_without_overflow", far, time.UnixMilli(0), math.MaxInt64},
	} {
		if got := Until(tc.until, tc.now); got != tc.want {
			t.Errorf("%s: Until(%d, %d) = %d, want %d", tc.name, tc.until.UnixMilli(), tc.now.UnixMilli(), got, tc.want)
		}
	}
}
