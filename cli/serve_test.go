package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// syncBuffer is a bytes.Buffer safe for the serving goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingRE = regexp.MustCompile(`at (http://[^ ]+/) `)

// server is a running serve command.
type server struct {
	url    string
	stdout *syncBuffer
	stop   func() result // interrupts serve and returns what it did
}

// startServe runs serve with args on a free loopback port and waits until
// it listens.
func startServe(t *testing.T, env map[string]string, args ...string) *server {
	t.Helper()
	return startServeIn(t, session{env: env}, args...)
}

// startServeIn is startServe in the session sess.
func startServeIn(t *testing.T, sess session, args ...string) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	out := &syncBuffer{}
	sess.ctx, sess.stdout = ctx, out
	done := make(chan result, 1)
	go func() {
		done <- sess.run(t, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	}()
	var r result
	stop := func() result {
		cancel()
		r := <-done
		r.stdout = out.String()
		return r
	}
	require.Eventually(t, func() bool {
		select {
		case r = <-done:
			return true
		default:
			return servingRE.MatchString(out.String())
		}
	}, 10*time.Second, 5*time.Millisecond)
	m := servingRE.FindStringSubmatch(out.String())
	require.NotNil(t, m, "serve ended: %d %s %s", r.code, out.String(), r.stderr)
	t.Cleanup(func() { cancel() })
	return &server{url: m[1], stdout: out, stop: stop}
}

func httpGet(t *testing.T, u string, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestServeBesideARunningDriver(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	driver, err := runlease.OpenSQLite(path) // holds the writer lock
	require.NoError(t, err)
	t.Cleanup(func() { driver.Close() })

	srv := startServe(t, nil, "--db", path, "--limit", "mem=4")
	assert.Contains(t, srv.stdout.String(), "(read-only)")
	code, body := httpGet(t, srv.url, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "<td>live-run</td><td>alice#node-1</td>")
	assert.Contains(t, body, "<strong>CORRUPT</strong>")
	assert.Contains(t, body, "<td>mem</td><td>1/4</td>")
	assert.NotContains(t, body, "release…")
	code, body = httpGet(t, srv.url+"status.json?state=live", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"store":"sqlite:`+path+`"`)
	assert.Contains(t, body, `"run_id":"live-run"`)
	code, _ = httpGet(t, srv.url+"release?run=live-run", "")
	assert.Equal(t, http.StatusForbidden, code)

	r := srv.stop()
	assert.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "stopped")
}

func TestServeAnswersOnlyLoopbackNames(t *testing.T) {
	t.Parallel()
	srv := startServe(t, nil, "--db", newDB(t))
	code, _ := httpGet(t, srv.url, "rebound.example:8080")
	assert.Equal(t, http.StatusMisdirectedRequest, code)
	for _, host := range []string{"localhost:8080", "127.0.0.1", "[::1]:80"} {
		code, _ = httpGet(t, srv.url, host)
		assert.Equal(t, http.StatusOK, code, host)
	}
}

func TestServeRefusesANonLoopbackListen(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "192.0.2.1:8080", "example.com:80"} {
		r := session{}.run(t, "serve", "--db", db, "--listen", addr)
		assert.Equal(t, exitUsage, r.code, addr)
		assert.Contains(t, r.stderr, "not a loopback address", addr)
		assert.Contains(t, r.stderr, "--listen-any", addr)
	}
	r := session{}.run(t, "serve", "--db", db, "--listen", "nonsense")
	assert.Equal(t, exitUsage, r.code)
	t.Run("listen_any_allows_it", func(t *testing.T) {
		srv := startServe(t, nil, "--db", db, "--listen", "0.0.0.0:0", "--listen-any")
		r := srv.stop()
		assert.Equal(t, exitOK, r.code, r.stderr)
	})
}

func TestServeForceReleaseNeedsTheWriter(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	driver, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	r := session{}.run(t, "serve", "--db", path, "--listen", "127.0.0.1:0", "--allow-force-release")
	assert.Equal(t, exitError, r.code)
	assert.Contains(t, r.stderr, "RUN-E010")
	require.NoError(t, driver.Close())

	srv := startServe(t, nil, "--db", path, "--allow-force-release")
	assert.Contains(t, srv.stdout.String(), "force release allowed")
	code, body := httpGet(t, srv.url+"release?run=live-run", "")
	require.Equal(t, http.StatusOK, code, body)
	tok := regexp.MustCompile(`name="token" value="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, tok, body)
	row := peekRow(t, openDB(t, path), runLive).Row
	form := url.Values{"run": {runLive}, "row": {row}, "token": {tok[1]}}
	resp, err := http.Post(srv.url+"release", "application/x-www-form-urlencoded", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, peekRow(t, openDB(t, path), runLive).Released)
}

func TestServePostgresNeverShowsThePassword(t *testing.T) {
	t.Parallel()
	dsn, table, s := newPGStore(t)
	seed(t, s)
	const password = "s3cret-serve-pw"
	// The test server trusts local connections, so any password connects.
	withPassword := dsn + "&password=" + password
	if !strings.Contains(dsn, "?") {
		withPassword = dsn + "?password=" + password
	}
	srv := startServe(t, nil, "--postgres", withPassword, "--table", table)
	assert.NotContains(t, srv.stdout.String(), password)
	for _, p := range []string{"", "status.json"} {
		code, body := httpGet(t, srv.url+p, "")
		require.Equal(t, http.StatusOK, code, body)
		assert.NotContains(t, body, password, p)
		assert.Contains(t, body, "live-run", p)
		assert.Contains(t, body, table, p)
	}
}

// The status page's JSON and status --json are one document: the same
// store name, table, leases and scopes, field for field, but for the
// milliseconds left, which depend on when each was read.
func TestServeJSONIsStatusJSON(t *testing.T) {
	t.Parallel()
	path := newDB(t)
	st := runCLI(t, "status", "--json", "--db", path, "--limit", "mem=4", "--limit", "gpu=2")
	require.Equal(t, exitCorrupt, st.code, st.stderr)
	srv := startServe(t, nil, "--db", path, "--limit", "mem=4", "--limit", "gpu=2")
	code, body := httpGet(t, srv.url+"status.json", "")
	require.Equal(t, http.StatusOK, code, body)

	var page statusDoc
	require.NoError(t, json.Unmarshal([]byte(body), &page))
	cli := decodeStatus(t, st.stdout)
	for _, d := range []*statusDoc{&page, &cli} {
		d.Now = time.Time{}
		for i := range d.Leases {
			d.Leases[i].ExpiresInMS = nil
		}
		for i := range d.Scopes {
			for j := range d.Scopes[i].Slots {
				d.Scopes[i].Slots[j].ExpiresInMS = nil
			}
		}
	}
	assert.Equal(t, cli, page)
	assert.Len(t, page.Leases, 4)
	assert.Len(t, page.Scopes, 3)
}

func TestServeBoundsEachRequestByTimeout(t *testing.T) {
	t.Parallel()
	var left time.Duration
	h := withTimeout(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deadline, ok := r.Context().Deadline()
		require.True(t, ok, "the store's reads get a deadline")
		left = time.Until(deadline)
	}), 3*time.Second)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/", nil))
	assert.InDelta(t, 3*time.Second, left, float64(time.Second))
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.8.9.10": true, "::1": true, "[::1]": true, "localhost": true, "LOCALHOST.": true,
		"app.localhost": true, "": false, "0.0.0.0": false, "::": false, "192.0.2.1": false, "example.com": false,
		"localhost.example.com": false, "127.0.0.1.nip.io": false,
	} {
		assert.Equal(t, want, isLoopback(host), host)
	}
}
