package runlease_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
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

// TestAdversaryKeepOfAnExpiredLeaseEndsAtOnce keeps a lease whose trust
// window ran out, on a shared Renewer and on one of its own, with a context
// that can end, while Release and the context's end race it: the keeper has
// ended when Keep returns, its work context is cancelled, the Lost hook runs
// at most once, and no goroutine is left behind (synctest waits for them).
func TestAdversaryKeepOfAnExpiredLeaseEndsAtOnce(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	for _, shared := range []bool{true, false} {
		name := map[bool]string{true: "shared_renewer", false: "own_renewer"}[shared]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := faultyBubble(t)
				var r runlease.Renewer
				defer r.Close()
				for i := range 20 {
					id := "ke" + strconv.Itoa(i)
					var lost atomic.Int64
					hooks := runlease.WithHooks(runlease.Hooks{Lost: func(runlease.LossEvent) { lost.Add(1) }})
					l, err := runlease.Acquire(t.Context(), s, id, "A", five, hooks)
					require.NoError(t, err)
					time.Sleep(4600 * time.Millisecond) // past TTL - margin
					ctx, cancel := context.WithCancel(t.Context())
					keep := r.Keep
					if !shared {
						keep = runlease.Keep
					}
					var wg sync.WaitGroup
					wg.Go(func() {
						if i%2 == 0 {
							cancel()
						}
					})
					wg.Go(func() {
						if i%3 == 0 {
							_ = l.Release(t.Context())
						}
					})
					k, err := keep(ctx, l)
					if err != nil {
						require.ErrorIs(t, err, runlease.ErrReleased)
						wg.Wait()
						cancel()
						continue
					}
					select {
					case <-k.Done():
					default:
						t.Fatal("Keep returned a live keeper of a lease whose trust ran out")
					}
					require.Error(t, k.Context().Err())
					require.Error(t, k.Err())
					wg.Wait()
					cancel()
					k.Stop()
					synctest.Wait()
					assert.LessOrEqual(t, lost.Load(), int64(1), "one end, one report")
					if i%3 != 0 {
						if err := k.Err(); i%2 != 0 || !errors.Is(err, runlease.ErrKeeperStopped) {
							require.ErrorIs(t, err, runlease.ErrTrustExpired)
						}
						require.NoError(t, l.Renew(t.Context()), "the lease itself is not lost")
						require.NoError(t, l.Release(t.Context()))
					}
				}
			})
		})
	}
}
