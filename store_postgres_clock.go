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

// WithLocalClock sets the local clock from which the store derives the
// server's time (the default is time.Now). Tests use it to give a node a
// skewed clock; the store's [Clock] corrects for the skew.
func WithLocalClock(now func() time.Time) PostgresOption {
	return func(o *pgOptions) { o.local = now }
}

// pgClock estimates the server's clock from the local one: server time =
// local time + offset, within uncertainty. It is safe for concurrent use.
type pgClock struct {
	local func() time.Time

	mu          sync.RWMutex
	offset      time.Duration
	rtt         time.Duration // of the sample the offset came from
	measuredAt  time.Time     // local time of that sample
	stop, ended chan struct{}
}

// ClockNow implements [Clock]: the server's current time as estimated from
// the local clock and an offset measured in the background, with no round
// trip. The uncertainty is half the measuring round trip plus the drift the
// two clocks may have had since.
func (s *PostgresStore) ClockNow() (time.Time, time.Duration) {
	c := s.clock
	now := c.local()
	c.mu.RLock()
	defer c.mu.RUnlock()
	drift := time.Duration(float64(now.Sub(c.measuredAt).Abs()) * pgClockDrift)
	return now.Add(c.offset), c.rtt/2 + drift + time.Microsecond
}

// measure takes the best of a few samples of the server's clock and makes it
// the current offset.
func (s *PostgresStore) measure(ctx context.Context) error {
	c := s.clock
	best := time.Duration(-1)
	var offset time.Duration
	var at time.Time
	for range pgClockSamples {
		var micros int64
		t0 := c.local()
		err := s.do(ctx, "ClockNow", "", false, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, pgNowMicros, pgMode).Scan(&micros)
		})
		t1 := c.local()
		if err != nil {
			return err
		}
		if rtt := t1.Sub(t0); best < 0 || rtt < best {
			mid := t0.Add(rtt / 2)
			best, offset, at = rtt, time.UnixMicro(micros).Sub(mid), mid
		}
	}
	c.mu.Lock()
	c.offset, c.rtt, c.measuredAt = offset, best, at
	c.mu.Unlock()
	return nil
}

// startClock measures the offset once and then keeps it fresh until Close.
func (s *PostgresStore) startClock(ctx context.Context, local func() time.Time) error {
	if local == nil {
		local = time.Now
	}
	s.clock = &pgClock{local: local, stop: make(chan struct{}), ended: make(chan struct{})}
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
