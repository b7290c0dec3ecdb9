package statuspage_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

// countingStore counts the scans of lease rows, and may hold each one
// until gate is closed.
type countingStore struct {
	runlease.Store
	scans   atomic.Int32
	entered chan struct{} // receives once per scan, if not nil
	gate    chan struct{} // scans wait for it to close, if not nil
	fail    atomic.Bool   // scans fail
}

func (s *countingStore) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	if strings.HasPrefix(prefix, runlease.LeasePrefix) {
		s.scans.Add(1)
		if s.entered != nil {
			s.entered <- struct{}{}
		}
		if s.gate != nil {
			<-s.gate
		}
		if s.fail.Load() {
			return nil, errors.New("the store is unreachable")
		}
	}
	return s.Store.MetaScan(ctx, prefix)
}

func serveJSON(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	return rec.Body.String()
}

func TestSnapshots(t *testing.T) {
	t.Parallel()
	newStore := func(t *testing.T) *countingStore {
		s := &countingStore{Store: stores[0].open(t)}
		seed(t, s.Store, &clock{now: base})
		return s
	}
	at := statuspage.WithClock(func() time.Time { return base })
	t.Run("one_read_answers_every_request_for_a_prefix_within_max_age", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		h := statuspage.New(s, at, statuspage.WithMaxAge(time.Hour))
		for _, path := range []string{"/", "/status.json", "/status.json?state=live", "/?limit=1&offset=2"} {
			serveJSON(t, h, path)
		}
		assert.Equal(t, int32(1), s.scans.Load())
		serveJSON(t, h, "/status.json?run=live")
		assert.Equal(t, int32(2), s.scans.Load(), "another prefix is another read")
	})
	t.Run("max_age_zero_reads_for_every_request", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		h := statuspage.New(s, at, statuspage.WithMaxAge(0))
		for range 3 {
			serveJSON(t, h, "/status.json")
		}
		assert.Equal(t, int32(3), s.scans.Load())
	})
	t.Run("an_old_read_is_read_again", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		h := statuspage.New(s, at, statuspage.WithMaxAge(time.Millisecond))
		serveJSON(t, h, "/status.json")
		time.Sleep(2 * time.Millisecond) // the real clock ages the read
		serveJSON(t, h, "/status.json")
		assert.Equal(t, int32(2), s.scans.Load())
	})
	t.Run("requests_during_a_read_wait_for_it", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		s.entered, s.gate = make(chan struct{}, 8), make(chan struct{})
		h := statuspage.New(s, at, statuspage.WithMaxAge(time.Hour))
		var wg sync.WaitGroup
		bodies := make([]string, 4)
		for i := range bodies {
			wg.Go(func() { bodies[i] = serveJSON(t, h, "/status.json") })
			if i == 0 {
				<-s.entered // the first request is reading
			}
		}
		close(s.gate)
		wg.Wait()
		assert.Equal(t, int32(1), s.scans.Load())
		for _, b := range bodies {
			assert.Equal(t, bodies[0], b)
		}
	})
	t.Run("a_failed_read_is_not_kept", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		h := statuspage.New(s, at, statuspage.WithMaxAge(time.Hour))
		s.fail.Store(true)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/status.json", nil))
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
		assert.Contains(t, rec.Body.String(), "the store is unreachable")
		s.fail.Store(false)
		assert.Contains(t, serveJSON(t, h, "/status.json"), `"run_id":"live-run"`)
	})
	t.Run("a_read_outlives_the_request_that_started_it", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		s.entered, s.gate = make(chan struct{}, 8), make(chan struct{})
		h := statuspage.New(s, at, statuspage.WithMaxAge(time.Hour))
		ctx, cancel := context.WithCancel(t.Context())
		first := make(chan int, 1)
		go func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/status.json", nil))
			first <- rec.Code
		}()
		<-s.entered
		cancel() // the first viewer closes the tab mid-read
		close(s.gate)
		<-first
		assert.Contains(t, serveJSON(t, h, "/status.json"), `"run_id":"live-run"`)
		assert.Equal(t, int32(1), s.scans.Load(), "the second viewer got the first one's read")
	})
	t.Run("a_release_from_the_page_is_seen_at_once", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, stores[0].open(t), statuspage.AllowForceRelease(), statuspage.WithMaxAge(time.Hour))
		assert.Equal(t, statuspage.StateExpired, leaseOf(t, f.page(t, ""), runExpired).State)
		code, body := f.post(t, "/release", f.confirmation(t, runExpired), nil)
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, statuspage.StateReleased, leaseOf(t, f.page(t, "?released=1"), runExpired).State)
	})
	t.Run("negative_max_age_is_refused", func(t *testing.T) {
		t.Parallel()
		assert.Panics(t, func() { statuspage.WithMaxAge(-time.Second) })
	})
}

func leaseOf(t *testing.T, p statuspage.Page, runID string) statuspage.Lease {
	t.Helper()
	for _, l := range p.Leases {
		if l.RunID == runID {
			return l
		}
	}
	t.Fatalf("no lease %q", runID)
	return statuspage.Lease{}
}
