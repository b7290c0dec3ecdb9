// Package millis does the millisecond arithmetic that the status page and
// the command line share when they say how far off an expiry is.
package millis

import (
	"math"
	"time"
)

// Until returns until minus now in milliseconds, clamped to the int64
// range (time.Time.Sub clamps to about 292 years instead).
func Until(until, now time.Time) int64 {
	u, n := until.UnixMilli(), now.UnixMilli()
	d := u - n
	if (u >= 0) != (n >= 0) && (d >= 0) != (u >= 0) { // overflowed
		if u >= 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return d
}
