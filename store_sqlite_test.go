package runlease_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
	"github.com/areev/runlease/storetest"
)

// TestHelperProcess is the entry point of child processes started with
// proctest.Start; in an ordinary run it skips. Every role of this package's
// test binary, from any test file, is dispatched from here.
func TestHelperProcess(t *testing.T) { proctest.Dispatch(t) }

// Roles played by child processes, and the environment variable that gives
// them the store's path.
var (
	roleSQLiteHold    = proctest.Register("sqlite-hold", sqliteHoldRole)
	roleSQLiteTryOpen = proctest.Register("sqlite-try-open", sqliteTryOpenRole)
)

const (
	envSQLitePath = "RUNLEASE_TEST_SQLITE_PATH"

	// Exit codes of the sqlite-try-open role.
	exitOpened = 0
	exitLocked = 3

	// childTimeout bounds each wait for a child; starting a race-enabled
	// test binary can take a second or two on a loaded machine.
	childTimeout = 30 * time.Second
)

// sqliteHoldRole opens the store, writes a row, prints "ready" and holds the
// store until released or killed.
func sqliteHoldRole() int {
	s, err := runlease.OpenSQLite(os.Getenv(envSQLitePath))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	if _, err := s.MetaCAS(context.Background(), "written-by", nil, "child"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	proctest.WaitRelease()
	return 0
}

// sqliteTryOpenRole opens the store and closes it again; its exit code says
// whether the open was refused as locked.
func sqliteTryOpenRole() int {
	s, err := runlease.OpenSQLite(os.Getenv(envSQLitePath))
	switch {
	case errors.Is(err, runlease.ErrStoreLocked):
		fmt.Println(err)
		return exitLocked
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return exitOpened
}

// verifyNoLeaks fails t if goroutines started during t outlive it (and
// t's cleanups, which close the stores). It must be called first in a
// top-level test that does not call t.Parallel, so that no other test runs
// in the meantime.
func verifyNoLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

// sqlitePath returns a path for a new store file in a fresh directory.
func sqlitePath(t *testing.T) string { return filepath.Join(t.TempDir(), "store.db") }

// openSQLite opens the store at path, fails t on an error, and closes the
// store when t ends.
func openSQLite(t *testing.T, path string) *runlease.SQLiteStore {
	t.Helper()
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// requireLocked opens path and requires a prompt ErrStoreLocked. The bound
// is far below SQLite's busy timeout, so waiting on a database lock instead
// of failing at once shows up here.
func requireLocked(t *testing.T, path string) {
	t.Helper()
	type result struct {
		s   *runlease.SQLiteStore
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := runlease.OpenSQLite(path)
		ch <- result{s, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("OpenSQLite(%q) of a held store did not return within 5s", path)
	}
	if r.err == nil {
		r.s.Close()
	}
	require.ErrorIs(t, r.err, runlease.ErrStoreLocked, "OpenSQLite(%q)", path)
	var locked *runlease.StoreLockedError
	require.ErrorAs(t, r.err, &locked)
	assert.Equal(t, path, locked.Path)
	assert.Equal(t, runlease.CodeStoreLocked, runlease.Code(r.err))
}

func TestSQLiteConformance(t *testing.T) {
	verifyNoLeaks(t)
	t.Run("file", func(t *testing.T) {
		t.Parallel()
		storetest.RunWith(t, sqliteHarness())
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) runlease.Store {
			return openSQLite(t, ":memory:")
		})
	})
}

func TestSQLiteLockInProcess(t *testing.T) {
	verifyNoLeaks(t)

	t.Run("a_second_open_of_the_same_file_fails_at_once_with_ErrStoreLocked", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		s := openSQLite(t, path)
		requireLocked(t, path)
		// The refused open must not have disturbed the holder's lock (an
		// fcntl lock would have been dropped when the second opener closed
		// its descriptor).
		requireLocked(t, path)
		ok, err := s.MetaCAS(t.Context(), "k", nil, "v")
		require.NoError(t, err)
		assert.True(t, ok)
	})

	t.Run("another_spelling_of_the_path_opens_the_same_locked_store", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		path := filepath.Join(dir, "store.db")
		openSQLite(t, path)
		linkDir := filepath.Join(t.TempDir(), "link")
		require.NoError(t, os.Symlink(dir, linkDir))
		linkFile := filepath.Join(t.TempDir(), "store-link.db")
		require.NoError(t, os.Symlink(path, linkFile))
		for _, p := range []string{
			dir + "/./store.db",
			dir + "//store.db",
			dir + "/../" + filepath.Base(dir) + "/store.db",
			filepath.Join(linkDir, "store.db"),
			linkFile,
		} {
			requireLocked(t, p)
		}
	})

	t.Run("after_close_the_store_reopens_with_its_data", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		s, err := runlease.OpenSQLite(path)
		require.NoError(t, err)
		ok, err := s.MetaCAS(t.Context(), "k", nil, "before close")
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, s.Close())

		s = openSQLite(t, path)
		v, found, err := s.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, "before close", v)
	})
}

func TestSQLiteLockAcrossProcesses(t *testing.T) {
	systest.Mark(t) // starts processes
	if runtime.GOOS == "windows" {
		t.Skip("the writer lock is enforced within one process only on this platform")
	}
	verifyNoLeaks(t)

	t.Run("a_store_held_by_another_process_is_locked_until_that_process_is_killed", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		child := proctest.Start(t, roleSQLiteHold, envSQLitePath+"="+path)
		require.NoError(t, child.WaitLine("ready", childTimeout))
		requireLocked(t, path)

		// A crash releases the lock: the very next open succeeds, with no
		// retry, and finds the row the child wrote before it died.
		child.Kill()
		s, err := runlease.OpenSQLite(path)
		require.NoError(t, err, "the first open after the holder died")
		t.Cleanup(func() { assert.NoError(t, s.Close()) })
		v, found, err := s.MetaGet(t.Context(), "written-by")
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, "child", v)
	})

	t.Run("another_process_cannot_open_a_store_this_process_holds", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		s, err := runlease.OpenSQLite(path)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() }) // in case the test fails before it closes s

		child := proctest.Start(t, roleSQLiteTryOpen, envSQLitePath+"="+path)
		code, err := child.Wait(childTimeout)
		require.NoError(t, err)
		require.Equal(t, exitLocked, code, "child output: %q\n%s", child.Lines(), child.Stderr())

		require.NoError(t, s.Close())
		child = proctest.Start(t, roleSQLiteTryOpen, envSQLitePath+"="+path)
		code, err = child.Wait(childTimeout)
		require.NoError(t, err)
		require.Equal(t, exitOpened, code, "child output: %q\n%s", child.Lines(), child.Stderr())
	})

	t.Run("a_released_holder_closes_cleanly_and_unlocks_the_store", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		child := proctest.Start(t, roleSQLiteHold, envSQLitePath+"="+path)
		require.NoError(t, child.WaitLine("ready", childTimeout))
		child.Release()
		code, err := child.Wait(childTimeout)
		require.NoError(t, err)
		require.Equal(t, 0, code, "child stderr:\n%s", child.Stderr())
		openSQLite(t, path)
	})
}

func TestSQLiteClose(t *testing.T) {
	verifyNoLeaks(t)
	for _, name := range []string{"file", ":memory:"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := name
			if name == "file" {
				path = sqlitePath(t)
			}
			s, err := runlease.OpenSQLite(path)
			require.NoError(t, err)
			ok, err := s.MetaCAS(t.Context(), "k", nil, "v")
			require.NoError(t, err)
			require.True(t, ok)

			require.NoError(t, s.Close())
			require.NoError(t, s.Close(), "Close is idempotent")

			ctx := t.Context()
			_, _, err = s.MetaGet(ctx, "k")
			assert.ErrorIs(t, err, runlease.ErrStoreClosed, "MetaGet")
			_, err = s.MetaCAS(ctx, "k", nil, "v")
			assert.ErrorIs(t, err, runlease.ErrStoreClosed, "MetaCAS")
			v := "v"
			_, err = s.MetaCAS(ctx, "k", &v, "w")
			assert.ErrorIs(t, err, runlease.ErrStoreClosed, "MetaCAS with expected")
			_, err = s.MetaDelete(ctx, "k", "v")
			assert.ErrorIs(t, err, runlease.ErrStoreClosed, "MetaDelete")
			_, err = s.MetaScan(ctx, "")
			assert.ErrorIs(t, err, runlease.ErrStoreClosed, "MetaScan")
		})
	}
}

func TestSQLiteCallsRacingCloseFailOnlyWithErrStoreClosed(t *testing.T) {
	verifyNoLeaks(t)
	s, err := runlease.OpenSQLite(sqlitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })

	const workers, ops = 8, 200
	var wg sync.WaitGroup
	var done atomic.Int64
	halfway := make(chan struct{})
	errs := make([][]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range ops {
				key := fmt.Sprintf("k/%d/%d", w, i)
				_, err1 := s.MetaCAS(t.Context(), key, nil, "v")
				_, _, err2 := s.MetaGet(t.Context(), key)
				_, err3 := s.MetaScan(t.Context(), "k/")
				_, err4 := s.MetaDelete(t.Context(), key, "v")
				for _, err := range []error{err1, err2, err3, err4} {
					if err != nil && !errors.Is(err, runlease.ErrStoreClosed) {
						errs[w] = append(errs[w], err)
					}
				}
				if done.Add(1) == workers*ops/4 {
					close(halfway)
				}
			}
		})
	}
	<-halfway
	require.NoError(t, s.Close())
	wg.Wait()
	require.NoError(t, errors.Join(slices.Concat(errs...)...),
		"a call overlapping Close either completes or fails with ErrStoreClosed")
}

func TestSQLiteFileIsWAL(t *testing.T) {
	verifyNoLeaks(t)
	path := sqlitePath(t)
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	ok, err := s.MetaCAS(t.Context(), "k", nil, "v")
	require.NoError(t, err)
	require.True(t, ok)
	assert.FileExists(t, path+"-wal", "a WAL store has a -wal file while open")
	require.NoError(t, s.Close())

	// Bytes 18 and 19 of the database header are the file format's write
	// and read versions: 2 means WAL, 1 means a rollback journal.
	f, err := os.Open(path)
	require.NoError(t, err)
	header := make([]byte, 100)
	_, err = f.ReadAt(header, 0)
	require.NoError(t, f.Close())
	require.NoError(t, err)
	assert.Equal(t, "SQLite format 3\x00", string(header[:16]))
	assert.Equal(t, []byte{2, 2}, header[18:20], "file format versions (2 = WAL)")

	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var mode string
	require.NoError(t, db.QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode))
	assert.Equal(t, "wal", mode)
}

func TestOpenSQLiteRefusesAnEmptyPath(t *testing.T) {
	t.Parallel()
	_, err := runlease.OpenSQLite("")
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
}

// requireHardLinkRefused requires that opening path, for writing and for
// reading, is refused with a coded error naming the hard links.
func requireHardLinkRefused(t *testing.T, path string) {
	t.Helper()
	s, err := runlease.OpenSQLite(path)
	if err == nil {
		s.Close()
	}
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, "OpenSQLite(%q)", path)
	assert.Contains(t, err.Error(), "has 2 hard links")
	r, err := runlease.OpenSQLiteReadOnly(path)
	if err == nil {
		r.Close()
	}
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, "OpenSQLiteReadOnly(%q)", path)
	assert.Contains(t, err.Error(), "has 2 hard links")
}

func TestSQLiteLockFollowsTheFile(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the writer lock is enforced within one process, by path, on this platform")
	}
	verifyNoLeaks(t)

	t.Run("a_deleted_lock_file_lets_no_second_writer_in", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		s := openSQLite(t, path)
		require.NoError(t, os.Remove(path+".lock"))
		requireLocked(t, path)
		requireLocked(t, path) // the refused opens disturbed nothing
		putRow(t, s, "k", "still the writer")
		assert.Equal(t, "still the writer", getRow(t, s, "k"))
	})

	t.Run("a_second_name_of_an_open_store_is_refused_with_a_clear_error", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		s := openSQLite(t, path)
		putRow(t, s, "k", "v")
		link := filepath.Join(t.TempDir(), "other-name.db")
		require.NoError(t, os.Link(path, link))
		requireHardLinkRefused(t, link)
		requireLocked(t, path)
		putRow(t, s, "k2", "the writer is undisturbed")
		assert.Equal(t, "the writer is undisturbed", getRow(t, s, "k2"))
	})

	t.Run("a_hard_linked_store_is_refused_until_it_has_one_name_again", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		s, err := runlease.OpenSQLite(path)
		require.NoError(t, err)
		putRow(t, s, "k", "kept")
		require.NoError(t, s.Close())
		link := filepath.Join(filepath.Dir(path), "backup.db")
		require.NoError(t, os.Link(path, link))
		requireHardLinkRefused(t, path)
		requireHardLinkRefused(t, link)

		require.NoError(t, os.Remove(link))
		s = openSQLite(t, path)
		assert.Equal(t, "kept", getRow(t, s, "k"))
	})
}

func TestSQLiteLockFollowsTheFileAcrossProcesses(t *testing.T) {
	systest.Mark(t) // starts processes
	if runtime.GOOS == "windows" {
		t.Skip("the writer lock is enforced within one process only on this platform")
	}
	verifyNoLeaks(t)

	t.Run("a_deleted_lock_file_lets_no_writer_in_from_this_process", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		child := proctest.Start(t, roleSQLiteHold, envSQLitePath+"="+path)
		require.NoError(t, child.WaitLine("ready", childTimeout))
		require.NoError(t, os.Remove(path+".lock"))
		requireLocked(t, path)

		child.Kill()
		s := openSQLite(t, path)
		assert.Equal(t, "child", getRow(t, s, "written-by"), "the first open after the holder died")
	})

	t.Run("a_deleted_lock_file_lets_no_writer_in_from_another_process", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		s, err := runlease.OpenSQLite(path)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		require.NoError(t, os.Remove(path+".lock"))

		child := proctest.Start(t, roleSQLiteTryOpen, envSQLitePath+"="+path)
		code, err := child.Wait(childTimeout)
		require.NoError(t, err)
		require.Equal(t, exitLocked, code, "child output: %q\n%s", child.Lines(), child.Stderr())
		putRow(t, s, "k", "still the writer")

		require.NoError(t, s.Close())
		child = proctest.Start(t, roleSQLiteTryOpen, envSQLitePath+"="+path)
		code, err = child.Wait(childTimeout)
		require.NoError(t, err)
		require.Equal(t, exitOpened, code, "child output: %q\n%s", child.Lines(), child.Stderr())
	})

	t.Run("a_second_name_of_a_store_another_process_holds_is_refused", func(t *testing.T) {
		t.Parallel()
		path := sqlitePath(t)
		child := proctest.Start(t, roleSQLiteHold, envSQLitePath+"="+path)
		require.NoError(t, child.WaitLine("ready", childTimeout))
		link := filepath.Join(t.TempDir(), "other-name.db")
		require.NoError(t, os.Link(path, link))
		requireHardLinkRefused(t, link)
	})
}

// putRow creates the row key, failing t unless it was written.
func putRow(t *testing.T, s runlease.Store, key, value string) {
	t.Helper()
	ok, err := s.MetaCAS(t.Context(), key, nil, value)
	require.NoError(t, err)
	require.True(t, ok, "the row %q existed", key)
}

// getRow reads the row key, failing t unless it exists.
func getRow(t *testing.T, s runlease.Store, key string) string {
	t.Helper()
	v, found, err := s.MetaGet(t.Context(), key)
	require.NoError(t, err)
	require.True(t, found, "no row at %q", key)
	return v
}

func TestSQLiteReadOnlyOpenBesideTheWriter(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "runs.db")
	w, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	defer w.Close()
	put(t, w, "runlease:r1", `{"holder":"A","fence":1,"until_ms":1}`)

	r, err := runlease.OpenSQLiteReadOnly(path)
	require.NoError(t, err, "no writer lock is taken")
	defer r.Close()
	assert.Equal(t, `{"holder":"A","fence":1,"until_ms":1}`, get(t, r, "runlease:r1"))

	put(t, w, "runlease:r2", "x")
	assert.Len(t, rows(t, r), 2, "the reader sees the writer's later commits")

	ok, err := r.MetaCAS(t.Context(), "runlease:r3", nil, "y")
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	assert.False(t, ok)
	_, err = r.MetaDelete(t.Context(), "runlease:r1", `{"holder":"A","fence":1,"until_ms":1}`)
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	assert.Len(t, rows(t, w), 2, "nothing written through the reader")

	_, err = runlease.OpenSQLite(path)
	require.ErrorIs(t, err, runlease.ErrStoreLocked, "the reader did not take the writer's place")
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
}

func TestSQLiteReadOnlyOpenNeverCreatesAStore(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "missing.db")
	_, err := runlease.OpenSQLiteReadOnly(path)
	require.ErrorIs(t, err, runlease.ErrStorage)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = runlease.OpenSQLiteReadOnly(":memory:")
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
}
