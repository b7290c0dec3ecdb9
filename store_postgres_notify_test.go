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

// wakeBound bounds how long a test waits for a wake-up that must come. It is
// a liveness bound, not a latency assertion.
const wakeBound = 30 * time.Second

// awaitMarked waits until s's table holds a mark of key: a subscriber's
// mark, written after Subscribe returns, is what makes a write notify.
func awaitMarked(t *testing.T, s runlease.Store, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		rows, err := s.MetaScan(t.Context(), runlease.WaitPrefix+key+"\x1f")
		return err == nil && len(rows) > 0
	}, wakeBound, 5*time.Millisecond, "no mark of %q", key)
}

// subscribeMarked subscribes to key on s and returns once the subscription
// is marked in the table: from then on a write of key that notifies wakes
// it. Wake-ups from before (the listener starting, the mark landing) are
// drained; one may still come, which tests of rows skip (it has no row).
func subscribeMarked(t *testing.T, s *runlease.PostgresStore, key string) <-chan string {
	t.Helper()
	rows, cancel := s.SubscribeRows(key)
	t.Cleanup(cancel)
	awaitMarked(t, s, key)
	return rows
}

// readSignal is a Postgres store that reports each MetaGet it answers, so
// that a test knows when a waiter has read the row it waits on. It is still
// a Notifier and a Clock, through the embedded store.
type readSignal struct {
	*runlease.PostgresStore
	reads chan string
}

func (r readSignal) MetaGet(ctx context.Context, key string) (string, bool, error) {
	v, found, err := r.PostgresStore.MetaGet(ctx, key)
	if err == nil {
		select {
		case r.reads <- key:
		default:
		}
	}
	return v, found, err
}

// awaitRead waits until r has answered a MetaGet of key.
func awaitRead(t *testing.T, r readSignal, key string) {
	t.Helper()
	deadline := time.After(wakeBound)
	for {
		select {
		case k := <-r.reads:
			if k == key {
				return
			}
		case <-deadline:
			t.Fatalf("%s was never read", key)
		}
	}
}

// TestPostgresNotifications covers the wake-ups of Subscribe and
// MetaCASNotify across stores, with the listener up before the write, so
// that only a notification can deliver them.
func TestPostgresNotifications(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)

	t.Run("stores_that_name_one_table_differently_wake_each_other", func(t *testing.T) {
		t.Parallel()
		table := pgtest.NewTable(t, pgtest.Pool(t))
		bare, qualified := openPG(t, dsn, table), openPG(t, dsn, "public."+table)
		for _, c := range []struct {
			name             string
			writer, listener *runlease.PostgresStore
		}{{"bare_to_qualified", bare, qualified}, {"qualified_to_bare", qualified, bare}} {
			idle := subscribeMarked(t, c.listener, "idle-"+c.name)
			ch := subscribeMarked(t, c.listener, "k-"+c.name)
			ok, err := c.writer.MetaCASNotify(t.Context(), "k-"+c.name, nil, "v")
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, "v", requireRow(t, ch, c.name))
			requireNoRow(t, idle, c.name+": a subscriber of another key")
		}
	})

	t.Run("stores_on_other_tables_do_not_wake_each_other", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		one, other := openPG(t, dsn, pgtest.NewTable(t, pool)), openPG(t, dsn, pgtest.NewTable(t, pool))
		ch := subscribeMarked(t, other, "k")
		// A mark in the other table does not make a write here notify;
		// mark the key here too, so that only the channel keeps them apart.
		subscribeMarked(t, one, "k")
		ok, err := one.MetaCASNotify(t.Context(), "k", nil, "v")
		require.NoError(t, err)
		require.True(t, ok)
		// Notifications reach a listener in commit order: once one written
		// after the first has arrived, the first would have too.
		fence := subscribeMarked(t, other, "fence")
		ok, err = other.MetaCASNotify(t.Context(), "fence", nil, "v")
		require.NoError(t, err)
		require.True(t, ok)
		requireRow(t, fence, "the store's own notification")
		requireNoRow(t, ch, "a write to another table")
	})

}

// requireRow waits for a wake-up on ch that carries a row, and returns it.
// Wake-ups without one (the listener starting, a mark landing) are skipped.
func requireRow(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	deadline := time.After(wakeBound)
	for {
		select {
		case row := <-ch:
			if row != "" {
				return row
			}
		case <-deadline:
			t.Fatalf("no wake-up with a row: %s", what)
			return ""
		}
	}
}

// requireNoRow checks that ch holds no wake-up with a row.
func requireNoRow(t *testing.T, ch <-chan string, what string) {
	t.Helper()
	select {
	case row := <-ch:
		require.Empty(t, row, "woken with a row: %s", what)
	default:
	}
}

// TestPostgresNotificationsCarryTheRow covers SubscribeRows: a write that
// notifies wakes its key's subscribers in other stores with the row it
// stored, byte for byte, and one that did not write wakes nobody.
func TestPostgresNotificationsCarryTheRow(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	table := pgtest.NewTable(t, pgtest.Pool(t))
	writer, listener := openPG(t, dsn, table), openPG(t, dsn, table)
	ctx := t.Context()

	for _, c := range []struct{ name, key, value string }{
		{"a_lease_row", "runlease:r1", `{"holder":"","fence":1,"until_ms":1700000000000}`},
		{"a_key_that_looks_like_a_payload", "runlease-row:3:abc", "runlease-row:1:x"},
		{"unicode_and_colons", "k:é:1:", "v:☃:\t\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rows := subscribeMarked(t, listener, c.key)
			ok, err := writer.MetaCASNotify(ctx, c.key, nil, c.value)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, c.value, requireRow(t, rows, c.name))

			// A write whose condition fails notifies nobody: the next
			// wake-up is the one after it, with its row.
			ok, err = writer.MetaCASNotify(ctx, c.key, nil, "other")
			require.NoError(t, err)
			require.False(t, ok)
			ok, err = writer.MetaCASNotify(ctx, c.key, &c.value, c.value+"2")
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, c.value+"2", requireRow(t, rows, c.name+": the second write"))
		})
	}

	t.Run("a_row_too_long_for_a_notification_still_notifies", func(t *testing.T) {
		rows := subscribeMarked(t, listener, "big")
		big := strings.Repeat("x", 9000)
		ok, err := writer.MetaCASNotify(ctx, "big", nil, big)
		require.NoError(t, err, "the payload leaves the row out rather than fail the write")
		require.True(t, ok)
		ok, err = writer.MetaCASNotify(ctx, "big", &big, "small")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "small", requireRow(t, rows, "the write after the long row"))
	})
}

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
