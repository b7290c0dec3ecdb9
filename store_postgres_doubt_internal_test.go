package runlease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

// TestPgDoubtsKeepAKeyInDoubtUntilAWriteOfItLands: a write of unknown
// outcome puts its keys in doubt; only a write that changed the row and was
// acknowledged takes a key out, since only its commit waited for the
// standby after the write in doubt. A refused write, a fault that changed
// nothing and a write of another key leave the doubt as it was.
func TestPgDoubtsKeepAKeyInDoubtUntilAWriteOfItLands(t *testing.T) {
	t.Parallel()
	unknown := &StorageError{Op: "MetaCAS", Key: "k", Unknown: true, Err: errors.New("reset")}
	notApplied := &StorageError{Op: "MetaCAS", Key: "k", Err: errors.New("refused")}
	var d pgDoubts
	assert.False(t, d.has("k"))
	d.note(unknown, false, 7, "k", "other")
	assert.True(t, d.has("k"))
	assert.True(t, d.has("other"))
	for _, step := range []struct {
		name   string
		err    error
		landed bool
		key    string
	}{
		{"refused", nil, false, "k"},
		{"not applied", notApplied, false, "k"},
		{"another key landed", nil, true, "third"},
	} {
		d.note(step.err, step.landed, 8, step.key)
		assert.True(t, d.has("k"), "after %s, k is still in doubt", step.name)
	}
	d.note(nil, true, 8, "k")
	assert.False(t, d.has("k"), "a write of k landed")
	assert.True(t, d.has("other"))
}

// TestPgDoubtsSettleOnlyWhatTheBarrierCovers: a barrier settles the keys
// noted up to the note it was taken after whose backend it found done; a
// key whose backend was busy, or noted again since, keeps its doubt.
func TestPgDoubtsSettleOnlyWhatTheBarrierCovers(t *testing.T) {
	t.Parallel()
	unknown := &StorageError{Op: "MetaCAS", Key: "k", Unknown: true, Err: errors.New("reset")}
	var d pgDoubts
	d.note(unknown, false, 7, "a", "b")
	d.note(unknown, false, 9, "c")
	pids, gen := d.backends()
	assert.ElementsMatch(t, []int32{7, 9}, pids)
	d.note(unknown, false, 7, "b") // after the barrier was taken
	d.note(unknown, false, 11, "d")
	d.settle(gen, pids, []int32{9})
	assert.False(t, d.has("a"), "a's backend was done before the barrier")
	assert.True(t, d.has("b"), "b was noted again after the barrier was taken")
	assert.True(t, d.has("c"), "c's backend was busy")
	assert.True(t, d.has("d"), "d's backend was not asked about")
	pids, gen = d.backends()
	d.settle(gen, pids, nil)
	assert.False(t, d.any(), "a barrier that found every backend done settles all")
}

// TestPostgresBarrierReadSettlesDoubtsOfGoneBackends: on a real server, a
// read through the barrier settles every key in doubt whose write's backend
// has exited, or is the barrier's own, and keeps the keys of a backend
// still there (in a transaction, or idle, which may have the write still
// to read) until a later barrier finds it gone. A key in doubt that nothing
// reads or writes again thus does not stay.
func TestPostgresBarrierReadSettlesDoubtsOfGoneBackends(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = 1 // every call runs on one backend, the barrier's own
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := newPgOnTable(t, pool)
	unknown := &StorageError{Op: "MetaCAS", Key: "k", Unknown: true, Err: errors.New("reply lost")}
	backend := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, pgtest.DSN(t))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	gone, idle, inTx := backend(), backend(), backend()
	goneID := gone.PgConn().PID()
	require.NoError(t, gone.Close(ctx))
	_, err = inTx.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = inTx.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	// The pool's own backend: a write on it ended before the barrier ran.
	pooled, err := pool.Acquire(ctx)
	require.NoError(t, err)
	ownID := pooled.Conn().PgConn().PID()
	pooled.Release()

	s.doubts.note(unknown, false, goneID, "gone")
	s.doubts.note(unknown, false, idle.PgConn().PID(), "idle")
	s.doubts.note(unknown, false, inTx.PgConn().PID(), "in-tx")
	s.doubts.note(unknown, false, ownID, "own")
	require.Eventually(t, func() bool { // an exited backend leaves pg_stat_activity at once, or nearly
		_, _, err := s.MetaGet(ctx, "gone")
		require.NoError(t, err)
		return !s.doubts.has("gone")
	}, 10*time.Second, 20*time.Millisecond)
	assert.True(t, s.doubts.has("idle"), "an idle backend may still have the write to read")
	assert.True(t, s.doubts.has("in-tx"), "a backend in a transaction may still commit the write")
	assert.False(t, s.doubts.has("own"), "the barrier's own backend ran the write before it")

	_, err = inTx.Exec(ctx, "COMMIT")
	require.NoError(t, err)
	require.NoError(t, inTx.Close(ctx))
	require.NoError(t, idle.Close(ctx))
	require.Eventually(t, func() bool {
		for _, key := range []string{"idle", "in-tx"} { // a read of a key in doubt goes through the barrier
			_, _, err = s.MetaGet(ctx, key)
			require.NoError(t, err)
		}
		return !s.doubts.any()
	}, 10*time.Second, 20*time.Millisecond, "once their backends have exited, no key stays in doubt")
}
