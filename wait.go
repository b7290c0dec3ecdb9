package runlease

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Notifier is an optional capability of a Store: conditional writes that
// wake the waiters of a key, so that a released lease is handed over in
// milliseconds rather than a poll interval. The Postgres store implements it
// with LISTEN/NOTIFY, across processes; the SQLite store within its process.
// Notifications are hints: a waiter always re-reads, and falls back to
// polling when a notification is lost.
type Notifier interface {
	// MetaCASNotify is MetaCAS that, when it writes, wakes the subscribers
	// of key (once the write is visible to them).
	MetaCASNotify(ctx context.Context, key string, expected *string, value string) (swapped bool, err error)
	// Subscribe returns a channel that receives a value whenever key may
	// have changed, and a function that ends the subscription. The channel
	// is buffered: wake-ups that arrive while one is pending merge into it.
	Subscribe(key string) (wake <-chan struct{}, cancel func())
}

// DefaultWaitPoll is how often [AcquireWait] retries when nothing wakes it
// sooner; [WithWaitPoll] changes it.
const DefaultWaitPoll = time.Second

// MinWaitPoll is the shortest interval [WithWaitPoll] accepts: shorter ones
// would only load the store.
const MinWaitPoll = 10 * time.Millisecond

// WithWaitPoll sets how often [AcquireWait] retries a busy lease when no
// notification wakes it sooner (and no expiry is due sooner). It must be at
// least [MinWaitPoll].
func WithWaitPoll(d time.Duration) Option {
	return func(o *options) { o.poll, o.set = d, o.set|optPoll }
}

// AcquireWait is [Acquire] that waits while another holder has the lease:
// it retries when the holder releases it (woken by the store when it is a
// [Notifier]), when the lease expires, and otherwise every [WithWaitPoll]
// interval, with jitter so that many waiters do not retry in step.
//
// It returns the lease, or the first error other than a live lease held
// elsewhere, or — when ctx ends first, even during a store call — ctx's
// error itself (not a library error). An acquisition whose outcome the end
// of ctx left unknown may have written a row for holder: it expires after
// the TTL, and AcquireWait or Acquire by the same holder re-enters it. It
// takes the options of Acquire, and WithWaitPoll.
func AcquireWait(ctx context.Context, store Store, runID, holder string, opts ...Option) (*Lease, error) {
	o, err := buildOptions(store, opts, optsWait, "AcquireWait")
	if err != nil {
		return nil, err
	}
	if o.poll < MinWaitPoll {
		return nil, invalidArg("poll", "%v is shorter than %v", o.poll, MinWaitPoll)
	}
	var wake <-chan struct{}
	if n, ok := store.(Notifier); ok {
		var cancel func()
		wake, cancel = n.Subscribe(LeasePrefix + runID)
		defer cancel()
	}
	for tryCreate := true; ; tryCreate = false {
		// After a refusal the row is known to exist: read it first rather
		// than try to create it, so a woken waiter takes over in two round
		// trips.
		l, err := acquireWith(ctx, store, runID, holder, o, tryCreate)
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var lost *LeaseLostError
		if !errors.As(err, &lost) || !errors.Is(err, ErrTakenOver) {
			return l, err
		}
		wait := jitter(o.poll)
		// Until may be centuries away: compare before adding, so that the
		// sum cannot overflow into a short wait.
		if untilExpiry := lost.Until.Sub(o.now()); untilExpiry < wait {
			wait = max(untilExpiry+time.Millisecond, time.Millisecond)
		}
		if err := sleepOrWake(ctx, wait, wake); err != nil {
			return nil, err
		}
	}
}

// sleepOrWake waits for d, a wake-up, or the end of ctx, whose error it
// returns.
func sleepOrWake(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-wake:
	}
	return nil
}

// casNotify is a conditional write that wakes the key's waiters when the
// store can, with an unknown outcome resolved as by casResolved.
func casNotify(ctx context.Context, s Store, key string, expected *string, value string) (bool, error) {
	n, ok := s.(Notifier)
	if !ok {
		return casResolved(ctx, s, key, expected, value)
	}
	swapped, err := n.MetaCASNotify(ctx, key, expected, value)
	return resolveCAS(ctx, s, key, expected, value, swapped, err)
}

// subscribers is the in-process fan-out of wake-ups by key that stores use
// to implement Subscribe. The zero value is ready to use.
type subscribers struct {
	mu    sync.Mutex
	byKey map[string]map[chan struct{}]struct{}
}

// subscribe adds a subscriber of key.
func (s *subscribers) subscribe(key string) (ch chan struct{}, cancel func()) {
	ch = make(chan struct{}, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey == nil {
		s.byKey = map[string]map[chan struct{}]struct{}{}
	}
	if s.byKey[key] == nil {
		s.byKey[key] = map[chan struct{}]struct{}{}
	}
	s.byKey[key][ch] = struct{}{}
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.byKey[key], ch)
		if len(s.byKey[key]) == 0 {
			delete(s.byKey, key)
		}
	}
}

// count returns how many subscriptions there are.
func (s *subscribers) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}

// wakeAll wakes every subscriber of every key without blocking.
func (s *subscribers) wakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, chans := range s.byKey {
		for ch := range chans {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// wake wakes every subscriber of key without blocking.
func (s *subscribers) wake(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.byKey[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
