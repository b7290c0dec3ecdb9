package runlease_test

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// binaryValues are values a checkpoint may hold that a Store cannot keep as
// text, and text values that must stay text, each with its name.
func binaryValues() map[string]string {
	rnd := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 4096)
	for i := range random {
		random[i] = byte(rnd.UintN(256))
	}
	return map[string]string{
		"empty":             "",
		"text":              `{"step":3,"state":"naïve ✓"}`,
		"nul":               "a\x00b",
		"invalid_utf8":      "\xff\xfe\xfd",
		"lone_surrogate":    "\xed\xa0\x80",
		"random_bytes":      string(random),
		"looks_enveloped":   runlease.BinaryValuePrefix + "AAAA",
		"just_the_prefix":   runlease.BinaryValuePrefix,
		"longest_binary":    strings.Repeat("\x00", runlease.MaxBinaryValueLen),
		"longest_text":      strings.Repeat("t", runlease.MaxValueLen),
		"percent_underline": "%_\\",
	}
}

// TestFencedWriteKeepsBinaryValues writes every kind of value through a
// fenced write and reads it back, through Lease.Read and through the raw
// store with DecodeValue, byte for byte; text stays text in the store, so
// other readers of the table see it as it was written.
func TestFencedWriteKeepsBinaryValues(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		l, err := runlease.Acquire(ctx, s, "bin", "A")
		require.NoError(t, err)
		for name, v := range binaryValues() {
			key := "ckpt:bin:" + name
			require.NoError(t, l.Write(ctx, runlease.Put(key, v)), name)
			got, found, err := l.Read(ctx, key)
			require.NoError(t, err, name)
			require.True(t, found, name)
			require.True(t, got == v, "%s: Read returned %d bytes, not the %d written", name, len(got), len(v))

			stored := get(t, s, key)
			decoded, err := runlease.DecodeValue(stored)
			require.NoError(t, err, name)
			require.True(t, decoded == v, "%s: DecodeValue of the stored form", name)
			if runlease.CheckValue(v) == nil && !strings.HasPrefix(v, runlease.BinaryValuePrefix) {
				assert.True(t, stored == v, "%s: text is stored as it is", name)
			} else {
				assert.True(t, strings.HasPrefix(stored, runlease.BinaryValuePrefix), "%s: stored in the envelope", name)
			}
		}
		_, found, err := l.Read(ctx, "ckpt:bin:absent")
		require.NoError(t, err)
		assert.False(t, found)
	})
}

// TestFencedWriteIfComparesCheckpoints advances a checkpoint only from the
// value it was computed from, on both stores: a stale condition writes
// nothing and renews nothing, and the lease stays usable.
func TestFencedWriteIfComparesCheckpoints(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		clk := testkit.NewClock(time.Now().Truncate(time.Millisecond).UTC())
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
		l, err := runlease.Acquire(ctx, s, "cas", "A", opts...)
		require.NoError(t, err)
		const key = "ckpt:cas"
		first, second := "\x00one", "\x00two" // binary: compared in their stored form

		require.NoError(t, l.WriteIf(ctx, []runlease.Cond{runlease.IfAbsent(key)}, runlease.Put(key, first)))
		clk.Advance(time.Second)
		expiry := l.Expiry()
		before := rows(t, s)

		err = l.WriteIf(ctx, []runlease.Cond{runlease.IfAbsent(key)}, runlease.Put(key, second))
		require.ErrorIs(t, err, runlease.ErrConditionFailed)
		assert.Equal(t, "RUN-E025", runlease.Code(err))
		require.NotErrorIs(t, err, runlease.ErrLeaseLost)
		err = l.WriteIf(ctx, []runlease.Cond{runlease.IfEquals(key, second)}, runlease.Put(key, "x"), runlease.Put("out:cas", "y"))
		require.ErrorIs(t, err, runlease.ErrConditionFailed)
		assert.Equal(t, before, rows(t, s), "a refused condition writes nothing, the lease row included")
		assert.Equal(t, expiry, l.Expiry(), "and renews nothing")

		require.NoError(t, l.WriteIf(ctx, []runlease.Cond{runlease.IfEquals(key, first)}, runlease.Put(key, second)))
		got, _, err := l.Read(ctx, key)
		require.NoError(t, err)
		assert.True(t, got == second)
		assert.False(t, l.Expiry().Before(clk.Now().Add(runlease.MinTTL)), "a write whose conditions hold renews the lease")

		clk.Advance(runlease.MinTTL + time.Second) // past the stamps the refused writes used up
		b, err := runlease.Acquire(ctx, s, "cas", "B", opts...)
		require.NoError(t, err)
		err = l.WriteIf(ctx, []runlease.Cond{runlease.IfEquals(key, second)}, runlease.Put(key, "stale"))
		require.ErrorIs(t, err, runlease.ErrLeaseLost, "a replaced driver is told of the loss, not of a condition")
		require.NotErrorIs(t, err, runlease.ErrConditionFailed)
		require.NoError(t, b.WriteIf(ctx, []runlease.Cond{runlease.IfEquals(key, second)}, runlease.Put(key, "next")))
	})
}

// TestLeaseReadOnlyWhileHeld reads through a lease that was taken over, and
// one that was released: neither returns a value, both report the loss, and
// every later call fails the same way.
func TestLeaseReadOnlyWhileHeld(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(time.Now().Truncate(time.Millisecond).UTC())
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}

	a, err := runlease.Acquire(ctx, s, "r", "A", opts...)
	require.NoError(t, err)
	require.NoError(t, a.Write(ctx, runlease.Put("ckpt:r", "a-1")))
	clk.Advance(runlease.MinTTL + time.Second)
	b, err := runlease.Acquire(ctx, s, "r", "B", opts...)
	require.NoError(t, err)
	require.NoError(t, b.Write(ctx, runlease.Put("ckpt:r", "b-1")))

	v, found, err := a.Read(ctx, "ckpt:r")
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	assert.Equal(t, "", v, "no value is returned once the lease is lost")
	assert.False(t, found)
	require.ErrorIs(t, a.Renew(ctx), runlease.ErrTakenOver, "the loss is the lease's")

	v, _, err = b.Read(ctx, "ckpt:r")
	require.NoError(t, err)
	assert.Equal(t, "b-1", v)
	require.NoError(t, b.Release(ctx))
	_, _, err = b.Read(ctx, "ckpt:r")
	require.ErrorIs(t, err, runlease.ErrReleased)

	_, _, err = b.Read(ctx, "runlease:r")
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, "the library's own rows are not the caller's keys")
	_, _, err = b.Read(ctx, "k\x00")
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
}

// TestLeaseReadAdoptsOwnRow reads after a renewal whose reply was lost and
// whose read-back failed: the row in the store is the lease's own, newer
// than the one it last confirmed, and Read must take it as held, not lost.
func TestLeaseReadAdoptsOwnRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := &testkit.Faulty{Store: newSQLite(t)}
	l, err := runlease.Acquire(ctx, f, "r", "A")
	require.NoError(t, err)
	require.NoError(t, l.Write(ctx, runlease.Put("ckpt:r", "1")))

	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
	f.FailReads(1)
	require.ErrorIs(t, l.Renew(ctx), runlease.ErrOutcomeUnknown, "landed, but the read-back failed")

	v, found, err := l.Read(ctx, "ckpt:r")
	require.NoError(t, err, "the lease row is this lease's own")
	assert.True(t, found)
	assert.Equal(t, "1", v)
	require.NoError(t, l.Renew(ctx), "and the lease goes on from it")
}

// TestLeaseReadRefusesABrokenEnvelope reads a value in the binary envelope
// that does not decode: a coded corrupt-row error, the stored text intact.
func TestLeaseReadRefusesABrokenEnvelope(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	l, err := runlease.Acquire(ctx, s, "r", "A")
	require.NoError(t, err)
	broken := runlease.BinaryValuePrefix + "not base64!"
	put(t, s, "ckpt:r", broken)
	_, _, err = l.Read(ctx, "ckpt:r")
	require.ErrorIs(t, err, runlease.ErrCorruptRow)
	assert.Equal(t, "RUN-E002", runlease.Code(err))
	assert.Equal(t, broken, get(t, s, "ckpt:r"))
	require.NoError(t, l.Renew(ctx), "a corrupt value of the caller's is not a loss")
}

// TestFencedWriteLimitsTextThatLooksEnveloped writes text that starts with
// the envelope's prefix: kept in the envelope, so its limit is the binary
// one, and a value one byte over is refused with a message that says why.
func TestFencedWriteLimitsTextThatLooksEnveloped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	l, err := runlease.Acquire(ctx, s, "pt", "A")
	require.NoError(t, err)
	longest := runlease.BinaryValuePrefix + strings.Repeat("a", runlease.MaxBinaryValueLen-len(runlease.BinaryValuePrefix))
	require.NoError(t, l.Write(ctx, runlease.Put("ckpt:pt", longest)))
	got, _, err := l.Read(ctx, "ckpt:pt")
	require.NoError(t, err)
	require.True(t, got == longest)
	before := rows(t, s)
	err = l.Write(ctx, runlease.Put("ckpt:pt", longest+"a"))
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "starting with")
	assert.Equal(t, before, rows(t, s))
}
