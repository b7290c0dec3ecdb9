package runlease_test

import (
	"context"
	"strconv"
	"sync/atomic"
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

func TestAcquireWaitReturnsTheContextsErrorDuringAStoreCall(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := &testkit.Faulty{Store: bubbleStore(t)}
		_, err := runlease.Acquire(t.Context(), f, "r1", "A", runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		f.HangWrites(testkit.Prefix(runlease.LeasePrefix))
		put(t, f.Store, "runlease:r2", `{"holder":"","fence":1,"until_ms":1}`) // a released run
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		l, err := runlease.AcquireWait(ctx, f, "r2", "B")
		assert.Nil(t, l)
		require.Equal(t, context.DeadlineExceeded, err, "ctx.Err() itself, not a storage error")
	})
}

func TestAcquireWaitDoesNotSpinOnALeaseCenturiesAway(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := &testkit.Counting{Store: bubbleStore(t)}
		put(t, s.Store, "runlease:r1", `{"holder":"X","fence":1,"until_ms":`+strconv.FormatInt(1<<62, 10)+`}`)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		s.Reset()
		_, err := runlease.AcquireWait(ctx, s, "r1", "B", runlease.WithWaitPoll(time.Second))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.LessOrEqual(t, s.Total(), int64(30), "about one read per poll, not one per millisecond")
	})
}

// TestAcquireWaitContextEndReleasesALandedWrite: AcquireWait returns
// ctx.Err() itself when its context ends, even when its acquisition's
// write landed with its reply lost and the read-back failed as the context
// ended. The caller never receives that lease, so the write is released
// before AcquireWait returns: the run is not blocked for a TTL in the
// holder's name. The row keeps the fence the write took, so fences never
// go backwards, and the driver's first Lease no longer renews.
func TestAcquireWaitContextEndReleasesALandedWrite(t *testing.T) {
	t.Parallel()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}
	first, err := runlease.Acquire(t.Context(), f, "r1", "A", opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f.Next(testkit.Fault{Apply: true}, // the create-if-absent, refused
		// Fence 2 lands, its reply lost; the read-back fails as ctx ends.
		testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1); cancel() }})
	_, err = runlease.AcquireWait(ctx, f, "r1", "A", opts...)
	require.Equal(t, context.Canceled, err)
	require.JSONEq(t, `{"holder":"","fence":2,"until_ms":`+strconv.FormatInt(epoch.UnixMilli(), 10)+`}`,
		get(t, f, "runlease:r1"), "the row AcquireWait's acquisition wrote is released at its fence")
	require.ErrorIs(t, first.Renew(t.Context()), runlease.ErrLeaseLost)
	l, err := runlease.Acquire(t.Context(), f, "r1", "B", opts...)
	require.NoError(t, err, "another holder takes the run at once")
	require.Equal(t, uint64(3), l.Fence())
}

// TestAcquireWaitWhoseDeadlinePassedBeforeItsTimerRan: a store call
// returns at the caller's deadline, before the context's timer has said
// so. The acquisition's write landed with its reply lost and the read-back
// failed, so its outcome is unknown; the caller's deadline has passed all
// the same. AcquireWait must treat the call as cut short by it: release
// the row it may have written, and return the deadline's error, exactly as
// when the timer had run first (TestAcquireWaitContextEndReleasesALandedWrite).
// The simulation found this as a deadline and a store reply due at one
// instant (seed 3046).
func TestAcquireWaitWhoseDeadlinePassedBeforeItsTimerRan(t *testing.T) {
	t.Parallel()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
	ctx := deadlinePassed{t.Context()}
	l, err := runlease.AcquireWait(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
	require.Nil(t, l)
	require.Equal(t, context.DeadlineExceeded, err)
	require.Contains(t, get(t, f, "runlease:r1"), `"holder":""`, "the row written is released")

	// Acquire says the same, as a fault that changed nothing.
	f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
	l, err = runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
	require.Nil(t, l)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, runlease.IsOutcomeUnknown(err), "%v", err)
	require.Contains(t, get(t, f, "runlease:r1"), `"holder":""`, "the row written is released")
}

// rowStore is a store that is a RowNotifier, whose calls are counted and
// whose reads are signalled, so that a test knows when a waiter has seen
// the row it waits on and what it sent after.
type rowStore interface {
	runlease.Store
	runlease.RowNotifier
}

type countedRows struct {
	rowStore
	gets, cas atomic.Int64
	reads     chan struct{}
	news      chan string // when set, SubscribeRows hands it out instead of the store's
}

func (c *countedRows) MetaGet(ctx context.Context, key string) (string, bool, error) {
	v, found, err := c.rowStore.MetaGet(ctx, key)
	c.gets.Add(1)
	select {
	case c.reads <- struct{}{}:
	default:
	}
	return v, found, err
}

func (c *countedRows) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	c.cas.Add(1)
	return c.rowStore.MetaCAS(ctx, key, expected, value)
}

func (c *countedRows) SubscribeRows(key string) (<-chan string, func()) {
	if c.news != nil {
		return c.news, func() {}
	}
	return c.rowStore.SubscribeRows(key)
}

func (c *countedRows) awaitRead(t *testing.T) {
	t.Helper()
	select {
	case <-c.reads:
	case <-time.After(wakeBound):
		t.Fatal("the waiter never read the row")
	}
}

// TestAWokenWaiterTakesOverWithTheReleasedRow covers the handoff of a
// RowNotifier: the release's wake-up carries the row it stored, so the
// waiter writes over it at once: one call, no read, on both stores (on
// Postgres, the waiter is another store on its own pool).
func TestAWokenWaiterTakesOverWithTheReleasedRow(t *testing.T) {
	t.Parallel()
	hour := runlease.WithWaitPoll(time.Hour) // only the release can wake the waiter
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var holderStore, waiterStore rowStore
			if name == "sqlite" {
				s := newSQLite(t)
				holderStore, waiterStore = s, s
			} else {
				dsn := pgtest.DSN(t)
				table := pgtest.NewTable(t, pgtest.Pool(t))
				holderStore, waiterStore = openPG(t, dsn, table), openPG(t, dsn, table)
			}
			waiter := &countedRows{rowStore: waiterStore, reads: make(chan struct{}, 1)}
			a, err := runlease.Acquire(t.Context(), holderStore, "r1", "A")
			require.NoError(t, err)
			done := make(chan *runlease.Lease, 1)
			go func() {
				l, err := runlease.AcquireWait(t.Context(), waiter, "r1", "B", hour)
				assert.NoError(t, err)
				done <- l
			}()
			waiter.awaitRead(t) // refused: from here on it sleeps
			if name == "postgres" {
				// Its mark makes the release notify; the mark's landing
				// wakes it once more to read, which may come later still,
				// so only the SQLite store's calls are counted.
				awaitMarked(t, waiterStore, runlease.LeasePrefix+"r1")
			}
			gets, cas := waiter.gets.Load(), waiter.cas.Load()
			require.NoError(t, a.Release(t.Context()))
			select {
			case l := <-done:
				require.NotNil(t, l)
				assert.Equal(t, uint64(2), l.Fence())
			case <-time.After(wakeBound):
				t.Fatal("the waiter was not woken")
			}
			if name == "sqlite" {
				assert.Equal(t, int64(0), waiter.gets.Load()-gets, "the wake-up carried the row: nothing to read")
				assert.Equal(t, int64(1), waiter.cas.Load()-cas, "one takeover")
			}
		})
	}
}

// TestAWaiterToldOfARowItCannotTakeReadsTheStore: the row a wake-up
// carries is a hint. A live row of another holder, a corrupt one, or one
// that changed since sends the waiter to read the store; it never gives up
// nor takes what it was told over the row stored.
func TestAWaiterToldOfARowItCannotTakeReadsTheStore(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	waiter := &countedRows{rowStore: s, reads: make(chan struct{}, 1), news: make(chan string, 1)}
	a, err := runlease.Acquire(t.Context(), s, "r1", "A")
	require.NoError(t, err)
	live := get(t, s, "runlease:r1")
	done := make(chan error, 1)
	var won *runlease.Lease
	go func() {
		var err error
		won, err = runlease.AcquireWait(t.Context(), waiter, "r1", "B", runlease.WithWaitPoll(time.Hour))
		done <- err
	}()
	waiter.awaitRead(t)
	for _, news := range []string{
		live,                                   // the holder's live row: refused, so read
		"not a row",                            // corrupt: read
		`{"holder":"","fence":7,"until_ms":1}`, // free, but not what is stored: the write fails, then read
	} {
		waiter.news <- news
		waiter.awaitRead(t)
		select {
		case err := <-done:
			t.Fatalf("returned on news %q: %v", news, err)
		default:
		}
	}
	require.NoError(t, a.Release(t.Context()))
	waiter.news <- get(t, s, "runlease:r1")
	select {
	case err := <-done:
		require.NoError(t, err)
		assert.Equal(t, uint64(2), won.Fence())
	case <-time.After(wakeBound):
		t.Fatal("the waiter was not woken")
	}
}
