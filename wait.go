package runlease

import (
	"context"
	"errors"
	"time"
)

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
