package runlease_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/proctest"
)

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
