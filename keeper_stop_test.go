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

// TestKeepAfterTrustRanOut: a keeper started on a lease whose trust window
// has already run out must have ended, its work context cancelled, when
// Keep returns. Its row may have expired already, so a contender can be
// granted the run at once: waiting for the Renewer's loop to notice (which
// may run late, here because another keeper's Lost hook holds it) would
// leave two drivers trusting the run.
func TestKeepAfterTrustRanOut(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	for _, shared := range []bool{true, false} {
		name := map[bool]string{true: "shared_renewer", false: "own_renewer"}[shared]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := faultyBubble(t)
				var r runlease.Renewer
				defer r.Close()
				l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
				require.NoError(t, err)

				// The first keeper's renewals hang until its trust window
				// ends; the loop then runs its Lost hook, which stalls.
				entered, resume := make(chan struct{}), make(chan struct{})
				defer close(resume)
				stall := runlease.WithHooks(runlease.Hooks{Lost: func(runlease.LossEvent) {
					close(entered)
					<-resume
				}})
				s.HangWrites(testkit.Prefix(runlease.LeasePrefix))
				k1, err := r.Keep(t.Context(), l, stall)
				require.NoError(t, err)
				<-entered
				require.ErrorIs(t, k1.Err(), runlease.ErrTrustExpired)
				time.Sleep(time.Second) // the row expires: takeover is open
				s.HangWrites(nil)

				keep := r.Keep
				if !shared {
					keep = runlease.Keep
				}
				k2, err := keep(t.Context(), l)
				require.NoError(t, err)
				select {
				case <-k2.Done():
				default:
					t.Fatal("Keep returned a running keeper of a lease whose trust window ran out")
				}
				require.ErrorIs(t, context.Cause(k2.Context()), runlease.ErrTrustExpired)
				require.ErrorIs(t, k2.Err(), runlease.ErrTrustExpired)

				// The contender that may now be granted the run finds no
				// keeper of A's still trusting it.
				_, err = runlease.Acquire(t.Context(), s, "r1", "B", five)
				require.NoError(t, err)
				require.Error(t, k2.Context().Err())
				k2.Stop()
			})
		})
	}
}

// TestKeepOfAnExpiredLeaseEndsAtOnce keeps a lease whose trust
// window ran out, on a shared Renewer and on one of its own, with a context
// that can end, while Release and the context's end race it: the keeper has
// ended when Keep returns, its work context is cancelled, the Lost hook runs
// at most once, and no goroutine is left behind (synctest waits for them).
func TestKeepOfAnExpiredLeaseEndsAtOnce(t *testing.T) {
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

// lateReadStore makes every read of one key, once armed, wait until its
// context ends and then answer with the row as stored: a read that
// completed just as its caller gave up on it.
type lateReadStore struct {
	runlease.Store
	key     string
	armed   atomic.Bool
	waiting atomic.Int32
}

func (s *lateReadStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if key == s.key && s.armed.Load() {
		s.waiting.Add(1)
		<-ctx.Done()
		s.waiting.Add(-1)
		return s.Store.MetaGet(context.WithoutCancel(ctx), key)
	}
	return s.Store.MetaGet(ctx, key)
}

// TestKeeperReleaseReportsLoss holds Keeper.Release's promise that a lease
// released by someone else before is reported as a *LeaseLostError, when
// the keeper's own renewal in flight is what finds the release.
func TestKeeperReleaseReportsLoss(t *testing.T) {
	t.Parallel()

	t.Run("a_release_found_by_the_renewal_Stop_waits_for_is_reported", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			raw := bubbleStore(t)
			ctx := t.Context()
			s := &lateReadStore{Store: raw, key: runlease.LeasePrefix + "b"}
			l, err := runlease.Acquire(ctx, s, "b", "B", runlease.WithTTL(5*time.Second))
			require.NoError(t, err)
			k, err := runlease.Keep(ctx, l, runlease.KeepInterval(time.Second))
			require.NoError(t, err)
			info, err := runlease.Peek(ctx, raw, "b")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(ctx, raw, info))
			s.armed.Store(true)
			// The renewal's write is refused, and its read-back waits.
			for s.waiting.Load() == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			synctest.Wait()
			require.NoError(t, k.Err(), "the loss is not known yet")

			err = k.Release(ctx)
			require.ErrorIs(t, err, runlease.ErrLeaseLost, "an operator released the lease before")
			require.ErrorIs(t, err, runlease.ErrReleased)
		})
	})
}

// requireEnded fails t unless k has ended and its work context, taken
// before, is cancelled. It reads Done and the work context only, never
// Err, which would itself end a keeper whose lease is known lost.
func requireEnded(t *testing.T, k *runlease.Keeper, work context.Context, msg string) {
	t.Helper()
	select {
	case <-k.Done():
	default:
		t.Fatalf("%s: the keeper is still running", msg)
	}
	select {
	case <-work.Done():
	default:
		t.Fatalf("%s: the work context is still live", msg)
	}
}

// TestALossFoundByACallEndsTheKeepersBeforeItReturns checks the bound of
// CONCURRENCY.md: a keeper whose lease is lost by any call ends before that
// call returns, not when its own loop next looks at it.
func TestALossFoundByACallEndsTheKeepersBeforeItReturns(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	for _, call := range []struct {
		name string
		do   func(context.Context, *runlease.Lease) error
	}{
		{"fenced_write", func(ctx context.Context, l *runlease.Lease) error {
			return l.Write(ctx, runlease.Put("ckpt:r1", "late"))
		}},
		{"renew", func(ctx context.Context, l *runlease.Lease) error { return l.Renew(ctx) }},
	} {
		t.Run(call.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := bubbleStore(t)
				a, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
				require.NoError(t, err)
				k, err := runlease.Keep(t.Context(), a)
				require.NoError(t, err)
				work := k.Context()
				// Another driver takes the run between two renewals of A's
				// keeper, after an operator freed it.
				info, err := runlease.Peek(t.Context(), s, "r1")
				require.NoError(t, err)
				require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
				_, err = runlease.Acquire(t.Context(), s, "r1", "B", five)
				require.NoError(t, err)

				require.ErrorIs(t, call.do(t.Context(), a), runlease.ErrTakenOver)
				requireEnded(t, k, work, "once the call that found the loss returned")
				require.ErrorIs(t, context.Cause(work), runlease.ErrTakenOver)
			})
		})
	}
}

// TestReleaseStopsTheKeepersFirst checks that Lease.Release stops the
// lease's keepers before it writes, with ErrKeeperStopped: the run's work
// stops at once, even while the release itself hangs, and a release is
// never reported as a loss.
func TestReleaseStopsTheKeepersFirst(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)

	t.Run("while_the_release_hangs", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			l, err := runlease.Acquire(t.Context(), f, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			work := k.Context()
			f.HangWrites(testkit.Prefix(runlease.LeasePrefix))
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			released := make(chan error, 1)
			go func() { released <- l.Release(ctx) }()
			synctest.Wait() // the release's write hangs
			requireEnded(t, k, work, "while the release is in flight")
			require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
			require.Error(t, <-released, "the hung release ends with its context")
		})
	})

	t.Run("a_release_that_lands_is_not_a_loss", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			ev := &events{}
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five, runlease.WithHooks(ev.hooks()))
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			require.NoError(t, l.Release(t.Context()))
			require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
			require.NotErrorIs(t, k.Err(), runlease.ErrLeaseLost)
			_, _, lost := ev.counts()
			assert.Zero(t, lost, "the Lost hook does not fire for the holder's own release")
		})
	})
}
