package runlease

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
