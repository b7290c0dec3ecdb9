package statuspage_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

// BenchmarkPage100k serves the page and status.json over an embedded store
// of 100,000 leases (a quarter each live, expired, released and, for one
// in a thousand, corrupt), as an operator's browser asks for them: the
// first page, a page filtered by state, and one by run id prefix.
func BenchmarkPage100k(b *testing.B) {
	s, err := runlease.OpenSQLite(filepath.Join(b.TempDir(), "runs.db"))
	require.NoError(b, err)
	b.Cleanup(func() { s.Close() })
	now := base
	ops := make([]runlease.Op, 0, runlease.MaxBatch)
	flush := func() {
		ok, err := s.MetaBatch(b.Context(), nil, ops)
		require.NoError(b, err)
		require.True(b, ok)
		ops = ops[:0]
	}
	for i := range 100_000 {
		var row string
		switch {
		case i%1000 == 999:
			row = "{corrupt"
		case i%3 == 0:
			row = fmt.Sprintf(`{"holder":"driver-%d","fence":%d,"until_ms":%d}`, i%17, i%9+1, now.Add(time.Minute).UnixMilli())
		case i%3 == 1:
			row = fmt.Sprintf(`{"holder":"driver-%d","fence":%d,"until_ms":%d}`, i%17, i%9+1, now.Add(-time.Hour).UnixMilli())
		default:
			row = fmt.Sprintf(`{"holder":"","fence":%d,"until_ms":%d}`, i%9+1, now.Add(-time.Hour).UnixMilli())
		}
		ops = append(ops, runlease.Put(fmt.Sprintf("%srun-%06d", runlease.LeasePrefix, i), row))
		if len(ops) == cap(ops) {
			flush()
		}
	}
	flush()
	at := statuspage.WithClock(func() time.Time { return now })
	limits := statuspage.WithLimits(map[string]int{"mem": 64})
	// Every request reads the store (WithMaxAge(0)): the cost of the first
	// viewer, or of every viewer without the shared read.
	uncached := statuspage.New(s, at, limits, statuspage.WithMaxAge(0))
	for _, path := range []string{"/", "/status.json", "/status.json?state=corrupt", "/?run=run-0421"} {
		b.Run("read"+path, func(b *testing.B) { serveBench(b, uncached, path) })
	}
	// Further viewers within DefaultMaxAge share one read.
	shared := statuspage.New(s, at, limits)
	for _, path := range []string{"/", "/status.json"} {
		b.Run("shared"+path, func(b *testing.B) { serveBench(b, shared, path) })
	}
}

func serveBench(b *testing.B, h http.Handler, path string) {
	b.Helper()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(b.Context(), http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			b.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
		_, _ = io.Copy(io.Discard, rec.Body)
	}
}
