package runlease

import (
	"database/sql"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blockWrites holds SQLite's write lock on the file at path from a
// connection of its own, so that a store's write waits inside SQLite (in
// flight) until release is called.
func blockWrites(t *testing.T, path string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	conn, err := db.Conn(t.Context())
	require.NoError(t, err)
	_, err = conn.ExecContext(t.Context(), "BEGIN IMMEDIATE")
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := conn.ExecContext(t.Context(), "ROLLBACK")
			assert.NoError(t, err)
			assert.NoError(t, conn.Close())
		})
	}
	t.Cleanup(release)
	return release
}

func TestSQLiteCloseWaitsForWritesInFlight(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := OpenSQLite(path)
	require.NoError(t, err)
	release := blockWrites(t, path)

	entered := make(chan struct{})
	var exited, refusedDuringClose atomic.Bool
	var secondClose sync.WaitGroup
	var secondSawExit atomic.Bool
	s.hooks = &sqliteHooks{
		entered: func(op string) {
			if op == "MetaCAS" {
				close(entered)
			}
		},
		exited: func(op string) {
			if op == "MetaCAS" {
				exited.Store(true)
			}
		},
		closing: func() {
			// Close has begun: new calls are refused at once, even while
			// the write in flight still waits.
			_, err := s.MetaCAS(t.Context(), "late", nil, "v")
			_, _, gerr := s.MetaGet(t.Context(), "late")
			refusedDuringClose.Store(err == ErrStoreClosed && gerr == ErrStoreClosed)
			secondClose.Go(func() {
				assert.NoError(t, s.Close())
				secondSawExit.Store(exited.Load())
			})
			release()
		},
	}

	type result struct {
		ok  bool
		err error
	}
	wrote := make(chan result, 1)
	go func() {
		ok, err := s.MetaCAS(t.Context(), "runlease:r1", nil, `{"holder":"A","fence":1,"until_ms":1}`)
		wrote <- result{ok, err}
	}()
	<-entered // the write is in flight, waiting for SQLite's write lock

	require.NoError(t, s.Close())
	assert.True(t, exited.Load(), "Close returned only after the write in flight")
	r := <-wrote
	require.NoError(t, r.err)
	assert.True(t, r.ok)
	assert.True(t, refusedDuringClose.Load(), "calls made once Close began are refused with ErrStoreClosed")
	secondClose.Wait()
	assert.True(t, secondSawExit.Load(), "a concurrent Close also returns only after the write")

	s, err = OpenSQLite(path)
	require.NoError(t, err, "the lock was released")
	defer s.Close()
	v, found, err := s.MetaGet(t.Context(), "runlease:r1")
	require.NoError(t, err)
	assert.True(t, found, "the write committed before Close returned is durable")
	assert.Equal(t, `{"holder":"A","fence":1,"until_ms":1}`, v)
}
