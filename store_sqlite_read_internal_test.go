package runlease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
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
