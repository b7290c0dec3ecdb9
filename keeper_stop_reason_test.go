package runlease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestAKeeperWhoseContextEndsSaysWhyEverywhere: when the context given to
// Keep ends, the README says Err and context.Cause(keeper.Context()) say
// why: both are ErrKeeperStopped wrapping the context's cause, in a message
// of one line, whether the work context was taken before or after the end.
func TestAKeeperWhoseContextEndsSaysWhyEverywhere(t *testing.T) {
	t.Parallel()
	shutdown := errors.New("shutting down")
	for _, before := range []bool{true, false} {
		name := map[bool]string{true: "work_context_taken_before", false: "work_context_taken_after"}[before]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := bubbleStore(t)
				l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(5*time.Second))
				require.NoError(t, err)
				ctx, cancel := context.WithCancelCause(t.Context())
				k, err := runlease.Keep(ctx, l)
				require.NoError(t, err)
				defer k.Stop()
				var work context.Context
				if before {
					work = k.Context()
				}

				cancel(shutdown)
				// Err judges the context at once, before the keeper's watch of
				// it has run.
				require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
				<-k.Done()
				if !before {
					work = k.Context()
				}
				<-work.Done()
				for what, err := range map[string]error{"Err": k.Err(), "the work context's cause": context.Cause(work)} {
					assert.ErrorIs(t, err, runlease.ErrKeeperStopped, what)
					assert.ErrorIs(t, err, shutdown, what)
					assert.NotErrorIs(t, err, runlease.ErrLeaseLost, what)
					assert.Equal(t, "RUN-E024: keeper stopped: shutting down", err.Error(), what)
					assert.Equal(t, runlease.CodeKeeperStopped, runlease.Code(err), what)
				}
				// A call on the lease through the work context says so too.
				assert.ErrorIs(t, l.Write(work, runlease.Put("ckpt:r1", "1")), runlease.ErrKeeperStopped)
				info, err := runlease.Peek(t.Context(), s, "r1")
				require.NoError(t, err)
				assert.True(t, info.Live, "stopping does not release")
			})
		})
	}
}

// TestAKeepersWorkContextKeepsItsParentsDeadlineAndValues: the work context
// is cancelled by the keeper, not by its parent directly, yet it carries
// the parent's deadline and values, and ends, with the keeper's reason, when
// the deadline passes.
func TestAKeepersWorkContextKeepsItsParentsDeadlineAndValues(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := bubbleStore(t)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(5*time.Second))
		require.NoError(t, err)
		type key struct{}
		deadline := time.Now().Add(time.Minute)
		ctx, cancel := context.WithDeadline(context.WithValue(t.Context(), key{}, "v"), deadline)
		defer cancel()
		k, err := runlease.Keep(ctx, l)
		require.NoError(t, err)
		defer k.Stop()
		work := k.Context()
		got, ok := work.Deadline()
		require.True(t, ok)
		assert.Equal(t, deadline, got)
		assert.Equal(t, "v", work.Value(key{}))

		time.Sleep(time.Minute)
		<-work.Done()
		assert.ErrorIs(t, context.Cause(work), runlease.ErrKeeperStopped)
		assert.ErrorIs(t, context.Cause(work), context.DeadlineExceeded)
		assert.Equal(t, k.Err(), context.Cause(work))
	})
}

// TestKeepWithAnEndedContextReturnsAnEndedKeeper: a keeper started with a
// context that has ended has ended, with that reason, when Keep returns.
func TestKeepWithAnEndedContextReturnsAnEndedKeeper(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := bubbleStore(t)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(5*time.Second))
		require.NoError(t, err)
		ctx, cancel := context.WithCancelCause(t.Context())
		cancel(errors.New("gone"))
		k, err := runlease.Keep(ctx, l)
		require.NoError(t, err)
		select {
		case <-k.Done():
		default:
			t.Fatal("Keep returned a running keeper for an ended context")
		}
		assert.Equal(t, "RUN-E024: keeper stopped: gone", k.Err().Error())
		assert.Equal(t, k.Err(), context.Cause(k.Context()))
	})
}

// TestKeeperReleaseReportsALeaseLostBefore: Keeper.Release reports a lease
// lost before it was called as that *LeaseLostError, as its godoc says,
// including a release by an operator (`runlease release`) that a renewal
// found, which Lease.Release alone accepts as released; a lease its own
// driver released is not lost, and releasing it again succeeds.
func TestKeeperReleaseReportsALeaseLostBefore(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	cases := []struct {
		name  string
		lose  func(t *testing.T, s runlease.Store, k *runlease.Keeper)
		cause error // nil: Release succeeds
	}{{
		name: "released_by_an_operator_found_by_Renew",
		lose: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			forceRelease(t, s)
			require.ErrorIs(t, k.Lease().Renew(t.Context()), runlease.ErrReleased)
		},
		cause: runlease.ErrReleased,
	}, {
		name: "released_by_an_operator_found_by_the_keeper",
		lose: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			forceRelease(t, s)
			<-k.Done()
		},
		cause: runlease.ErrReleased,
	}, {
		name: "taken_over",
		lose: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			cur := get(t, s, "runlease:r1")
			ok, err := s.MetaCAS(t.Context(), "runlease:r1", &cur, `{"holder":"B","fence":9,"until_ms":1}`)
			require.NoError(t, err)
			require.True(t, ok)
			<-k.Done()
		},
		cause: runlease.ErrTakenOver,
	}, {
		name: "released_by_its_own_driver",
		lose: func(t *testing.T, _ runlease.Store, k *runlease.Keeper) {
			require.NoError(t, k.Lease().Release(t.Context()))
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := bubbleStore(t)
				l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
				require.NoError(t, err)
				k, err := runlease.Keep(t.Context(), l)
				require.NoError(t, err)
				tc.lose(t, s, k)
				err = k.Release(t.Context())
				if tc.cause == nil {
					require.NoError(t, err)
					return
				}
				var lost *runlease.LeaseLostError
				require.ErrorAs(t, err, &lost)
				require.ErrorIs(t, err, tc.cause)
				require.ErrorIs(t, err, runlease.ErrLeaseLost)
			})
		})
	}
}

// endsSilently is a context that reports itself ended (Err) without ever
// closing Done once end is called: the moment between a context's end and
// the keeper's watch of it, held open.
type endsSilently struct {
	context.Context
	ended atomic.Bool
}

func (c *endsSilently) end() { c.ended.Store(true) }

func (c *endsSilently) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

// TestAKeeperWhoseContextEndedTrustsNothingBeforeItsWatchRuns: once the
// context given to Keep has ended, TrustedUntil reports no trust, even
// before the keeper's watch of the context has ended it.
func TestAKeeperWhoseContextEndedTrustsNothingBeforeItsWatchRuns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := bubbleStore(t)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(5*time.Second))
		require.NoError(t, err)
		ctx := &endsSilently{Context: t.Context()}
		k, err := runlease.Keep(ctx, l)
		require.NoError(t, err)
		defer k.Stop()
		require.True(t, k.TrustedUntil().After(time.Now()), "trusted while its context runs")

		ctx.end()
		assert.False(t, k.TrustedUntil().After(time.Now()), "TrustedUntil %v reports trust after Keep's context ended", k.TrustedUntil())
		require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
		assert.False(t, k.TrustedUntil().After(time.Now()))
	})
}
