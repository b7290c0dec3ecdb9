package runlease

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

// TestCloseWaitsForTheListenerItsLingerIsStopping: the linger's timer
// fires after the last subscription ended, and its stop of the listener
// is under way (here held up by a transaction that locks the key's mark,
// which the stopping mark loop deletes) when the store is closed. Close
// must not return before the listening goroutines have exited, as it does
// not for a listener it stops itself (TestCloseStopsALingeringListener):
// they still use the pool, which the caller may close next.
func TestCloseWaitsForTheListenerItsLingerIsStopping(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	s, err := NewPostgres(t.Context(), pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	_, cancel := s.Subscribe("k")
	require.Eventually(t, func() bool {
		rows, err := s.MetaScan(ctx, WaitPrefix)
		return err == nil && len(rows) == 1
	}, 30*time.Second, 5*time.Millisecond)
	stopped := listening(s)
	require.NotNil(t, stopped)

	// Lock the mark, so that the stop's delete of it waits.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgtest.Ident(table)+" WHERE key >= $1 AND key < $2 FOR UPDATE",
		WaitPrefix, WaitPrefix+"\U0010ffff")
	require.NoError(t, err)

	cancel()
	require.Eventually(t, func() bool { return listening(s) == nil }, 30*time.Second, time.Millisecond,
		"the linger's timer stops the listener")
	require.NoError(t, s.Close())
	select {
	case <-stopped:
	default:
		t.Fatal("Close returned while the listener its linger was stopping still runs")
	}
}
