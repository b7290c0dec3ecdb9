package runlease_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

func TestFencedWrites(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		clk := testkit.NewClock(time.Now().Truncate(time.Millisecond).UTC())
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}

		a, err := runlease.Acquire(ctx, s, "r1", "A", opts...)
		require.NoError(t, err)
		clk.Advance(2 * time.Second)
		require.NoError(t, a.Write(ctx, runlease.Put("ckpt:r1", "step-1"), runlease.Put("out:r1:1", "x")))
		assert.Equal(t, "step-1", get(t, s, "ckpt:r1"))
		assert.Equal(t, clk.Now().Add(runlease.MinTTL), a.Expiry(), "a fenced write renews the lease")

		clk.Advance(runlease.MinTTL) // A stalls past its TTL
		b, err := runlease.Acquire(ctx, s, "r1", "B", opts...)
		require.NoError(t, err)
		require.NoError(t, b.Write(ctx, runlease.Put("ckpt:r1", "step-1b"), runlease.Delete("out:r1:1")))
		before := rows(t, s)

		err = a.Write(ctx, runlease.Put("ckpt:r1", "step-2"), runlease.Put("out:r1:2", "late"))
		require.ErrorIs(t, err, runlease.ErrLeaseLost)
		require.ErrorIs(t, err, runlease.ErrTakenOver)
		assert.Equal(t, "RUN-E021", runlease.Code(err))
		assert.Equal(t, before, rows(t, s), "the stalled driver's checkpoint does not land")
	})
}

func TestFencedWriteBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	l, err := runlease.Acquire(t.Context(), s, "r1", "A")
	require.NoError(t, err)
	before := rows(t, s)
	for name, ops := range map[string][]runlease.Op{
		"no_ops":          nil,
		"lease_namespace": {runlease.Put("runlease:r2", "x")},
		"slot_namespace":  {runlease.Delete("runslot:mem:0")},
		"invalid_key":     {runlease.Put("k\x00", "v")},
		"binary_too_long": {runlease.Put("k", strings.Repeat("\xff", runlease.MaxBinaryValueLen+1))},
		"text_too_long":   {runlease.Put("k", strings.Repeat("x", runlease.MaxValueLen+1))},
		"two_ops_one_key": {runlease.Put("k", "1"), runlease.Put("k", "2")},
	} {
		require.ErrorIs(t, l.Write(t.Context(), ops...), runlease.ErrInvalidArgument, name)
		assert.Equal(t, before, rows(t, s), name)
	}
	plain := &testkit.Counting{Store: s} // hides MetaBatch
	l2, err := runlease.Acquire(t.Context(), plain, "r2", "A")
	require.NoError(t, err)
	require.ErrorIs(t, l2.Write(t.Context(), runlease.Put("k", "v")), runlease.ErrInvalidArgument)
	require.NoError(t, l.Renew(t.Context()), "the lease is intact")
}

func TestFencedWriteWithUnknownOutcome(t *testing.T) {
	t.Parallel()
	f := &testkit.Faulty{Store: newSQLite(t)}
	l, err := runlease.Acquire(t.Context(), f, "r1", "A")
	require.NoError(t, err)

	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaBatch")})
	require.NoError(t, l.Write(t.Context(), runlease.Put("ckpt:r1", "1")), "landed: resolved by reading the lease row")
	assert.Equal(t, "1", get(t, f, "ckpt:r1"))

	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaBatch")})
	err = l.Write(t.Context(), runlease.Put("ckpt:r1", "2"))
	require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
	require.NotErrorIs(t, err, runlease.ErrLeaseLost)
	assert.Equal(t, "1", get(t, f, "ckpt:r1"), "did not land, and the caller was told it may not have")
	require.NoError(t, l.Write(t.Context(), runlease.Put("ckpt:r1", "2")))
	assert.Equal(t, "2", get(t, f, "ckpt:r1"))
}

func TestFencedWriteWhoseOutcomeIsUnknownAndLeaseTakenIsNotCalledUnwritten(t *testing.T) {
	t.Parallel()
	inner := newSQLite(t)
	f := &testkit.Faulty{Store: inner}
	l, err := runlease.Acquire(t.Context(), f, "r1", "A")
	require.NoError(t, err)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaBatch"), Then: func() {
		cur := get(t, inner, "runlease:r1") // a successor takes over right after the batch landed
		ok, err := inner.MetaCAS(t.Context(), "runlease:r1", &cur, `{"holder":"B","fence":2,"until_ms":1}`)
		require.NoError(t, err)
		require.True(t, ok)
	}})
	err = l.Write(t.Context(), runlease.Put("ckpt:r1", "1"))
	require.ErrorIs(t, err, runlease.ErrLeaseLost)
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	require.ErrorIs(t, err, runlease.ErrOutcomeUnknown, "the checkpoint may have landed: it did")
	assert.Equal(t, "1", get(t, inner, "ckpt:r1"))
	require.ErrorIs(t, l.Renew(t.Context()), runlease.ErrLeaseLost)
}
