package statuspage_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/statuspage"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The runs seed writes, one per state.
const (
	runLive     = "live-run"
	runExpired  = "expired-run"
	runReleased = "released-run"
	runCorrupt  = "corrupt-run"
	liveHolder  = "alice#node-1"
	corruptRow  = "{not json <script>alert(1)</script>"
)

// base is the instant the tests' clock starts at.
var base = time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC)

// clock is a settable clock for the handler.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// stores are the built-in stores the handler tests run on.
var stores = []struct {
	name string
	open func(t *testing.T) runlease.Store
}{
	{"sqlite", func(t *testing.T) runlease.Store {
		s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"postgres", func(t *testing.T) runlease.Store {
		pool := pgtest.Pool(t)
		s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(pgtest.NewTable(t, pool)))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

// seed writes one lease of every state and some slots into s, by clock c:
// runLive is held for a minute with slots in mem and principal:alice;
// runExpired expired two hours ago; runReleased was released at fence 2
// three hours ago; runCorrupt does not parse, nor does one mem slot row.
func seed(t *testing.T, s runlease.Store, c *clock) {
	t.Helper()
	ctx := t.Context()
	ago := func(d time.Duration) []runlease.Option {
		now := c.Now().Add(-d)
		return []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(func() time.Time { return now })}
	}
	_, err := runlease.Acquire(ctx, s, runLive, liveHolder, ago(0)...)
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(ctx, s, runLive, []runlease.Scope{runlease.MemScope(4), runlease.PrincipalScope("alice", 1)}, ago(0)...)
	require.NoError(t, err)
	_, err = runlease.Acquire(ctx, s, runExpired, "bob#node-2", ago(2*time.Hour)...)
	require.NoError(t, err)
	for range 2 {
		l, err := runlease.Acquire(ctx, s, runReleased, "carol#node-3", ago(3*time.Hour)...)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	for key, row := range map[string]string{runlease.LeasePrefix + runCorrupt: corruptRow, runlease.SlotPrefix + "mem:3": "garbage"} {
		ok, err := s.MetaCAS(ctx, key, nil, row)
		require.NoError(t, err)
		require.True(t, ok)
	}
}

// fixture is a seeded store and a test server of its status page.
type fixture struct {
	store runlease.Store
	clock *clock
	srv   *httptest.Server
}

func newFixture(t *testing.T, s runlease.Store, opts ...statuspage.Option) *fixture {
	t.Helper()
	f := &fixture{store: s, clock: &clock{now: base}}
	seed(t, s, f.clock)
	opts = append([]statuspage.Option{statuspage.WithClock(f.clock.Now), statuspage.WithLimits(map[string]int{"mem": 4, "gpu": 2})}, opts...)
	f.srv = httptest.NewServer(statuspage.New(s, opts...))
	t.Cleanup(f.srv.Close)
	return f
}

// get fetches path from the fixture's server and returns the status and
// body.
func (f *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := f.srv.Client().Get(f.srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// post sends form to path as a browser on the page's own origin would.
func (f *fixture) post(t *testing.T, path string, form url.Values, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", f.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := f.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// page fetches page.json, what the page's script reads, with query and
// decodes it.
func (f *fixture) page(t *testing.T, query string) statuspage.Page {
	t.Helper()
	code, body := f.get(t, "/page.json"+query)
	require.Equal(t, http.StatusOK, code, body)
	var p statuspage.Page
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&p), body)
	return p
}

// status fetches status.json with query and decodes it: nothing but the
// status document.
func (f *fixture) status(t *testing.T, query string) statuspage.Document {
	t.Helper()
	code, body := f.get(t, "/status.json"+query)
	require.Equal(t, http.StatusOK, code, body)
	var d statuspage.Document
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&d), body)
	return d
}

// peek reads runID's lease, failing the test on error.
func peek(t *testing.T, s runlease.Store, runID string) runlease.LeaseInfo {
	t.Helper()
	info, err := runlease.Peek(t.Context(), s, runID)
	require.NoError(t, err)
	return info
}
