package runlease_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

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
