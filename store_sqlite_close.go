package runlease

import (
	"errors"
	"sync"
)

// callGate lets Close wait for the calls in flight and refuse new ones. A
// write that reached SQLite may commit at any moment until it returns, so
// the writer lock must outlive it: released earlier, another process could
// open the file and write beside a commit still under way.
type callGate struct {
	mu       sync.Mutex
	shutting bool
	calls    sync.WaitGroup
	done     chan struct{} // closed once Close has finished
}

// sqliteHooks are called, when set by a test, as calls enter and leave the
// gate, as Close begins to wait, as a leader has run a group of n writes
// (committed or failed; n is 1 for a write committed alone), as a read of
// op finds every reading connection taken and is about to wait, and as a
// scan has read its nth row (from 1).
type sqliteHooks struct {
	entered, exited func(op string)
	closing         func()
	committed       func(n int)
	waiting         func(op string)
	scanned         func(n int)
}

// enter admits a call of op, or refuses it with ErrStoreClosed once Close
// began. An admitted call must call exit.
func (s *SQLiteStore) enter(op string) error {
	s.gate.mu.Lock()
	if s.gate.shutting {
		s.gate.mu.Unlock()
		return ErrStoreClosed
	}
	// Added under the lock that Close takes to set shutting, so no Add can
	// race with the Wait that follows.
	s.gate.calls.Add(1)
	s.gate.mu.Unlock()
	if s.hooks != nil && s.hooks.entered != nil {
		s.hooks.entered(op)
	}
	return nil
}

// exit ends a call admitted by enter.
func (s *SQLiteStore) exit(op string) {
	if s.hooks != nil && s.hooks.exited != nil {
		s.hooks.exited(op)
	}
	s.gate.calls.Done()
}

// Closed implements [ClosedReporter]: it reports whether Close has begun.
func (s *SQLiteStore) Closed() bool { return s.closed.Load() }

// Close refuses new calls with [ErrStoreClosed], waits for the calls in
// flight to return (a write among them either commits, durably, or fails
// with its own error), then closes the database and releases the writer
// lock. It is idempotent, and safe to call concurrently: every call returns
// only once the store is closed, the first with its error, the others nil.
// A call in flight must not wait for Close, or neither returns.
func (s *SQLiteStore) Close() error {
	s.gate.mu.Lock()
	if s.gate.shutting {
		done := s.gate.done
		s.gate.mu.Unlock()
		<-done
		return nil
	}
	s.gate.shutting = true
	s.gate.done = make(chan struct{})
	s.gate.mu.Unlock()
	defer close(s.gate.done)

	s.closed.Store(true)
	ForgetStore(s)
	if s.hooks != nil && s.hooks.closing != nil {
		s.hooks.closing()
	}
	s.gate.calls.Wait()
	var errs []error
	if s.r != s.w {
		errs = append(errs, s.r.Close())
	}
	if s.w != nil {
		errs = append(errs, s.w.Close())
	}
	// SQLite has closed the file: only now may another writer have it.
	if s.dbLock != nil {
		errs = append(errs, s.dbLock.unlock())
	}
	if s.lock != nil {
		errs = append(errs, unlockFile(s.lock))
	}
	return errors.Join(errs...)
}
