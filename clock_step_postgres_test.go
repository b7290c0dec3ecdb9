package runlease_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// TestPostgresClockIgnoresWallClockSteps steps a node's wall clock an hour
// back and an hour forward, as NTP or a VM resume may between two samples
// of the server's clock: the stamps the store's clock gives must not move,
// or a holder would stamp its renewals short while its keeper, on the
// monotonic clock, still trusted the lease.
func TestPostgresClockIgnoresWallClockSteps(t *testing.T) {
	t.Parallel()
	var step atomic.Int64
	// Round(0) drops the monotonic reading: this is the wall clock alone.
	wall := func() time.Time { return time.Now().Round(0).Add(time.Duration(step.Load())) }
	s := openPG(t, pgtest.DSN(t), pgtest.NewTable(t, pgtest.Pool(t)), runlease.WithLocalClock(wall))
	honest := openPG(t, pgtest.DSN(t), pgtest.NewTable(t, pgtest.Pool(t)))

	for _, d := range []time.Duration{-time.Hour, time.Hour, -10 * time.Minute} {
		step.Store(int64(d))
		got, unc := s.ClockNow()
		want, wantUnc := honest.ClockNow()
		assert.Less(t, got.Sub(want).Abs(), unc+wantUnc+50*time.Millisecond,
			"after a wall-clock step of %v the store's clock moved by %v", d, got.Sub(want))
	}
}
