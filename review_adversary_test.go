package runlease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestAdversaryWriteIfFaultsAreNeitherSuccessNorConditionFailure pins how a
// fenced conditional write reports faults: a refused condition whose reply
// was lost is an unknown outcome, never success nor a condition failure; a
// condition that held whose reply was lost is success; a refused condition
// found behind an own newer row (an earlier write that landed after all) is
// a condition failure, with the row adopted, not a loss.
func TestAdversaryWriteIfFaultsAreNeitherSuccessNorConditionFailure(t *testing.T) {
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

// TestAdversaryReadSeesATakeoverBetweenItsReads lets a successor take the
// run and write the key between Read's read of the key and its read of the
// lease row: Read returns no value and the loss. An own newer row found
// there instead (an earlier write that landed after all, its reply lost) is
// adopted.
func TestAdversaryReadSeesATakeoverBetweenItsReads(t *testing.T) {
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

// TestAdversaryReadBesideBatchedKeepers reads through leases whose keepers
// share one Renewer on a store that renews many at once, so that batches
// try the tokens Reads hold: no call waits for another, every keeper keeps
// trusting, and every read returns the value.
func TestAdversaryReadBesideBatchedKeepers(t *testing.T) {
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
