package runlease_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
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

// TestFencedWriteIfFaultsAreNeitherSuccessNorConditionFailure pins how a
// fenced conditional write reports faults: a refused condition whose reply
// was lost is an unknown outcome, never success nor a condition failure; a
// condition that held whose reply was lost is success; a refused condition
// found behind an own newer row (an earlier write that landed after all) is
// a condition failure, with the row adopted, not a loss.
func TestFencedWriteIfFaultsAreNeitherSuccessNorConditionFailure(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	inner := newSQLite(t)
	f := &testkit.Faulty{Store: inner}
	l, err := runlease.Acquire(ctx, f, "wi", "A")
	require.NoError(t, err)
	const key = "ckpt:wi"
	require.NoError(t, l.Write(ctx, runlease.Put(key, "\x00v1")))

	// The condition fails; the reply is lost after the store refused it.
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaBatch")})
	err = l.WriteIf(ctx, []runlease.Cond{runlease.IfEquals(key, "\x00v0")}, runlease.Put(key, "\x00v2"))
	require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
	require.NotErrorIs(t, err, runlease.ErrConditionFailed)
	require.NotErrorIs(t, err, runlease.ErrLeaseLost)
	v, _, err := l.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "\x00v1", v)

	// The condition holds; the batch landed and its reply was lost.
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaBatch")})
	require.NoError(t, l.WriteIf(ctx, []runlease.Cond{runlease.IfEquals(key, "\x00v1")}, runlease.Put(key, "\x00v2")))
	v, _, err = l.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "\x00v2", v)

	// A renewal lands, but its reply and read-back are lost: the row is an
	// own row newer than the lease knows. A stale condition then fails as
	// a condition, after adopting the row.
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
	f.FailReads(1)
	require.ErrorIs(t, l.Renew(ctx), runlease.ErrOutcomeUnknown)
	before := rows(t, inner)
	err = l.WriteIf(ctx, []runlease.Cond{runlease.IfEquals(key, "\x00v1")}, runlease.Put(key, "\x00v3"))
	require.ErrorIs(t, err, runlease.ErrConditionFailed)
	require.NotErrorIs(t, err, runlease.ErrLeaseLost)
	assert.Equal(t, before, rows(t, inner), "a refused condition writes nothing")
	require.NoError(t, l.WriteIf(ctx, []runlease.Cond{runlease.IfEquals(key, "\x00v2")}, runlease.Put(key, "\x00v3")))

	// The condition fails and the reply is lost, while a successor takes
	// over: the loss is reported, and the outcome is in doubt.
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaBatch"), Then: func() {
		cur := get(t, inner, "runlease:wi")
		ok, err := inner.MetaCAS(ctx, "runlease:wi", &cur, `{"holder":"B","fence":9,"until_ms":1}`)
		require.NoError(t, err)
		require.True(t, ok)
	}})
	err = l.WriteIf(ctx, []runlease.Cond{runlease.IfAbsent(key)}, runlease.Put(key, "x"))
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	require.NotErrorIs(t, err, runlease.ErrConditionFailed)
	_, _, err = l.Read(ctx, key)
	require.ErrorIs(t, err, runlease.ErrTakenOver)
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

// TestLeaseReadSeesATakeoverBetweenItsReads lets a successor take the
// run and write the key between Read's read of the key and its read of the
// lease row: Read returns no value and the loss. An own newer row found
// there instead (an earlier write that landed after all, its reply lost) is
// adopted.
func TestLeaseReadSeesATakeoverBetweenItsReads(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	inner := newSQLite(t)
	h := &readHook{Store: inner}
	f := &testkit.Faulty{Store: h}
	clk := testkit.NewClock(time.Now().Truncate(time.Millisecond).UTC())
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	a, err := runlease.Acquire(ctx, f, "rd", "A", opts...)
	require.NoError(t, err)
	require.NoError(t, a.Write(ctx, runlease.Put("ckpt:rd", "a-1")))

	// An own newer row: a renewal that landed, whose reply and read-back
	// were lost.
	clk.Advance(time.Millisecond)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
	f.FailReads(1)
	require.ErrorIs(t, a.Renew(ctx), runlease.ErrOutcomeUnknown)
	v, found, err := a.Read(ctx, "ckpt:rd")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "a-1", v)
	require.NoError(t, a.Renew(ctx), "the adopted row is written over")

	var b *runlease.Lease
	h.on("ckpt:rd", func() {
		clk.Advance(runlease.MinTTL + time.Second)
		var err error
		b, err = runlease.Acquire(ctx, inner, "rd", "B", opts...)
		require.NoError(t, err)
		require.NoError(t, b.Write(ctx, runlease.Put("ckpt:rd", "b-1")))
	})
	v, found, err = a.Read(ctx, "ckpt:rd")
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	assert.False(t, found)
	assert.Equal(t, "", v)
	require.ErrorIs(t, a.Write(ctx, runlease.Put("ckpt:rd", "a-2")), runlease.ErrLeaseLost)
	assert.Equal(t, "b-1", get(t, inner, "ckpt:rd"))
}

// TestLeaseReadBesideBatchedKeepers reads through leases whose keepers
// share one Renewer on a store that renews many at once, so that batches
// try the tokens Reads hold: no call waits for another, every keeper keeps
// trusting, and every read returns the value.
func TestLeaseReadBesideBatchedKeepers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	var r runlease.Renewer
	defer r.Close()
	const n = 8
	leases := make([]*runlease.Lease, n)
	keepers := make([]*runlease.Keeper, n)
	for i := range leases {
		id := "kb" + string(rune('a'+i))
		l, err := runlease.Acquire(ctx, s, id, "A", runlease.WithTTL(runlease.MinTTL))
		require.NoError(t, err)
		require.NoError(t, l.Write(ctx, runlease.Put("ckpt:"+id, id)))
		k, err := r.Keep(ctx, l, runlease.KeepInterval(runlease.MinKeepInterval))
		require.NoError(t, err)
		leases[i], keepers[i] = l, k
	}
	deadline := time.Now().Add(700 * time.Millisecond)
	var wg sync.WaitGroup
	var reads atomic.Int64
	for i, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := "kb" + string(rune('a'+i))
			for time.Now().Before(deadline) {
				cctx, cancel := context.WithTimeout(keepers[i].Context(), 2*time.Second)
				v, found, err := l.Read(cctx, "ckpt:"+id)
				cancel()
				if !assert.NoError(t, err) || !assert.True(t, found) || !assert.Equal(t, id, v) {
					return
				}
				reads.Add(1)
			}
		}()
	}
	wg.Wait()
	for _, k := range keepers {
		require.NoError(t, k.Err())
	}
	assert.Positive(t, reads.Load())
}
