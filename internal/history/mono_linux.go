package history

import "golang.org/x/sys/unix"

// Mono returns the machine's CLOCK_MONOTONIC in nanoseconds. Unlike the
// monotonic reading inside a time.Time, which Go counts from the start of
// each process, it is one clock for every process on the machine, so
// intervals recorded by different processes can be compared. It never goes
// backwards and does not move when the wall clock is set.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("history: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}
