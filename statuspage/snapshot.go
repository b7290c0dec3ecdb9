package statuspage

import (
	"context"
	"sync"
	"time"

	"github.com/areev/runlease"
)

// DefaultMaxAge is how long a read of the store serves other requests for
// the same run id prefix; [WithMaxAge] changes it.
const DefaultMaxAge = time.Second

// WithMaxAge lets one read of the store answer every request for the same
// run id prefix for d (default [DefaultMaxAge]), so that the cost of a
// large store does not grow with the number of pages left open; requests
// that arrive while a read is under way wait for it. The page is then up
// to d older than the store. 0 reads the store for every request. A
// release from the page is seen by the next request whatever d is.
// WithMaxAge panics on a negative d.
func WithMaxAge(d time.Duration) Option {
	if d < 0 {
		panic("statuspage: " + runlease.CodeInvalidArgument + ": WithMaxAge: negative")
	}
	return func(o *options) { o.maxAge = d }
}

// snapshot is one read of the store: the leases with one run id prefix,
// every slot and every queue, judged at one instant, and the explanations
// of the waiting runs. Its fields are set before done is closed and never
// changed after.
type snapshot struct {
	done    chan struct{}
	readAt  time.Time // by this machine's monotonic clock
	reading *Reading
	why     map[string]explanation // by run id: at most MaxExplained runs
	err     error
}

// snapshots shares reads of the store between requests.
type snapshots struct {
	mu       sync.Mutex
	byPrefix map[string]*snapshot
}

// forget drops every snapshot, so that the next request reads the store.
func (c *snapshots) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.byPrefix)
}

// snapshot returns a read of the leases with the run id prefix that is at
// most maxAge old, waiting for one under way or making one. A read that
// fails is returned to those who waited for it, and not kept.
func (h *handler) snapshot(ctx context.Context, prefix string) (*snapshot, error) {
	c := &h.snaps
	c.mu.Lock()
	s := c.byPrefix[prefix]
	if s == nil || !fresh(s, h.o.maxAge) {
		s = &snapshot{done: make(chan struct{})}
		for p, old := range c.byPrefix { // keep memory to the prefixes asked for lately
			if !fresh(old, h.o.maxAge) {
				delete(c.byPrefix, p)
			}
		}
		if h.o.maxAge > 0 {
			c.byPrefix[prefix] = s
		}
		c.mu.Unlock()
		dctx, cancel := detach(ctx)
		h.fill(dctx, s, prefix)
		cancel()
		if s.err != nil {
			c.mu.Lock()
			if c.byPrefix[prefix] == s {
				delete(c.byPrefix, prefix)
			}
			c.mu.Unlock()
		}
		return s, s.err
	}
	c.mu.Unlock()
	select {
	case <-s.done:
		return s, s.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// detach returns ctx without its cancellation but with its deadline: a
// read shared with other requests must not fail them because the request
// that started it went away, yet stays bounded as that request was.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	d := context.WithoutCancel(ctx)
	if deadline, ok := ctx.Deadline(); ok {
		return context.WithDeadline(d, deadline)
	}
	return d, func() {}
}

// fresh reports whether s is under way or was read within maxAge.
func fresh(s *snapshot, maxAge time.Duration) bool {
	select {
	case <-s.done:
		return s.err == nil && time.Since(s.readAt) < maxAge
	default:
		return true
	}
}

// fill reads the store into s and closes s.done.
func (h *handler) fill(ctx context.Context, s *snapshot, prefix string) {
	defer close(s.done)
	s.reading, s.err = Read(ctx, h.store, prefix, h.now())
	if s.err == nil {
		s.why, s.err = explainAll(ctx, h.store, s.reading, h.o.limits)
	}
	s.readAt = time.Now()
}
