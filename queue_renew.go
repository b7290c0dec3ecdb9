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
// TTL at most. Second, renewals are sent by one flusher per Store value
// while any are pending: a renewal that arrives while a call is in flight
// goes in the next one, and the first renewal of a beat waits a moment
// (entryGather) for the others before the flusher starts, so a beat's
// renewals take one call.
//
// A renewal is conditional on each entry being the row the waiter last
// wrote, key by key. MultiCASer is not atomic as a whole, so a waiter with
// entries in several scopes may see some renewed and others not: that only
// happens when an entry changed under it (it expired and was taken over or
// pruned), and the waiter then queues again, writing all its entries anew
// in one batch, as before. A fault leaves each write's outcome to the
// waiter, which reads its rows back.
//
// entryBatches.mu is a leaf lock, held only to find, make or remove a
// Store value's batch, to add, withdraw or take pending renewals, and to
// count the waiters a call in flight still has; the store is called by
// the flusher without it. A flusher exists exactly while its batch is in
// the map (from the renewal that made it, which starts it after a moment):
// it removes the batch, under the lock, when it finds nothing pending, so
// a renewal added after that makes a new batch and a new flusher. A call
// whose waiters have all given up is cut short, so a flusher never
// outlives its waiters by more than a store call that honours its
// context.
var entryBatches = struct {
	mu sync.Mutex
	m  map[Store]*entryBatch
}{m: map[Store]*entryBatch{}}

// entryBatch is the renewals waiting to be sent to one Store value.
type entryBatch struct {
	pending []*entryRenewal // guarded by entryBatches.mu
}

// entryRenewal is one waiter's renewal of its entries.
type entryRenewal struct {
	writes []CASWrite
	// end is when the renewal stops being of use: the trust end of the
	// entries it renews. A call carrying it is cut short then.
	end time.Time

	done    chan struct{} // closed by the flusher once swapped and err are set
	swapped []bool
	err     error

	call *entryCall // the call carrying it, once sent; guarded by entryBatches.mu
}

// entryGather is how long the renewal that starts a flusher waits for the
// rest of its beat's renewals to arrive.
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
	start := b == nil
	if start {
		b = &entryBatch{}
		entryBatches.m[s] = b
	}
	b.pending = append(b.pending, r)
	entryBatches.mu.Unlock()
	if start {
		// Renewals due on one beat arrive within moments of each other:
		// the renewal that made the batch gives them a moment to join it,
		// so that they go in one call rather than the first alone. A
		// renewal has a good part of a TTL to land.
		t := time.NewTimer(entryGather)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		go b.flush(s, m)
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		entryBatches.mu.Lock()
		if i := slices.Index(b.pending, r); i >= 0 {
			b.pending = slices.Delete(b.pending, i, i+1)
		} else if c := r.call; c != nil {
			if c.live--; c.live == 0 {
				c.cancel()
			}
		}
		entryBatches.mu.Unlock()
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

// entryCall is one MetaCASMany call of a flusher: how many of the waiters
// whose renewals it carries still wait for it, and how to cut it short
// when none does. Its live count is guarded by entryBatches.mu.
type entryCall struct {
	live   int
	cancel context.CancelFunc
}

// flush sends the pending renewals of Store value s, a call at a time,
// until none is left, and then removes the batch. Renewals that arrive
// while a call is in flight go together in the next.
func (b *entryBatch) flush(s Store, m MultiCASer) {
	for {
		// A renewal whose entries' trust has ended is of no use: it is
		// not sent, and reported as not applied, so its waiter queues
		// again, as it would have on finding itself stalled.
		now := time.Now()
		var stale []*entryRenewal
		entryBatches.mu.Lock()
		chunk := b.takeLocked()
		if len(chunk) == 0 {
			delete(entryBatches.m, s)
			entryBatches.mu.Unlock()
			return
		}
		live := chunk[:0]
		for _, r := range chunk {
			if now.Before(r.end) {
				live = append(live, r)
			} else {
				stale = append(stale, r)
			}
		}
		chunk = live
		end := now.Add(time.Hour)
		for _, r := range chunk {
			end = earliest(end, r.end)
		}
		ctx, cancel := context.WithDeadline(context.Background(), end)
		call := &entryCall{live: len(chunk), cancel: cancel}
		for _, r := range chunk {
			r.call = call
		}
		entryBatches.mu.Unlock()
		for _, r := range stale {
			r.swapped = make([]bool, len(r.writes))
			close(r.done)
		}
		if len(chunk) == 0 {
			cancel()
			continue
		}

		var writes []CASWrite
		for _, r := range chunk {
			writes = append(writes, r.writes...)
		}
		swapped, err := m.MetaCASMany(ctx, writes)
		cancel()
		for _, r := range chunk {
			if err != nil {
				r.err = err
			} else {
				r.swapped, swapped = swapped[:len(r.writes)], swapped[len(r.writes):]
			}
			close(r.done)
		}
	}
}

// takeLocked takes the pending renewals one call can carry: at most
// MaxMultiCAS writes and each key once (two waiters of one run, one of
// them about to find it is not alone, go in separate calls), in the order
// they arrived. entryBatches.mu is held.
func (b *entryBatch) takeLocked() []*entryRenewal {
	var chunk []*entryRenewal
	keys := map[string]bool{}
	n := 0
	rest := b.pending[:0]
	for _, r := range b.pending {
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
	clear(b.pending[len(rest):])
	b.pending = rest
	return chunk
}
