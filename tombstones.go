package runlease

import (
	"container/list"
	"sync"
)

// A driver that releases a run at the end of a superstep and takes it again
// for the next one would pay four round trips per cycle where two suffice:
// Acquire first tries to create the row (refused: the released row is
// there), then reads it, then writes over it. So the process remembers the
// released rows its own Leases wrote, by Store value and run key, and the
// next Acquire of that run here writes over the row it remembers straight
// away, as [AcquireWait] does with a row it was told of. (A Lease that
// finds its run released at its fence by someone else, an operator's
// ForceRelease, remembers that row the same way: it is the stored row.)
//
// The memo refers to each Store value it holds rows of. A store that calls
// [ForgetStore] from its Close, as the built-in SQLite and Postgres stores
// do, leaves the memo when closed; any other Store value stays reachable
// while the memo holds one of its rows: until the run is acquired or pruned
// again here, or until maxTombstones later releases have pushed the row
// out.
//
// A remembered row is only a guess, taken out of the memo by the Acquire
// that uses it: the write over it is conditional on the store holding
// exactly those bytes, so it lands only where a fresh read would have found
// those bytes and led to the very same write. When the row has moved on
// (another node took the run, or an operator repaired it), the refusal
// sends Acquire to read the row as it would have without the guess, at the
// same cost. Prune in this process forgets what it deletes, so that a
// guess does not cost a deleted run's next acquisition two round trips.
//
// tombstones.mu is a leaf lock, held only to read or write the memo.
var tombstones = struct {
	mu    sync.Mutex
	m     map[tombKey]*list.Element // of order; each Value a *tombstone
	order list.List                 // oldest first
}{m: map[tombKey]*list.Element{}}

// maxTombstones bounds the memo: when it is full, remembering one more
// released row forgets the oldest, at most two round trips lost on that
// run's next acquisition.
const maxTombstones = 1024

type tombKey struct {
	store Store
	key   string
}

type tombstone struct {
	k   tombKey
	row string
}

// rememberReleased records row, a released row that landed at key on store.
// A store whose [ClosedReporter] says it is closed has forgotten its rows,
// or will, and gets none again: Close marks it closed before it calls
// [ForgetStore], and both the mark's reading here and the forgetting happen
// under tombstones.mu.
func rememberReleased(store Store, key, row string) {
	store = storeIdentity(store)
	k := tombKey{store, key}
	tombstones.mu.Lock()
	defer tombstones.mu.Unlock()
	if c, ok := store.(ClosedReporter); ok && c.Closed() {
		return
	}
	if e, ok := tombstones.m[k]; ok {
		e.Value.(*tombstone).row = row
		tombstones.order.MoveToBack(e)
		return
	}
	if len(tombstones.m) >= maxTombstones {
		oldest := tombstones.order.Front()
		tombstones.order.Remove(oldest)
		delete(tombstones.m, oldest.Value.(*tombstone).k)
	}
	tombstones.m[k] = tombstones.order.PushBack(&tombstone{k, row})
}

// takeReleased returns and forgets the released row remembered for key on
// store.
func takeReleased(store Store, key string) (string, bool) {
	k := tombKey{storeIdentity(store), key}
	tombstones.mu.Lock()
	defer tombstones.mu.Unlock()
	e := dropLocked(k)
	if e == nil {
		return "", false
	}
	return e.Value.(*tombstone).row, true
}

// forgetReleased forgets the released row remembered for key on store.
func forgetReleased(store Store, key string) {
	k := tombKey{storeIdentity(store), key}
	tombstones.mu.Lock()
	defer tombstones.mu.Unlock()
	dropLocked(k)
}

// forgetReleasedOf forgets every released row remembered for store, a
// store's identity, for [ForgetStore].
func forgetReleasedOf(store Store) {
	tombstones.mu.Lock()
	defer tombstones.mu.Unlock()
	for e := tombstones.order.Front(); e != nil; {
		next := e.Next()
		if t := e.Value.(*tombstone); t.k.store == store {
			delete(tombstones.m, t.k)
			tombstones.order.Remove(e)
		}
		e = next
	}
}

// dropLocked removes k from the memo and returns its element, nil when it
// holds none. tombstones.mu is held.
func dropLocked(k tombKey) *list.Element {
	e, ok := tombstones.m[k]
	if !ok {
		return nil
	}
	delete(tombstones.m, k)
	tombstones.order.Remove(e)
	return e
}
