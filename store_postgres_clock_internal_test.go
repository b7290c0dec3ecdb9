package runlease

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

// TestPostgresClockFollowsTheMonotonicClock steps a node's wall clock
// without stepping its monotonic clock, as NTP or a resumed VM does, and
// proves that the store's estimate of the server's time does not move, nor
// after the next sample of the server's clock, taken with the stepped wall
// clock.
func TestPostgresClockFollowsTheMonotonicClock(t *testing.T) {
	t.Parallel()
	var step atomic.Int64
	wall := func() time.Time { return time.Now().Round(0).Add(time.Duration(step.Load())) } // no monotonic reading
	s, err := NewPostgres(t.Context(), pgtest.Pool(t), WithTable(pgtest.NewTable(t, pgtest.Pool(t))),
		WithLocalClock(wall))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })

	for _, jump := range []time.Duration{-time.Hour, time.Hour, -24 * time.Hour} {
		before, _ := s.ClockNow()
		step.Add(int64(jump))
		after, u := s.ClockNow()
		assert.Less(t, after.Sub(before).Abs(), time.Minute, "a wall-clock step of %v moved the estimate", jump)
		assertServerTime(t, s, after, u)

		require.NoError(t, s.measure(t.Context()))
		remeasured, u := s.ClockNow()
		assert.Less(t, remeasured.Sub(before).Abs(), time.Minute, "after a step of %v and a new sample", jump)
		assertServerTime(t, s, remeasured, u)
	}
}

// assertServerTime checks est against a fresh read of the server's clock.
// The read follows the estimate, so the server may be ahead of it by the
// read's own duration, which is bounded loosely: the check is of steps of an
// hour, not of latency.
func assertServerTime(t *testing.T, s *PostgresStore, est time.Time, u time.Duration) {
	t.Helper()
	var micros int64
	require.NoError(t, s.pool.QueryRow(t.Context(), pgNowMicros).Scan(&micros))
	server := time.UnixMicro(micros)
	assert.False(t, est.After(server.Add(u)), "the estimate %v is ahead of the server's later %v", est, server)
	assert.Less(t, server.Sub(est), time.Minute, "the estimate %v lags the server's %v", est, server)
}
