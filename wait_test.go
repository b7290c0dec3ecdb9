package runlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/testkit"
)

// waitFor runs AcquireWait in the background and returns its result channel.
func waitFor(ctx context.Context, s runlease.Store, runID, holder string, opts ...runlease.Option) <-chan error {
	done := make(chan error, 1)
	go func() {
		l, err := runlease.AcquireWait(ctx, s, runID, holder, opts...)
		if err == nil && l.Holder() != holder {
			err = assert.AnError
		}
		done <- err
	}()
	return done
}

func requireWoken(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second): // a liveness bound, not a latency assertion
		t.Fatal("the waiter was not woken")
	}
}

func TestAcquireWait(t *testing.T) {
	t.Parallel()
	hour := runlease.WithWaitPoll(time.Hour) // only a release or an expiry can wake a waiter

	t.Run("a_release_wakes_a_waiter_in_the_same_process", func(t *testing.T) {
		t.Parallel()
		s := newSQLite(t)
		a, err := runlease.Acquire(t.Context(), s, "r1", "A")
		require.NoError(t, err)
		done := waitFor(t.Context(), s, "r1", "B", hour)
		select {
		case err := <-done:
			t.Fatalf("acquired while held: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		require.NoError(t, a.Release(t.Context()))
		requireWoken(t, done)
	})

	t.Run("a_release_wakes_a_waiter_on_another_postgres_connection", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.DSN(t)
		table := pgtest.NewTable(t, pgtest.Pool(t))
		// The nodes name the table differently: they must share its channel.
		holderNode := openPG(t, dsn, table)
		waiterNode := readSignal{openPG(t, dsn, "public."+table), make(chan string, 16)}
		a, err := runlease.Acquire(t.Context(), holderNode, "r1", "A")
		require.NoError(t, err)
		// The listener is up before the waiter's first read, and the poll is
		// an hour away: once the waiter has seen A's live lease, only a
		// notification of r1 can wake it within the test.
		otherKey := subscribeMarked(t, waiterNode.PostgresStore, runlease.LeasePrefix+"r2")
		done := waitFor(t.Context(), waiterNode, "r1", "B", hour)
		awaitRead(t, waiterNode, runlease.LeasePrefix+"r1")
		require.NoError(t, a.Release(t.Context()))
		requireWoken(t, done)
		requireNoRow(t, otherKey, "a waiter of another run")
	})

	t.Run("a_force_release_wakes_a_waiter", func(t *testing.T) {
		t.Parallel()
		s := newSQLite(t)
		_, err := runlease.Acquire(t.Context(), s, "r1", "A")
		require.NoError(t, err)
		done := waitFor(t.Context(), s, "r1", "B", hour)
		info, err := runlease.Peek(t.Context(), s, "r1")
		require.NoError(t, err)
		require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
		requireWoken(t, done)
	})

	t.Run("without_notifications_the_waiter_polls", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := &testkit.Counting{Store: bubbleStore(t)} // not a Notifier
			a, err := runlease.Acquire(t.Context(), s, "r1", "A")
			require.NoError(t, err)
			s.Reset()
			done := waitFor(t.Context(), s, "r1", "B", runlease.WithWaitPoll(time.Second))
			time.Sleep(3 * time.Second)
			select {
			case err := <-done:
				t.Fatalf("acquired while held: %v", err)
			default:
			}
			assert.GreaterOrEqual(t, s.Gets.Load(), int64(3), "it polled about every second")
			require.NoError(t, a.Release(t.Context()))
			requireWoken(t, done)
		})
	})

	t.Run("an_expiry_wakes_a_waiter", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			_, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(runlease.MinTTL))
			require.NoError(t, err) // A crashes: it never renews nor releases
			start := time.Now()
			l, err := runlease.AcquireWait(t.Context(), s, "r1", "B", hour)
			require.NoError(t, err)
			assert.Equal(t, uint64(2), l.Fence())
			waited := time.Since(start)
			assert.GreaterOrEqual(t, waited, runlease.MinTTL)
			assert.Less(t, waited, runlease.MinTTL+10*time.Millisecond, "woken at the expiry, not the poll")
		})
	})

	t.Run("the_contexts_error_is_returned_as_is", func(t *testing.T) {
		t.Parallel()
		s := newSQLite(t)
		_, err := runlease.Acquire(t.Context(), s, "r1", "A")
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err = runlease.AcquireWait(ctx, s, "r1", "B", hour)
		require.Equal(t, context.DeadlineExceeded, err)
	})

	t.Run("other_errors_end_the_wait", func(t *testing.T) {
		t.Parallel()
		s := newSQLite(t)
		put(t, s, "runlease:r1", "corrupt")
		_, err := runlease.AcquireWait(t.Context(), s, "r1", "B", hour)
		require.ErrorIs(t, err, runlease.ErrCorruptRow)
		_, err = runlease.AcquireWait(t.Context(), s, "r2", "B", runlease.WithWaitPoll(0))
		require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	})
}
