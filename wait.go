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

// RowNotifier is an optional refinement of [Notifier] whose wake-ups carry
// the row the waking write stored, so that a waiter woken by a release can
// take the lease over at once instead of reading the row first: a handoff
// is then two round trips, the release and the takeover. Both built-in
// stores implement it. A row carried is a hint like the wake-up itself: the
// waiter's write is conditional on it, and a row that changed since only
// costs a read.
type RowNotifier interface {
	Notifier
	// SubscribeRows is Subscribe whose channel receives the row each waking
	// write stored, or "" when a wake-up carries none (after a reconnect,
	// say): then the key must be read. A pending wake-up is replaced by a
	// later one, so a receive yields the latest.
	SubscribeRows(key string) (rows <-chan string, cancel func())
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
// error itself (not a library error); a deadline that has passed counts as
// the end of ctx even before ctx's timer has said so. An acquisition whose
// outcome the end of ctx left unknown is released as Acquire describes;
// only a write that lands after that release was tried, or one the store
// would not let it release, stays in holder's name: it expires after the
// TTL, and AcquireWait or Acquire by the same holder re-enters it. It takes
// the options of Acquire, and WithWaitPoll.
func AcquireWait(ctx context.Context, store Store, runID, holder string, opts ...Option) (*Lease, error) {
	o, err := buildOptions(store, opts, optsWait, "AcquireWait")
	if err != nil {
		return nil, err
	}
	if o.poll < MinWaitPoll {
		return nil, invalidArg("poll", "%v is shorter than %v", o.poll, MinWaitPoll)
	}
	w := subscribeWait(store, LeasePrefix+runID)
	defer w.cancel()
	var known *string // the row a wake-up carried: write over it at once
	for tryCreate := true; ; tryCreate = false {
		// After a refusal the row is known to exist: read it first rather
		// than try to create it (or, woken with the released row, write
		// over that), so a woken waiter takes over in two round trips, or
		// one.
		l, err := acquireWith(ctx, store, runID, holder, o, tryCreate, known)
		if err != nil {
			if cerr := ctxEnded(ctx); cerr != nil {
				return nil, cerr
			}
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
		if known, err = w.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// waitSub is AcquireWait's subscription to its run's wake-ups, if the store
// has them: rows when it is a [RowNotifier], bare wake-ups when it is only a
// [Notifier], none otherwise (nil channels, which never fire).
type waitSub struct {
	wake   <-chan struct{}
	rows   <-chan string
	cancel func()
}

func subscribeWait(store Store, key string) waitSub {
	switch n := store.(type) {
	case RowNotifier:
		rows, cancel := n.SubscribeRows(key)
		return waitSub{rows: rows, cancel: cancel}
	case Notifier:
		wake, cancel := n.Subscribe(key)
		return waitSub{wake: wake, cancel: cancel}
	}
	return waitSub{cancel: func() {}}
}

// sleep waits for d, a wake-up, or the end of ctx, whose error it returns.
// It returns the row a wake-up carried, nil when none did.
func (w waitSub) sleep(ctx context.Context, d time.Duration) (*string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
	case <-w.wake:
	case row := <-w.rows:
		if row != "" {
			return &row, nil
		}
	}
	return nil, nil
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
// to implement Subscribe and SubscribeRows. The zero value is ready to use.
// mu is a leaf lock: waking sends without blocking.
type subscribers struct {
	mu    sync.Mutex
	byKey map[string]map[*subscription]struct{}
}

// subscription is one subscriber: exactly one of its channels is set.
type subscription struct {
	wake chan struct{} // Subscribe's
	rows chan string   // SubscribeRows': the latest row, "" when unknown
}

// subscribe adds a subscriber of key, for Subscribe.
func (s *subscribers) subscribe(key string) (ch chan struct{}, cancel func()) {
	sub := &subscription{wake: make(chan struct{}, 1)}
	return sub.wake, s.add(key, sub)
}

// subscribeRows adds a subscriber of key, for SubscribeRows.
func (s *subscribers) subscribeRows(key string) (ch chan string, cancel func()) {
	sub := &subscription{rows: make(chan string, 1)}
	return sub.rows, s.add(key, sub)
}

func (s *subscribers) add(key string, sub *subscription) (cancel func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey == nil {
		s.byKey = map[string]map[*subscription]struct{}{}
	}
	if s.byKey[key] == nil {
		s.byKey[key] = map[*subscription]struct{}{}
	}
	s.byKey[key][sub] = struct{}{}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.byKey[key], sub)
		if len(s.byKey[key]) == 0 {
			delete(s.byKey, key)
		}
	}
}

// send wakes sub with row ("" when unknown) without blocking: a pending
// wake-up is replaced, so a subscriber that was slow to look sees the
// latest row. s.mu is held, and only send sends, so the buffer has room
// once drained.
func (sub *subscription) send(row string) {
	if sub.wake != nil {
		select {
		case sub.wake <- struct{}{}:
		default:
		}
		return
	}
	select {
	case <-sub.rows:
	default:
	}
	sub.rows <- row
}

// count returns how many subscriptions there are.
func (s *subscribers) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}

// wakeAll wakes every subscriber of every key, without a row: each must
// re-read.
func (s *subscribers) wakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, subs := range s.byKey {
		for sub := range subs {
			sub.send("")
		}
	}
}

// wake wakes every subscriber of key with row, the row the waking write
// stored, or "" when it is not known.
func (s *subscribers) wake(key, row string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.byKey[key] {
		sub.send(row)
	}
}
