package runlease_test

import (
	"context"
	"strings"
	"testing"
	"time"

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
