package runlease

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSQLiteWritesAreDurableOnReturn pins the settings behind the README's
// durability promise: WAL with synchronous=FULL on the writing connection,
// so every commit (acquire, takeover, release, renewal, fenced write) is on
// disk before the call returns and survives power loss; and readers that
// cannot write.
func TestSQLiteWritesAreDurableOnReturn(t *testing.T) {
	t.Parallel()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	defer s.Close()

	var mode string
	require.NoError(t, s.w.QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode))
	assert.Equal(t, "wal", mode)
	var sync int
	require.NoError(t, s.w.QueryRowContext(t.Context(), "PRAGMA synchronous").Scan(&sync))
	assert.Equal(t, 2, sync, "synchronous=FULL: a WAL commit is synced before it returns")

	// A batch runs in the same connection, so it is as durable.
	tx, err := s.w.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRowContext(t.Context(), "PRAGMA synchronous").Scan(&sync))
	assert.Equal(t, 2, sync)
	require.NoError(t, tx.Rollback())

	var queryOnly int
	require.NoError(t, s.r.QueryRowContext(t.Context(), "PRAGMA query_only").Scan(&queryOnly))
	assert.Equal(t, 1, queryOnly, "the reading connections cannot write")
}
