package runlease

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

// newPgOnTable opens a store on a fresh table of pool, closed with t.
func newPgOnTable(t *testing.T, pool *pgxpool.Pool) *PostgresStore {
	t.Helper()
	s, err := NewPostgres(t.Context(), pool, WithTable(pgtest.NewTable(t, pool)))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// FuzzPostgresPayload checks that every notification names its key and
// carries its row (or, when too long, none), whatever the key and row hold.
func FuzzPostgresPayload(f *testing.F) {
	f.Add("runlease:r1", `{"holder":"","fence":1,"until_ms":1}`)
	f.Add("runlease-row:3:abc", "runlease-row:1:x")
	f.Add("k:", strings.Repeat("v", pgMaxPayload))
	f.Add("12:", "")
	f.Fuzz(func(t *testing.T, key, value string) {
		if CheckKey(key) != nil || CheckValue(value) != nil {
			return
		}
		p := pgPayload(key, value)
		require.LessOrEqual(t, len(p), pgMaxPayload)
		k, row, hasRow := pgParsePayload(p)
		require.True(t, hasRow)
		require.Equal(t, key, k)
		if len(p) < len(pgPayloadRow)+len(key)+len(value) {
			require.Empty(t, row, "a row too long is left out, never cut")
		} else {
			require.Equal(t, value, row)
		}
	})
}

func TestPostgresPayloadOfABareKey(t *testing.T) {
	for _, p := range []string{"runlease:r1", "runlease-row:", "runlease-row:x:k", "runlease-row:05:abcde", "runlease-row:9:abc", "runlease-row:0:"} {
		k, row, hasRow := pgParsePayload(p)
		assert.Equal(t, p, k, "%q is a bare key", p)
		assert.Empty(t, row)
		assert.False(t, hasRow)
	}
}

// TestAWriteNobodyWaitsForNotifiesNobody: a write notifies only when its key
// is marked as waited on, so that releases nobody waits for do not take
// Postgres's notify lock. A listener of the table's channel that marks
// nothing hears every notification sent: in commit order, the first it
// hears is the write of the key waited on, though another was written first.
func TestAWriteNobodyWaitsForNotifiesNobody(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := newPgOnTable(t, pool)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
	require.NoError(t, err)

	rows, cancel := s.SubscribeRows("waited")
	defer cancel()
	require.Eventually(t, func() bool {
		marks, err := s.MetaScan(ctx, WaitPrefix+"waited"+pgMarkSep)
		return err == nil && len(marks) == 1
	}, 30*time.Second, 5*time.Millisecond)
	ok, err := s.MetaCASNotify(ctx, "nobody", nil, "v")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.MetaCASNotify(ctx, "waited", nil, "w")
	require.NoError(t, err)
	require.True(t, ok)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	n, err := conn.WaitForNotification(wctx)
	require.NoError(t, err)
	key, row, _ := pgParsePayload(n.Payload)
	assert.Equal(t, "waited", key, "the write nobody waited for notified")
	assert.Equal(t, "w", row)
	_ = rows

	cancel()
	require.Eventually(t, func() bool {
		marks, err := s.MetaScan(ctx, WaitPrefix)
		return err == nil && len(marks) == 0
	}, 30*time.Second, 5*time.Millisecond, "the last subscription's end deletes its mark")
}

// TestExpiredMarksAreSwept: a process that died leaves its marks; a store
// that waits deletes them once expired, and a live one is left alone.
func TestExpiredMarksAreSwept(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := newPgOnTable(t, pool)
	ctx := t.Context()
	now, _ := s.ClockNow()
	dead := WaitPrefix + "r1" + pgMarkSep + "dead"
	alive := WaitPrefix + "r1" + pgMarkSep + "alive"
	for key, until := range map[string]int64{dead: now.UnixMilli() - 1000, alive: now.Add(time.Hour).UnixMilli()} {
		ok, err := s.MetaCAS(ctx, key, nil, pgMarkTime(until))
		require.NoError(t, err)
		require.True(t, ok)
	}
	_, cancel := s.Subscribe("other")
	defer cancel()
	require.Eventually(t, func() bool {
		_, found, err := s.MetaGet(ctx, dead)
		return err == nil && !found
	}, 30*time.Second, 5*time.Millisecond, "the expired mark was not swept")
	_, found, err := s.MetaGet(ctx, alive)
	require.NoError(t, err)
	assert.True(t, found, "a live mark of another store is left alone")
}

// TestAMarkWaitsForANotifyingWriteInFlight: a notifying write whose
// statement ran before a subscriber's mark existed, and has not committed,
// holds the mark back until it commits, so that the mark's wake-up reads
// the written row (nothing else would tell the subscriber of it).
func TestAMarkWaitsForANotifyingWriteInFlight(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := newPgOnTable(t, pool)
	ctx := t.Context()
	ok, err := s.MetaCAS(ctx, "k", nil, "old")
	require.NoError(t, err)
	require.True(t, ok)

	// The write, by hand, in a transaction left open: the store's own
	// statements, from the pin on.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(ctx, pgPinNotify, pgMarkLockKey(s.channel, "k"))
	require.NoError(t, err)
	now, _ := s.ClockNow()
	from, to := pgMarkRange("k")
	tag, err := tx.Exec(ctx, s.q.updateNotify, "k", "old", "new", from, to, pgMarkTime(now.UnixMilli()), s.channel, pgPayload("k", "new"))
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	rows, cancel := s.SubscribeRows("k")
	defer cancel()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%pg_advisory_xact_lock(k)%'`).Scan(&n)
		return err == nil && n > 0
	}, 30*time.Second, 5*time.Millisecond, "the mark did not wait for the write in flight")
	require.NoError(t, tx.Commit(ctx))

	deadline := time.After(30 * time.Second)
	for marked := false; !marked; {
		select {
		case <-rows: // the listener starting, then the mark landing
		case <-deadline:
			t.Fatal("the mark never landed")
		}
		marks, err := s.MetaScan(ctx, WaitPrefix+"k"+pgMarkSep)
		require.NoError(t, err)
		marked = len(marks) == 1
	}
	got, _, err := s.MetaGet(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "new", got, "the mark's wake-up reads the write that missed it")
}

// listening returns the stop channel of s's listening goroutine, nil when
// none runs: the same channel means the same listener.
func listening(s *PostgresStore) chan struct{} {
	s.listen.mu.Lock()
	defer s.listen.mu.Unlock()
	if s.listen.cancel == nil {
		return nil
	}
	return s.listen.stopped
}

// TestASubscriptionBackWithinTheLingerFindsTheListenerAndTheMark: a driver
// that waits at every superstep subscribes, leaves and subscribes again a
// moment later. The store goes on listening on the same connection, and
// keeps the key's mark as written, through the gap; once nobody has
// subscribed for pgListenLinger, the listener stops and the mark goes.
func TestASubscriptionBackWithinTheLingerFindsTheListenerAndTheMark(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := newPgOnTable(t, pool)
	ctx := t.Context()
	marks := func() []Row {
		rows, err := s.MetaScan(ctx, WaitPrefix)
		require.NoError(t, err)
		return rows
	}
	_, cancel := s.Subscribe("k")
	require.Eventually(t, func() bool { return len(marks()) == 1 }, 30*time.Second, 5*time.Millisecond)
	first, mark := listening(s), marks()
	require.NotNil(t, first)
	// The gap between two supersteps: long enough for the mark loop and a
	// stop to run, short against the linger (2 s). A gap the machine
	// stretched past a second proves nothing, and is tried again.
	const gap, stretched = 100 * time.Millisecond, time.Second
	checked := 0
	for try := 0; try < 20 && checked < 3; try++ {
		cancel()
		t0 := time.Now()
		time.Sleep(gap)
		_, cancel = s.Subscribe("k")
		if time.Since(t0) >= stretched {
			continue
		}
		checked++
		assert.True(t, first == listening(s), "the listener was stopped and started again")
		assert.Equal(t, mark, marks(), "the mark was deleted, or written again")
	}
	require.Positive(t, checked, "every gap ran past a second")

	cancel()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the listener still runs long after the last subscription ended")
	}
	require.Eventually(t, func() bool { return len(marks()) == 0 }, 30*time.Second, 5*time.Millisecond,
		"the mark outlived the listener")
	assert.Nil(t, listening(s))
}

// TestCloseStopsALingeringListener: Close does not wait for the linger.
func TestCloseStopsALingeringListener(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := newPgOnTable(t, pool)
	_, cancel := s.Subscribe("k")
	require.Eventually(t, func() bool {
		rows, err := s.MetaScan(t.Context(), WaitPrefix)
		return err == nil && len(rows) == 1
	}, 30*time.Second, 5*time.Millisecond)
	stopped := listening(s)
	cancel()
	require.True(t, stopped == listening(s), "the listener lingers")
	require.NoError(t, s.Close())
	select {
	case <-stopped:
	default:
		t.Fatal("Close returned before the lingering listener stopped")
	}
	assert.Nil(t, listening(s))
}
