package runlease

import (
	"context"
	"sync"
)

// A principal's turn: the waiters of one process that take a place or are
// admitted without waiting (both move the principal's fair-share mark, by
// compare-and-swap) take turns per Store value and principal, each from
// its read to its write. Racing them would gain nothing: all but one
// would be refused on the mark and read again, and under contention a
// process's waiters of one principal spent most of their round trips so.
// Waiters of other processes still race, and the mark's condition keeps
// them right.
//
// turns.mu is a leaf lock, held only to find, make or drop a turn; a turn
// is a one-slot channel taken with the waiter's context, held across the
// waiter's store calls (as a lease's write token is) and the backoff of at
// most 50 ms after a refused or failed write, never across the wait's
// sleep. A waiter takes no other turn while it holds one, and a fenced
// admission takes its lease's write token after it, never before.
var turns = struct {
	mu sync.Mutex
	m  map[turnKey]*turn
}{m: map[turnKey]*turn{}}

type turnKey struct {
	store     Store
	principal string
}

type turn struct {
	ch   chan struct{}
	refs int // guarded by turns.mu
}

// takeTurn waits for the principal's turn on store, and returns the
// function that gives it back, or ctx's error.
func takeTurn(ctx context.Context, store Store, principal string) (func(), error) {
	k := turnKey{store, principal}
	turns.mu.Lock()
	t := turns.m[k]
	if t == nil {
		t = &turn{ch: make(chan struct{}, 1)}
		turns.m[k] = t
	}
	t.refs++
	turns.mu.Unlock()
	drop := func() {
		turns.mu.Lock()
		if t.refs--; t.refs == 0 {
			delete(turns.m, k)
		}
		turns.mu.Unlock()
	}
	select {
	case t.ch <- struct{}{}:
		return func() { <-t.ch; drop() }, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}
