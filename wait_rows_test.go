package runlease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

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
