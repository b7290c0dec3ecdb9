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

// requireWake waits for a wake-up on ch.
func requireWake(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wakeBound):
		t.Fatalf("no wake-up: %s", what)
	}
}

// requireNoWake checks that ch holds no wake-up.
func requireNoWake(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("woken: %s", what)
	default:
	}
}

// listening subscribes to a key of s that nothing writes, and returns once
// the store's listener is up: it wakes every subscriber once it listens, so
// that they re-read what they may have missed. The subscription, which keeps
// the listener up, ends with t.
func listening(t *testing.T, s *runlease.PostgresStore, idle string) <-chan struct{} {
	t.Helper()
	ch, cancel := s.Subscribe(idle)
	t.Cleanup(cancel)
	requireWake(t, ch, "the listener never started")
	return ch
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
			idle := listening(t, c.listener, "idle-"+c.name)
			ch, cancel := c.listener.Subscribe("k-" + c.name)
			defer cancel()
			ok, err := c.writer.MetaCASNotify(t.Context(), "k-"+c.name, nil, "v")
			require.NoError(t, err)
			require.True(t, ok)
			requireWake(t, ch, c.name)
			requireNoWake(t, idle, c.name+": a subscriber of another key")
		}
	})

	t.Run("stores_on_other_tables_do_not_wake_each_other", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		one, other := openPG(t, dsn, pgtest.NewTable(t, pool)), openPG(t, dsn, pgtest.NewTable(t, pool))
		listening(t, other, "idle")
		ch, cancel := other.Subscribe("k")
		defer cancel()
		ok, err := one.MetaCASNotify(t.Context(), "k", nil, "v")
		require.NoError(t, err)
		require.True(t, ok)
		// Notifications reach a listener in commit order: once one written
		// after the first has arrived, the first would have too.
		fence, cancelFence := other.Subscribe("fence")
		defer cancelFence()
		ok, err = other.MetaCASNotify(t.Context(), "fence", nil, "v")
		require.NoError(t, err)
		require.True(t, ok)
		requireWake(t, fence, "the store's own notification")
		requireNoWake(t, ch, "a write to another table")
	})
}

// requireRow waits for a wake-up on ch and returns the row it carries.
func requireRow(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	select {
	case row := <-ch:
		return row
	case <-time.After(wakeBound):
		t.Fatalf("no wake-up: %s", what)
		return ""
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
	listening(t, listener, "idle")
	ctx := t.Context()

	for _, c := range []struct{ name, key, value string }{
		{"a_lease_row", "runlease:r1", `{"holder":"","fence":1,"until_ms":1700000000000}`},
		{"a_key_that_looks_like_a_payload", "runlease-row:3:abc", "runlease-row:1:x"},
		{"unicode_and_colons", "k:é:1:", "v:☃:\t\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rows, cancel := listener.SubscribeRows(c.key)
			defer cancel()
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

	t.Run("a_row_too_long_for_a_notification_wakes_without_it", func(t *testing.T) {
		rows, cancel := listener.SubscribeRows("big")
		defer cancel()
		big := strings.Repeat("x", 9000)
		ok, err := writer.MetaCASNotify(ctx, "big", nil, big)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "", requireRow(t, rows, "a long row"), "woken, and told to read")
	})
}
