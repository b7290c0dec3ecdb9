package runlease

import (
	"context"
	"slices"
	"sync"
	"time"
)

// A waiter keeps its queue entries alive by renewing them, as a keeper
// renews a lease, and the renewals of a process's waiters are sent the way
// a [Renewer] sends lease renewals: together, in one [MultiCASer] call per
// Store value, so a process with a thousand waiting runs renews their
// entries in a few round trips per period, not a thousand.
//
// Two things make renewals meet. First, a waiter renews on a beat: at the
// first multiple of ttl/12 (counted from one process-wide origin) at or
// after a quarter of the TTL since its last write, so waiters of one TTL
// renew at the same instants, whenever they queued, and every third of the
// TTL at most. Second, the first renewal of a Store value opens a batch
// and gives the others a moment (entryGather) to join it; then it closes
// the batch and sends it, in one call (or a few, for more than MaxMultiCAS
// writes or two renewals of one key), on goroutines of their own. A
// renewal arriving after that opens the next batch, which goes without
// waiting for the calls in flight: a slow call delays only the renewals it
// carries, never those behind it.
//
// A call runs until the latest trust end among its renewals, or until
// none of its waiters waits for it any more. A renewal whose own trust
// ends before its call answers is no use to its waiter even if it landed:
// the waiter treats it as a stall (its entries may have looked expired to
// others meanwhile) and queues again (queue_wait.go renewEntries).
//
// A renewal is conditional on each entry being the row the waiter last
// wrote, key by key. MultiCASer is not atomic as a whole, so a waiter with
// entries in several scopes may see some renewed and others not: that only
// happens when an entry changed under it (it expired and was taken over or
// pruned), and the waiter then queues again, writing all its entries anew
// in one batch, as before. A fault leaves each write's outcome to the
// waiter, which reads its rows back.
//
// entryBatches.mu is a leaf lock, held only to find, open or close a Store
// value's open batch, to add or withdraw a renewal, and to count the
// waiters a call in flight still has. The store is called without it, by
// goroutines that each own one call and end with it.
var entryBatches = struct {
	mu sync.Mutex
	m  map[Store]*entryBatch // the open batch of each Store value, if any
}{m: map[Store]*entryBatch{}}

// entryBatch is the renewals gathered for one call (or a few) to one Store
// value.
type entryBatch struct {
	pending []*entryRenewal // guarded by entryBatches.mu until it is closed
}

// entryRenewal is one waiter's renewal of its entries.
type entryRenewal struct {
	writes []CASWrite
	// end is when the renewal stops being of use: the trust end of the
	// entries it renews.
	end time.Time

	done    chan struct{} // closed by the call's goroutine once swapped and err are set
	swapped []bool
	err     error

	call *entryCall // the call carrying it, once sent; guarded by entryBatches.mu
	left bool       // its waiter let go of the call; guarded by entryBatches.mu
}

// entryGather is how long the renewal that opens a batch waits for the
// rest of its beat's renewals to join it.
const entryGather = 10 * time.Millisecond

// entryBeatOrigin is the origin of every waiter's renewal beat: a reading
// of the monotonic clock shared by the process.
var entryBeatOrigin = time.Now()

// entryRenewalDue returns when entries written at wrote (a monotonic
// reading), with ttl, are due for renewal: the first beat at or after a
// quarter of the TTL later. The beat is ttl/12, so it lands between a
// quarter and a third of the TTL after the write; a renewal sent on a beat
// is due again on the beat a third of the TTL later.
func entryRenewalDue(wrote time.Time, ttl time.Duration) time.Time {
	beat := ttl / 12
	if beat <= 0 {
		return wrote.Add(ttl / 3)
	}
	since := wrote.Add(ttl / 4).Sub(entryBeatOrigin)
	n := since / beat
	if since > n*beat {
		n++
	}
	return entryBeatOrigin.Add(n * beat)
}

// batchedRenewals returns the MultiCASer to send s's entry renewals
// through, and false when s has none or cannot key a batch (a Store value
// that holds a slice, a map or a NaN).
func batchedRenewals(s Store) (MultiCASer, bool) {
	m, ok := s.(MultiCASer)
	return m, ok && keyable(s)
}

// renewEntries sends writes, a waiter's entry renewals, with the renewals
// of the process's other waiters on Store value s, through m, and returns
// for each write whether it applied. It returns ctx's error when ctx ends
// first: the renewal is withdrawn if it was not sent yet, and if it was,
// it may land (the waiter's leave finds its rows by its id) and the call
// carrying it is cut short once no renewal in it has a waiter left. A
// write whose call failed with an unknown outcome is resolved by reading
// its key back, as casResolved would.
func renewEntries(ctx context.Context, s Store, m MultiCASer, writes []CASWrite, end time.Time) ([]bool, error) {
	if err := CheckCASMany(writes); err != nil {
		return nil, err
	}
	r := &entryRenewal{writes: writes, end: end, done: make(chan struct{})}
	entryBatches.mu.Lock()
	b := entryBatches.m[s]
	opened := b == nil
	if opened {
		b = &entryBatch{}
		entryBatches.m[s] = b
	}
	b.pending = append(b.pending, r)
	entryBatches.mu.Unlock()
	if opened {
		// Renewals due on one beat arrive within moments of each other:
		// the renewal that opened the batch gives them a moment to join
		// it. A renewal has a good part of a TTL to land.
		t := time.NewTimer(entryGather)
		select {
		case <-t.C:
		case <-ctx.Done():
			b.withdraw(r) // not sent for a waiter that left; the others are
		}
		t.Stop()
		b.send(s, m)
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		b.withdraw(r)
		return nil, ctx.Err()
	}
	if r.err == nil || !IsOutcomeUnknown(r.err) {
		return r.swapped, r.err
	}
	swapped := make([]bool, len(writes))
	for i, w := range writes {
		ok, err := resolveCAS(ctx, s, w.Key, w.Expected, w.Value, false, r.err)
		if err != nil {
			return nil, err
		}
		swapped[i] = ok
	}
	return swapped, nil
}

// withdraw takes r out of b if b is still open, and otherwise lets go of
// the call carrying r, if it was sent: the call is cut short once none of
// its waiters is left.
func (b *entryBatch) withdraw(r *entryRenewal) {
	cut := func() {}
	entryBatches.mu.Lock()
	if i := slices.Index(b.pending, r); i >= 0 {
		b.pending = slices.Delete(b.pending, i, i+1)
	} else if c := r.call; c != nil && !r.left {
		r.left = true
		if c.live--; c.live == 0 {
			cut = c.cancel
		}
	}
	entryBatches.mu.Unlock()
	cut() // outside the lock: cancelling reaches whatever the store hung on the context
}

// entryCall is one MetaCASMany call: how many of the waiters whose
// renewals it carries still wait for it, and how to cut it short when none
// does. Its live count is guarded by entryBatches.mu.
type entryCall struct {
	live   int
	cancel context.CancelFunc
}

// send closes b, the open batch of Store value s, and sends its renewals
// through m, each call on a goroutine of its own. A renewal whose trust
// has ended is not sent: it is reported not applied.
func (b *entryBatch) send(s Store, m MultiCASer) {
	now := time.Now()
	var stale []*entryRenewal
	entryBatches.mu.Lock()
	if entryBatches.m[s] == b {
		delete(entryBatches.m, s)
	}
	live := b.pending[:0]
	for _, r := range b.pending {
		if now.Before(r.end) {
			live = append(live, r)
		} else {
			stale = append(stale, r)
		}
	}
	for rest := live; len(rest) > 0; {
		var chunk []*entryRenewal
		chunk, rest = takeCall(rest)
		ctx, cancel := context.WithDeadline(context.Background(), latestEnd(chunk))
		c := &entryCall{live: len(chunk), cancel: cancel}
		for _, r := range chunk {
			r.call = c
		}
		go callMany(ctx, cancel, m, chunk)
	}
	b.pending = nil // closed: nothing is withdrawn from it any more
	entryBatches.mu.Unlock()
	for _, r := range stale {
		r.swapped = make([]bool, len(r.writes))
		close(r.done)
	}
}

// latestEnd is the latest trust end among rs: a call runs as long as one
// of its renewals could still use it.
func latestEnd(rs []*entryRenewal) time.Time {
	end := rs[0].end
	for _, r := range rs[1:] {
		if r.end.After(end) {
			end = r.end
		}
	}
	return end
}

// callMany sends the renewals of one call and hands each its outcome.
func callMany(ctx context.Context, cancel context.CancelFunc, m MultiCASer, chunk []*entryRenewal) {
	defer cancel()
	var writes []CASWrite
	for _, r := range chunk {
		writes = append(writes, r.writes...)
	}
	swapped, err := m.MetaCASMany(ctx, writes)
	for _, r := range chunk {
		if err != nil {
			r.err = err
		} else {
			r.swapped, swapped = swapped[:len(r.writes)], swapped[len(r.writes):]
		}
		close(r.done)
	}
}

// takeCall splits off the renewals of rs one call can carry: at most
// MaxMultiCAS writes and each key once (two waiters of one run, one of
// them about to find it is not alone, go in separate calls), in the order
// they arrived, and returns them and the rest. It reorders nothing in the
// rest.
func takeCall(rs []*entryRenewal) (chunk, rest []*entryRenewal) {
	keys := map[string]bool{}
	n := 0
	for _, r := range rs {
		fits := n+len(r.writes) <= MaxMultiCAS
		for _, w := range r.writes {
			fits = fits && !keys[w.Key]
		}
		if !fits {
			rest = append(rest, r)
			continue
		}
		for _, w := range r.writes {
			keys[w.Key] = true
		}
		n += len(r.writes)
		chunk = append(chunk, r)
	}
	return chunk, rest
}
