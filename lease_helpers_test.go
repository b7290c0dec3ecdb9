package runlease_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/testkit"
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newSQLite opens an embedded store in a fresh temporary folder.
func newSQLite(t *testing.T) *runlease.SQLiteStore {
	t.Helper()
	s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// rows returns every row of the store, to prove a call wrote nothing.
func rows(t *testing.T, s runlease.Store) []runlease.Row {
	t.Helper()
	r, err := s.MetaScan(t.Context(), "")
	require.NoError(t, err)
	return r
}

func put(t *testing.T, s runlease.Store, key, value string) {
	t.Helper()
	ok, err := s.MetaCAS(t.Context(), key, nil, value)
	require.NoError(t, err)
	require.True(t, ok)
}

func get(t *testing.T, s runlease.Store, key string) string {
	t.Helper()
	v, found, err := s.MetaGet(t.Context(), key)
	require.NoError(t, err)
	require.True(t, found, "no row at %q", key)
	return v
}

// deadlinePassed is a context whose deadline has passed while the timer
// that ends it has not run yet: Err is still nil and Done still open, as a
// context's are between its deadline and its timer's goroutine. Shared by
// the tests of AcquireWait and ClaimSlotsWait at their deadline.
type deadlinePassed struct{ context.Context }

func (deadlinePassed) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// bothStores runs fn on the embedded store and, when the Postgres tests are
// enabled, on the shared one.
func bothStores(t *testing.T, fn func(t *testing.T, s runlease.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		fn(t, newSQLite(t))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, openPG(t, pgtest.DSN(t), pgtest.NewTable(t, pgtest.Pool(t))))
	})
}

// openPG opens a store on a fresh table of the test server.
func openPG(t *testing.T, dsn, table string, opts ...runlease.PostgresOption) *runlease.PostgresStore {
	t.Helper()
	s, err := runlease.OpenPostgres(t.Context(), dsn, append([]runlease.PostgresOption{runlease.WithTable(table)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// faultyBubble returns a fault-injecting store over an embedded store, made
// inside a synctest bubble, that renews many leases at once as the embedded
// store does.
func faultyBubble(t *testing.T) testkit.FaultyMulti {
	t.Helper()
	return testkit.FaultyMulti{Faulty: &testkit.Faulty{Store: bubbleStore(t)}}
}

// forceRelease releases run r1 as an operator does.
func forceRelease(t *testing.T, s runlease.Store) {
	t.Helper()
	info, err := runlease.Peek(t.Context(), s, "r1")
	require.NoError(t, err)
	require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
}

// slowReplies is a SQLite store whose writes land at once and whose
// replies come back a delay later, as over a slow network: the row a write
// stamped has been in the store, ageing, since the write was sent. It
// records when the last write that landed was sent. Once hung, writes land
// nothing and return only when their context ends.
type slowReplies struct {
	*runlease.SQLiteStore
	delay time.Duration
	mu    sync.Mutex
	sent  time.Time // when the last write that landed was sent
	hung  bool
	many  int // MetaCASMany calls
}

func (s *slowReplies) write(ctx context.Context, op string, do func() (bool, error)) (bool, error) {
	start := time.Now()
	s.mu.Lock()
	hung := s.hung
	s.mu.Unlock()
	if hung {
		<-ctx.Done()
		return false, &runlease.StorageError{Op: op, Err: ctx.Err()}
	}
	landed, err := do()
	if landed && err == nil {
		s.mu.Lock()
		s.sent = start
		s.mu.Unlock()
	}
	time.Sleep(s.delay) // the reply is on its way
	return landed, err
}

func (s *slowReplies) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return s.write(ctx, "MetaCAS", func() (bool, error) { return s.SQLiteStore.MetaCAS(ctx, key, expected, value) })
}

func (s *slowReplies) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	s.mu.Lock()
	s.many++
	s.mu.Unlock()
	var swapped []bool
	_, err := s.write(ctx, "MetaCASMany", func() (bool, error) {
		var err error
		swapped, err = s.SQLiteStore.MetaCASMany(ctx, writes)
		return len(swapped) > 0 && swapped[0], err
	})
	return swapped, err
}

func (s *slowReplies) lastSent() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

func (s *slowReplies) hang() {
	s.mu.Lock()
	s.hung = true
	s.mu.Unlock()
}

// stillClock is an expiry clock that reads epoch whatever the time.
func stillClock(time.Time) func() time.Time { return func() time.Time { return epoch } }

// laggingClock is an expiry clock that runs at a quarter of the speed of
// the monotonic clock from start.
func laggingClock(start time.Time) func() time.Time {
	return func() time.Time { return epoch.Add(time.Since(start) / 4) }
}

// readHook is a Batcher store that runs a function after a read of a key,
// before the reply: another writer's move between two reads of one call.
type readHook struct {
	runlease.Store
	mu    sync.Mutex
	after map[string]func()
}

func (h *readHook) on(key string, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.after == nil {
		h.after = map[string]func(){}
	}
	h.after[key] = fn
}

func (h *readHook) MetaGet(ctx context.Context, key string) (string, bool, error) {
	v, found, err := h.Store.MetaGet(ctx, key)
	h.mu.Lock()
	fn := h.after[key]
	delete(h.after, key)
	h.mu.Unlock()
	if fn != nil {
		fn()
	}
	return v, found, err
}

func (h *readHook) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	return h.Store.(runlease.Batcher).MetaBatch(ctx, conds, ops)
}

// wrapped is a decorator of a store that says which store it wraps.
type wrapped struct{ *testkit.Faulty }

func (w wrapped) Unwrap() runlease.Store { return w.Faulty }
