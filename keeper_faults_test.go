package runlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestKeeperFaults holds the regression cases of the keeper's concurrency
// design (CONCURRENCY.md): each subtest is a schedule that once broke a
// promise of the README.
func TestKeeperFaults(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)

	t.Run("a_hung_write_on_one_lease_does_not_freeze_the_other_keepers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := faultyBubble(t)
			var r runlease.Renewer
			defer r.Close()
			a, err := runlease.Acquire(t.Context(), s, "a", "A", five)
			require.NoError(t, err)
			b, err := runlease.Acquire(t.Context(), s, "b", "B", five)
			require.NoError(t, err)
			ka, err := r.Keep(t.Context(), a)
			require.NoError(t, err)
			kb, err := r.Keep(t.Context(), b)
			require.NoError(t, err)

			s.HangWrites(testkit.Prefix("ckpt:"))
			writeCtx, cancelWrite := context.WithCancel(t.Context())
			defer cancelWrite()
			wrote := make(chan error, 1)
			go func() { wrote <- a.Write(writeCtx, runlease.Put("ckpt:a", "1")) }()

			time.Sleep(60 * time.Second)
			require.NoError(t, kb.Err(), "the other run's keeper renews on")
			require.NoError(t, kb.Context().Err())
			_, err = runlease.Acquire(t.Context(), s, "b", "C", five)
			require.ErrorIs(t, err, runlease.ErrLeaseLost, "and its lease stays held")

			// The run whose write hangs cannot renew: its keeper gives up
			// before the row can expire, and says so without waiting.
			require.ErrorIs(t, ka.Err(), runlease.ErrTrustExpired)
			ka.Stop()
			cancelWrite()
			require.ErrorIs(t, <-wrote, runlease.ErrOutcomeUnknown)
		})
	})

	t.Run("overlapping_batched_renewals_do_not_deadlock", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			l1, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			l2, err := runlease.Acquire(t.Context(), s, "r2", "A", five)
			require.NoError(t, err)
			// Two renewers each keep both leases, in opposite order, so
			// their batches share both leases at the same instants.
			var r1, r2 runlease.Renewer
			var keepers []*runlease.Keeper
			for _, pair := range [][2]*runlease.Lease{{l1, l2}, {l2, l1}} {
				r := &r1
				if pair[0] == l2 {
					r = &r2
				}
				for _, l := range pair {
					k, err := r.Keep(t.Context(), l)
					require.NoError(t, err)
					keepers = append(keepers, k)
				}
			}
			time.Sleep(60 * time.Second)
			for i, k := range keepers {
				require.NoError(t, k.Err(), "keeper %d", i)
			}
			require.NoError(t, l1.Renew(t.Context()), "no call on a lease hangs")
			r1.Close()
			r2.Close()
		})
	})

	t.Run("options_that_cannot_apply_to_a_held_lease_are_refused", func(t *testing.T) {
		s := newSQLite(t)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
		require.NoError(t, err)
		for _, opt := range []runlease.Option{
			runlease.WithTTL(time.Hour), runlease.WithClock(time.Now), runlease.WithWaitPoll(time.Second),
			runlease.KeepInterval(time.Nanosecond), runlease.KeepSlots(nil),
		} {
			k, err := runlease.Keep(t.Context(), l, opt)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			require.Nil(t, k)
		}
		_, err = runlease.Peek(t.Context(), s, "r1", runlease.WithTTL(time.Minute))
		require.ErrorIs(t, err, runlease.ErrInvalidArgument, "Peek judges; it has no TTL to apply")
		_, err = runlease.AcquireWait(t.Context(), s, "r1", "B", runlease.WithWaitPoll(time.Nanosecond))
		require.ErrorIs(t, err, runlease.ErrInvalidArgument, "a poll that would hammer the store")
	})

	t.Run("an_explicit_zero_margin_is_kept", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			start := time.Now()
			k, err := runlease.Keep(t.Context(), l, runlease.KeepMargin(0))
			require.NoError(t, err)
			defer k.Stop()
			assert.Equal(t, start.Add(5*time.Second), k.TrustedUntil(), "trust to the very expiry, as asked")
		})
	})

	t.Run("a_loss_found_by_a_fenced_write_ends_the_keeper_at_once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			a, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), a)
			require.NoError(t, err)
			work := k.Context() // taken first, as a driver does
			// An operator frees the run and another driver takes it, all
			// between two renewals of A's keeper.
			info, err := runlease.Peek(t.Context(), s, "r1")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
			_, err = runlease.Acquire(t.Context(), s, "r1", "B", five)
			require.NoError(t, err)

			err = a.Write(t.Context(), runlease.Put("ckpt:r1", "late"))
			require.ErrorIs(t, err, runlease.ErrTakenOver)
			require.ErrorIs(t, k.Err(), runlease.ErrTakenOver, "before the keeper's own loop runs")
			require.ErrorIs(t, context.Cause(work), runlease.ErrTakenOver)
			select {
			case <-work.Done():
			default:
				t.Fatal("the work context taken before the loss is still live")
			}
		})
	})

	t.Run("a_call_with_an_ended_keepers_context_returns_the_keepers_cause", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			work := k.Context()
			k.Stop()
			err = l.Write(work, runlease.Put("ckpt:r1", "x"))
			require.ErrorIs(t, err, runlease.ErrKeeperStopped, "not a storage fault a retry loop would spin on")
			assert.NotErrorIs(t, err, runlease.ErrStorage)
			require.ErrorIs(t, l.Renew(work), runlease.ErrKeeperStopped)
		})
	})

	t.Run("stop_and_close_cut_a_hung_batched_renewal_short", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := faultyBubble(t)
			var r runlease.Renewer
			var keepers []*runlease.Keeper
			for _, run := range []string{"r1", "r2", "r3"} {
				l, err := runlease.Acquire(t.Context(), s, run, "A", runlease.WithTTL(time.Hour))
				require.NoError(t, err)
				k, err := r.Keep(t.Context(), l)
				require.NoError(t, err)
				keepers = append(keepers, k)
			}
			s.HangWrites(testkit.Prefix(runlease.LeasePrefix))
			time.Sleep(21 * time.Minute) // the batch is due at 20 min, and hangs
			start := time.Now()
			keepers[0].Stop()
			assert.Zero(t, time.Since(start), "Stop does not wait for the trust deadline, 34 minutes away")
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			err := keepers[0].Release(ctx)
			require.ErrorIs(t, err, context.DeadlineExceeded, "a release on a hung store ends with its context")
			assert.Equal(t, time.Second, time.Since(start))
			r.Close()
			assert.Equal(t, time.Second, time.Since(start), "Close cuts the batch short")
		})
	})
}
