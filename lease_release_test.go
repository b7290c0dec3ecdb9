package runlease_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestAfterAFailedReleaseOnlyReleaseMayFollow pins what Release's
// documentation says of a release that failed: the row may still be held,
// yet Renew, Write and Keep answer ErrReleased at once, without asking the
// store, and a retried Release is what ends it.
func TestAfterAFailedReleaseOnlyReleaseMayFollow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := &testkit.Faulty{Store: newSQLite(t)}
	l, err := runlease.Acquire(ctx, f, "r1", "A")
	require.NoError(t, err)
	held := get(t, f, "runlease:r1")

	f.Next(testkit.Fault{Apply: false, Err: testkit.NotApplied("MetaCAS")})
	err = l.Release(ctx)
	require.ErrorIs(t, err, runlease.ErrStorage)
	require.NotErrorIs(t, err, runlease.ErrOutcomeUnknown)
	require.Equal(t, held, get(t, f, "runlease:r1"), "the release did not land: the row is still held")

	// Every call but Release answers without the store: a store that is
	// down would turn any call that asked it into a fault.
	f.SetDown(true)
	for name, call := range map[string]func() error{
		"Renew": func() error { return l.Renew(ctx) },
		"Write": func() error { return l.Write(ctx, runlease.Put("ckpt:r1", "1")) },
		"Keep": func() error {
			k, err := runlease.Keep(ctx, l)
			if k != nil {
				k.Stop()
			}
			return err
		},
	} {
		err := call()
		require.ErrorIs(t, err, runlease.ErrReleased, "%s after a failed Release", name)
		assert.ErrorIs(t, err, runlease.ErrLeaseLost, name)
		assert.NotErrorIs(t, err, runlease.ErrStorage, "%s asked the store", name)
	}
	f.SetDown(false)
	require.Equal(t, held, get(t, f, "runlease:r1"), "nothing was written meanwhile")
	_, found, err := f.MetaGet(ctx, "ckpt:r1")
	require.NoError(t, err)
	require.False(t, found)

	require.NoError(t, l.Release(ctx), "Release may follow, and ends it")
	info, err := runlease.Peek(ctx, f, "r1")
	require.NoError(t, err)
	assert.True(t, info.Released)
}

// TestARetriedReleaseAfterALostReply pins what Release's documentation
// says of a release whose reply was lost: retried, it succeeds while the
// row is its own tombstone, and once another holder took the run it
// returns RUN-E021, the run being that holder's, whose row it leaves alone.
func TestARetriedReleaseAfterALostReply(t *testing.T) {
	t.Parallel()
	// setup acquires r1 for A and releases it with the reply lost and the
	// read-back failing, so that the release's outcome stays unknown.
	setup := func(t *testing.T) (*testkit.Faulty, *runlease.Lease) {
		t.Helper()
		f := &testkit.Faulty{Store: newSQLite(t)}
		l, err := runlease.Acquire(t.Context(), f, "r1", "A")
		require.NoError(t, err)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, l.Release(t.Context()), runlease.ErrOutcomeUnknown)
		info, err := runlease.Peek(t.Context(), f, "r1")
		require.NoError(t, err)
		require.True(t, info.Released, "the release landed; only its reply was lost")
		return f, l
	}

	t.Run("succeeds_while_the_row_is_its_own_tombstone", func(t *testing.T) {
		t.Parallel()
		_, l := setup(t)
		require.NoError(t, l.Release(t.Context()))
	})

	t.Run("is_a_loss_once_another_holder_took_the_run", func(t *testing.T) {
		t.Parallel()
		f, l := setup(t)
		b, err := runlease.Acquire(t.Context(), f, "r1", "B")
		require.NoError(t, err)
		row := get(t, f, "runlease:r1")

		err = l.Release(t.Context())
		require.ErrorIs(t, err, runlease.ErrLeaseLost)
		require.ErrorIs(t, err, runlease.ErrTakenOver)
		assert.Equal(t, runlease.CodeLeaseLost, runlease.Code(err))
		assert.Equal(t, row, get(t, f, "runlease:r1"), "B's lease is left alone")
		require.NoError(t, b.Renew(t.Context()), "B still holds the run")
	})
}
