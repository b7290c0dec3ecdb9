package runlease_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// holdMarks keeps s, which must already listen, from writing any new mark
// until the returned function is called: it holds s's mark loop in the
// write of a mark of a key of its own ("mark-blocker"), whose row it has
// inserted in a transaction left open. Subscriptions made meanwhile are
// marked only after that: a write of their keys in between misses their
// marks and notifies nobody, so only the wake-up each new mark sends can
// tell their subscribers of it. The loop is held deterministically, not
// by timing: holdMarks returns once the server shows it waiting.
func holdMarks(t *testing.T, pool *pgxpool.Pool, table string, s *runlease.PostgresStore, listening string) (resume func()) {
	t.Helper()
	ctx := t.Context()
	// The store's id, from the mark of the key it listens on.
	marks, err := s.MetaScan(ctx, runlease.WaitPrefix+listening+"\x1f")
	require.NoError(t, err)
	require.Len(t, marks, 1, "the store must listen, with %q marked", listening)
	id := strings.TrimPrefix(marks[0].Key, runlease.WaitPrefix+listening+"\x1f")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO "+pgtest.Ident(table)+" (key, value) VALUES ($1, $2)",
		runlease.WaitPrefix+"mark-blocker\x1f"+id, "0")
	require.NoError(t, err)
	_, cancel := s.Subscribe("mark-blocker")
	t.Cleanup(cancel)
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0 AND strpos(query, 'ON CONFLICT') > 0`, table).Scan(&n)
		return err == nil && n > 0
	}, wakeBound, 5*time.Millisecond, "the mark loop never waited for the blocker's row")
	var once sync.Once
	resume = func() { once.Do(func() { require.NoError(t, tx.Rollback(context.Background())) }) }
	t.Cleanup(resume)
	return resume
}

// TestPostgresANewMarkWakesItsSubscribers proves that a subscriber whose key
// was written before its mark landed is woken by the mark: the write found
// no mark and notified nobody, and nothing else would tell the subscriber
// of it. Every case fails at its deadline, every time, when the new mark's
// wake-up is lost: the marks are held back by holdMarks, not by timing,
// and waiters poll once an hour and wait for leases and slots held for an
// hour, so only a wake-up can end their wait.
func TestPostgresANewMarkWakesItsSubscribers(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	hour := runlease.WithWaitPoll(time.Hour)
	// setup opens a writer and a listener on one table, the listener
	// already listening (so that no wake-up of its listener's start can
	// come later), and holds the listener's marks.
	setup := func(t *testing.T) (writer *runlease.PostgresStore, listener *runlease.PostgresStore, resume func()) {
		pool := pgtest.Pool(t)
		table := pgtest.NewTable(t, pool)
		writer, listener = openPG(t, dsn, table), openPG(t, dsn, table)
		subscribeMarked(t, listener, "listening")
		return writer, listener, holdMarks(t, pool, table, listener, "listening")
	}

	t.Run("a_subscriber_of_a_key_written_before_its_mark", func(t *testing.T) {
		t.Parallel()
		writer, listener, resume := setup(t)
		ctx := t.Context()
		rows, cancel := listener.SubscribeRows("k")
		defer cancel()
		ok, err := writer.MetaCASNotify(ctx, "k", nil, "v")
		require.NoError(t, err)
		require.True(t, ok)
		// Notifications reach a listener in commit order: once one of a
		// marked key written after it has arrived, the write of k would
		// have too. It did not notify: its key was not marked yet.
		fence, fcancel := listener.SubscribeRows("listening")
		defer fcancel()
		ok, err = writer.MetaCASNotify(ctx, "listening", nil, "v")
		require.NoError(t, err)
		require.True(t, ok)
		requireRow(t, fence, "the marked key's notification")
		requireNoWake(t, rows, "the write that found no mark")

		resume()
		requireWake(t, rows, "the new mark's wake-up")
	})

	t.Run("acquire_wait_woken_by_the_mark_of_its_run", func(t *testing.T) {
		t.Parallel()
		writer, listener, resume := setup(t)
		ctx := t.Context()
		a, err := runlease.Acquire(ctx, writer, "r1", "A", runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		waiter := readSignal{listener, make(chan string, 16)}
		done := waitFor(ctx, waiter, "r1", "B", hour)
		awaitRead(t, waiter, runlease.LeasePrefix+"r1")
		require.NoError(t, a.Release(ctx)) // found no mark: notified nobody
		resume()
		requireWoken(t, done)
	})

	t.Run("claim_slots_wait_woken_by_the_mark_of_its_scope", func(t *testing.T) {
		t.Parallel()
		writer, listener, resume := setup(t)
		ctx := t.Context()
		scopes := []runlease.Scope{runlease.MemScope(1)}
		held, err := runlease.ClaimSlots(ctx, writer, "holder", scopes, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := runlease.ClaimSlotsWait(ctx, listener, "waiter", scopes, runlease.WithTTL(time.Hour), hour)
			done <- err
		}()
		awaitQueued(t, writer, 1)
		require.NoError(t, held.Release(ctx)) // found no mark: rang nobody
		resume()
		requireWoken(t, done)
	})
}

// requireWake waits for any wake-up on ch, with or without a row.
func requireWake(t *testing.T, ch <-chan string, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wakeBound):
		t.Fatalf("no wake-up: %s", what)
	}
}

// requireNoWake checks that ch holds no wake-up at all.
func requireNoWake(t *testing.T, ch <-chan string, what string) {
	t.Helper()
	select {
	case row := <-ch:
		t.Fatalf("woken (row %q): %s", row, what)
	default:
	}
}
