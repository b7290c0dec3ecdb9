// Package manualclock is a clock for runlease.WithClock that moves only
// when told to: the simulated time of the command line's demo and of the
// tests (as testkit.Clock).
package manualclock

import (
	"sync"
	"time"
)

// Clock is a manual clock. It starts at a fixed instant and moves only
// when told to. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a Clock set to start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
