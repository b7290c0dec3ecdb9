package runlease

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgNowMicros reads the server's clock, in microseconds since the Unix epoch.
const pgNowMicros = `SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`

// Clock sampling. The offset between this process's clock and the server's
// is measured at open and every pgClockRefresh after, taking the sample with
// the shortest round trip out of pgClockSamples.
const (
	pgClockRefresh = 30 * time.Second
	pgClockSamples = 3
	// pgClockDrift bounds how fast two clocks may drift apart between
	// measurements: 200 parts per million, well above what NTP-disciplined
	// or even free-running quartz clocks do.
	pgClockDrift = 200e-6
)

// WithLocalClock sets the local wall clock of the node (the default is
// time.Now), for tests that give a node a skewed or stepping clock. The
// store's [Clock] does not depend on it: it extrapolates the server's time
// from its last sample on the monotonic clock, so a node whose wall clock
// is skewed, or is stepped by NTP or a VM resume between samples, stamps
// the same times as any other.
func WithLocalClock(now func() time.Time) PostgresOption {
	return func(o *pgOptions) { o.local = now }
}

// pgClock estimates the server's clock: the server's time at the last
// sample plus the monotonic time elapsed since, within uncertainty. It is
// safe for concurrent use.
type pgClock struct {
	local func() time.Time              // the node's wall clock; see WithLocalClock
	since func(time.Time) time.Duration // monotonic time elapsed since a reading of time.Now

	mu          sync.RWMutex
	serverAt    time.Time     // the server's time at the sample
	monoAt      time.Time     // time.Now() at the sample's midpoint: its monotonic reading counts
	rtt         time.Duration // of the sample
	stop, ended chan struct{}
}

// ClockNow implements [Clock]: the server's current time, extrapolated from
// a sample taken in the background on this process's monotonic clock, with
// no round trip. The uncertainty is half the sample's round trip plus the
// drift the two clocks may have had since. A step of the local wall clock
// moves nothing.
func (s *PostgresStore) ClockNow() (time.Time, time.Duration) {
	c := s.clock
	c.mu.RLock()
	defer c.mu.RUnlock()
	elapsed := c.since(c.monoAt)
	drift := time.Duration(float64(elapsed.Abs()) * pgClockDrift)
	return c.serverAt.Add(elapsed), c.rtt/2 + drift + time.Microsecond
}

// measure takes the best of a few samples of the server's clock and makes it
// the current one. Round trips are timed on the monotonic clock.
func (s *PostgresStore) measure(ctx context.Context) error {
	c := s.clock
	best := time.Duration(-1)
	var serverAt, monoAt time.Time
	for range pgClockSamples {
		var micros int64
		t0 := time.Now()
		err := s.do(ctx, "ClockNow", "", false, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, pgNowMicros, pgMode).Scan(&micros)
		})
		rtt := c.since(t0)
		if err != nil {
			return err
		}
		if best < 0 || rtt < best {
			best, serverAt, monoAt = rtt, time.UnixMicro(micros), t0.Add(rtt/2)
		}
	}
	c.mu.Lock()
	c.serverAt, c.monoAt, c.rtt = serverAt, monoAt, best
	c.mu.Unlock()
	return nil
}

// startClock measures the offset once and then keeps it fresh until Close.
func (s *PostgresStore) startClock(ctx context.Context, local func() time.Time) error {
	if local == nil {
		local = time.Now
	}
	s.clock = &pgClock{local: local, since: time.Since, stop: make(chan struct{}), ended: make(chan struct{})}
	if err := s.measure(ctx); err != nil {
		return err
	}
	go s.refreshClock()
	return nil
}

// refreshClock re-measures the offset periodically. A failed measurement
// keeps the old offset, whose uncertainty grows with the drift allowance.
func (s *PostgresStore) refreshClock() {
	c := s.clock
	defer close(c.ended)
	t := time.NewTicker(pgClockRefresh)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), pgClockRefresh/2)
			_ = s.measure(ctx)
			cancel()
		}
	}
}

// stopClock stops the refresher and waits for it.
func (s *PostgresStore) stopClock() {
	if s.clock != nil && s.clock.stop != nil {
		close(s.clock.stop)
		<-s.clock.ended
	}
}
