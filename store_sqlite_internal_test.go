package runlease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openReadTestStore opens a store on a fresh file holding n rows under
// "r/", and a read-only store on the same file.
func openReadTestStore(t *testing.T, n int) (*SQLiteStore, *SQLiteStore) {
	t.Helper()
	s := roomSQLite(t)
	for i := range n {
		ok, err := s.MetaCAS(t.Context(), fmt.Sprintf("r/%04d", i), nil, "v")
		require.NoError(t, err)
		require.True(t, ok)
	}
	ro, err := OpenSQLiteReadOnly(s.Path())
	require.NoError(t, err)
	t.Cleanup(func() { ro.Close() })
	return s, ro
}

// A read waits for a reading connection in Go, where its context ends the
// wait: with every connection taken, it fails with the context's error,
// as a StorageError that changed nothing, and it reads once one is free.
func TestSQLiteReadWaitingForAConnectionEndsWithItsContext(t *testing.T) {
	t.Parallel()
	s, ro := openReadTestStore(t, 3)
	for _, st := range []*SQLiteStore{s, ro} {
		for range cap(st.readers) {
			st.readers <- struct{}{}
		}
		reads := map[string]func(ctx context.Context) error{
			"MetaGet": func(ctx context.Context) error {
				v, found, err := st.MetaGet(ctx, "r/0001")
				if err == nil && (!found || v != "v") {
					return fmt.Errorf("MetaGet read %q, %v", v, found)
				}
				return err
			},
			"MetaScan": func(ctx context.Context) error {
				rows, err := st.MetaScan(ctx, "r/")
				if err == nil && len(rows) != 3 {
					return fmt.Errorf("MetaScan read %d rows", len(rows))
				}
				return err
			},
		}
		for name, read := range reads {
			// The context ends while the read waits.
			ctx, cancel := context.WithCancel(t.Context())
			var waited []string
			st.hooks = &sqliteHooks{waiting: func(op string) {
				waited = append(waited, op)
				cancel()
			}}
			err := read(ctx)
			cancel()
			require.Equal(t, []string{name}, waited, "%s with every reading connection taken did not wait", name)
			var se *StorageError
			require.ErrorAs(t, err, &se, "%s with every reading connection taken", name)
			assert.ErrorIs(t, err, context.Canceled, name)
			assert.False(t, se.Unknown, "%s: a read changes nothing", name)
			assert.Equal(t, name, se.Op)

			// Freed while the read waits, a connection lets it through.
			waiting := make(chan struct{})
			st.hooks = &sqliteHooks{waiting: func(string) { close(waiting) }}
			done := make(chan error, 1)
			go func() { done <- read(t.Context()) }()
			<-waiting
			select {
			case err := <-done:
				t.Fatalf("%s returned (%v) with every reading connection taken", name, err)
			default:
			}
			<-st.readers
			require.NoError(t, <-done, name)
			st.readers <- struct{}{}
			st.hooks = nil
		}
		for range cap(st.readers) {
			<-st.readers
		}
	}
}

// A scan runs without a watcher on its context, so it checks the context
// between rows: one that ends midway fails with the context's error and
// returns no rows.
func TestSQLiteScanEndsBetweenRowsWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	s, _ := openReadTestStore(t, 50)
	for _, at := range []int{1, 2, 25, 50} {
		ctx, cancel := context.WithCancel(t.Context())
		var last int
		s.hooks = &sqliteHooks{scanned: func(n int) {
			last = n
			if n == at {
				cancel()
			}
		}}
		rows, err := s.MetaScan(ctx, "r/")
		s.hooks = nil
		var se *StorageError
		require.ErrorAs(t, err, &se, "context ended at row %d", at)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Nil(t, rows)
		assert.Equal(t, at, last, "the scan read on after its context ended")
		assert.Zero(t, len(s.readers), "the scan kept its reading connection")
	}
	rows, err := s.MetaScan(t.Context(), "r/")
	require.NoError(t, err)
	assert.Len(t, rows, 50)
}

// Reads from many goroutines, some with contexts that end at random
// instants, each return their rows or their context's error, and every
// reading connection is given back.
func TestSQLiteReadsGiveBackTheirConnections(t *testing.T) {
	t.Parallel()
	s, ro := openReadTestStore(t, 20)
	var wg sync.WaitGroup
	for g := range 16 {
		st := []*SQLiteStore{s, ro}[g%2]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				ctx, cancel := context.WithTimeout(t.Context(), time.Duration(rng.IntN(200))*time.Microsecond)
				var err error
				if rng.IntN(2) == 0 {
					var rows []Row
					if rows, err = st.MetaScan(ctx, "r/"); err == nil && len(rows) != 20 {
						err = fmt.Errorf("MetaScan read %d rows", len(rows))
					}
				} else {
					var v string
					if v, _, err = st.MetaGet(ctx, "r/0007"); err == nil && v != "v" {
						err = fmt.Errorf("MetaGet read %q", v)
					}
				}
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					assert.NoError(t, err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	assert.Zero(t, len(s.readers))
	assert.Zero(t, len(ro.readers))
}

// TestSQLiteWritesAreDurableOnReturn pins the settings behind the README's
// durability promise: WAL with synchronous=FULL on the writing connection,
// so every commit (acquire, takeover, release, renewal, fenced write) is on
// disk before the call returns and survives power loss; and readers that
// cannot write.
func TestSQLiteWritesAreDurableOnReturn(t *testing.T) {
	t.Parallel()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	defer s.Close()

	var mode string
	require.NoError(t, s.w.QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode))
	assert.Equal(t, "wal", mode)
	var sync int
	require.NoError(t, s.w.QueryRowContext(t.Context(), "PRAGMA synchronous").Scan(&sync))
	assert.Equal(t, 2, sync, "synchronous=FULL: a WAL commit is synced before it returns")

	// A batch runs in the same connection, so it is as durable.
	tx, err := s.w.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRowContext(t.Context(), "PRAGMA synchronous").Scan(&sync))
	assert.Equal(t, 2, sync)
	require.NoError(t, tx.Rollback())

	var queryOnly int
	require.NoError(t, s.r.QueryRowContext(t.Context(), "PRAGMA query_only").Scan(&queryOnly))
	assert.Equal(t, 1, queryOnly, "the reading connections cannot write")
}

// blockWrites holds SQLite's write lock on the file at path from a
// connection of its own, so that a store's write waits inside SQLite (in
// flight) until release is called.
func blockWrites(t *testing.T, path string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	conn, err := db.Conn(t.Context())
	require.NoError(t, err)
	_, err = conn.ExecContext(t.Context(), "BEGIN IMMEDIATE")
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := conn.ExecContext(t.Context(), "ROLLBACK")
			assert.NoError(t, err)
			assert.NoError(t, conn.Close())
		})
	}
	t.Cleanup(release)
	return release
}

func TestSQLiteCloseWaitsForWritesInFlight(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := OpenSQLite(path)
	require.NoError(t, err)
	release := blockWrites(t, path)

	entered := make(chan struct{})
	var exited, refusedDuringClose atomic.Bool
	var secondClose sync.WaitGroup
	var secondSawExit atomic.Bool
	s.hooks = &sqliteHooks{
		entered: func(op string) {
			if op == "MetaCAS" {
				close(entered)
			}
		},
		exited: func(op string) {
			if op == "MetaCAS" {
				exited.Store(true)
			}
		},
		closing: func() {
			// Close has begun: new calls are refused at once, even while
			// the write in flight still waits.
			_, err := s.MetaCAS(t.Context(), "late", nil, "v")
			_, _, gerr := s.MetaGet(t.Context(), "late")
			refusedDuringClose.Store(err == ErrStoreClosed && gerr == ErrStoreClosed)
			secondClose.Go(func() {
				assert.NoError(t, s.Close())
				secondSawExit.Store(exited.Load())
			})
			release()
		},
	}

	type result struct {
		ok  bool
		err error
	}
	wrote := make(chan result, 1)
	go func() {
		ok, err := s.MetaCAS(t.Context(), "runlease:r1", nil, `{"holder":"A","fence":1,"until_ms":1}`)
		wrote <- result{ok, err}
	}()
	<-entered // the write is in flight, waiting for SQLite's write lock

	require.NoError(t, s.Close())
	assert.True(t, exited.Load(), "Close returned only after the write in flight")
	r := <-wrote
	require.NoError(t, r.err)
	assert.True(t, r.ok)
	assert.True(t, refusedDuringClose.Load(), "calls made once Close began are refused with ErrStoreClosed")
	secondClose.Wait()
	assert.True(t, secondSawExit.Load(), "a concurrent Close also returns only after the write")

	s, err = OpenSQLite(path)
	require.NoError(t, err, "the lock was released")
	defer s.Close()
	v, found, err := s.MetaGet(t.Context(), "runlease:r1")
	require.NoError(t, err)
	assert.True(t, found, "the write committed before Close returned is durable")
	assert.Equal(t, `{"holder":"A","fence":1,"until_ms":1}`, v)
}

// TestSQLiteRangesSearchThePrimaryKey checks SQLite's plan of each
// statement of MetaRanges: a search of the primary key between the
// statement's bounds, in its order (no sort), so that reading the head of
// a prefix reads the head and no more.
func TestSQLiteRangesSearchThePrimaryKey(t *testing.T) {
	t.Parallel()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "plan.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	for sql, want := range map[string]string{
		sqliteRangeAfter:     "SEARCH runlease_meta USING PRIMARY KEY (key>? AND key<?)",
		sqliteRangeFrom:      "SEARCH runlease_meta USING PRIMARY KEY (key>? AND key<?)",
		sqliteRangeAfterOpen: "SEARCH runlease_meta USING PRIMARY KEY (key>?)",
		sqliteRangeFromOpen:  "SEARCH runlease_meta USING PRIMARY KEY (key>?)",
	} {
		n := strings.Count(sql, "?")
		args := make([]any, n)
		for i := range args[:n-1] {
			args[i] = "k"
		}
		args[n-1] = 8
		rows, err := s.r.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+sql, args...)
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var id, parent, notUsed int
			var detail string
			require.NoError(t, rows.Scan(&id, &parent, &notUsed, &detail))
			plan = append(plan, detail)
		}
		require.NoError(t, rows.Err())
		rows.Close()
		assert.Equal(t, []string{want}, plan, "the plan of %s", sql)
	}
}

// TestSQLiteRangesUnderWrites reads ranges from more goroutines than the
// store has reading connections while a writer adds and removes rows of
// the prefix, then closes the store under them: every result is a valid
// head of the prefix, no reading connection is lost, and a call that
// meets the close fails with ErrStoreClosed.
func TestSQLiteRangesUnderWrites(t *testing.T) {
	t.Parallel()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "ranges.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	const p = "q/"
	for i := range 200 {
		ok, err := s.MetaCAS(t.Context(), fmt.Sprintf("%s%04d", p, i), nil, "v")
		require.NoError(t, err)
		require.True(t, ok)
	}
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			k := fmt.Sprintf("%s%04d", p, 200+i%50)
			if _, err := s.MetaCAS(ctx, k, nil, "v"); err != nil {
				return
			}
			if _, err := s.MetaDelete(ctx, k, "v"); err != nil {
				return
			}
		}
	})
	errs := make(chan error, 4*sqliteReadConns)
	for g := range 4 * sqliteReadConns {
		wg.Go(func() {
			for i := 0; ; i++ {
				after := fmt.Sprintf("%s%04d", p, (g*37+i)%260)
				got, err := s.MetaRanges(context.Background(), []Range{{Prefix: p, After: after, Limit: 8}, {Prefix: p, Limit: 1}})
				if errors.Is(err, ErrStoreClosed) {
					errs <- nil
					return
				}
				if err == nil {
					err = checkHead(got[0], p, after, 8)
				}
				if err == nil {
					err = checkHead(got[1], p, "", 1)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for range 200 {
		_, err := s.MetaRanges(t.Context(), []Range{{Prefix: p, Limit: 8}})
		require.NoError(t, err)
	}
	stop()
	require.NoError(t, s.Close())
	wg.Wait()
	for range 4 * sqliteReadConns {
		require.NoError(t, <-errs)
	}
	assert.Empty(t, s.readers, "every read gave its reading connection back")
}

// checkHead reports what is wrong with rows as the head of prefix after
// after: at most limit rows, of the prefix, past after, in ascending order.
func checkHead(rows []Row, prefix, after string, limit int) error {
	if len(rows) > limit {
		return fmt.Errorf("%d rows, the limit is %d", len(rows), limit)
	}
	for i, r := range rows {
		switch {
		case !strings.HasPrefix(r.Key, prefix):
			return fmt.Errorf("row %q is not under %q", r.Key, prefix)
		case r.Key <= after:
			return fmt.Errorf("row %q is not after %q", r.Key, after)
		case i > 0 && r.Key <= rows[i-1].Key:
			return fmt.Errorf("row %q follows %q", r.Key, rows[i-1].Key)
		}
	}
	return nil
}
