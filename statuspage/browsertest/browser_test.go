// Package browsertest drives the status page in a real browser, headless
// Chromium, to check what a person at the page sees. It is a module of its
// own so that the browser driver never becomes a dependency of runlease.
package browsertest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

// chromium returns the browser to drive: $RUNLEASE_CHROMIUM, else chromium
// in PATH or /usr/bin/chromium. Without one the test skips, but fails
// under CI (CI=true), where a skipped browser test would hide a broken page.
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("RUNLEASE_CHROMIUM"), "chromium", "/usr/bin/chromium"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	const msg = "no Chromium to drive: install it (apt-get install -y chromium) or set RUNLEASE_CHROMIUM to its path"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI requires the browser test")
	}
	t.Skip(msg)
	return ""
}

// artifacts returns the directory the test's screenshots go to:
// $RUNLEASE_ARTIFACTS, else a directory of the test's own.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("RUNLEASE_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// profileDir returns a fresh browser profile directory, removed when the
// test ends. Chromium's child processes may still write in it for a moment
// after the browser stops, so removal is retried.
func profileDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "runlease-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return dir
}

// clock is the page's clock, which the test moves.
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

// seed writes a live lease (a minute left, with a mem slot), an expired
// one, a released one and a corrupt row, as of now.
func seed(t *testing.T, s runlease.Store, now time.Time) {
	t.Helper()
	ctx := t.Context()
	at := func(d time.Duration) []runlease.Option {
		t := now.Add(d)
		return []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(func() time.Time { return t })}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := runlease.Acquire(ctx, s, "live-run", "alice#node-1", at(0)...)
	must(err)
	_, err = runlease.ClaimSlots(ctx, s, "live-run", []runlease.Scope{runlease.MemScope(4)}, at(0)...)
	must(err)
	_, err = runlease.Acquire(ctx, s, "expired-run", "bob#node-2", at(-2*time.Hour)...)
	must(err)
	l, err := runlease.Acquire(ctx, s, "released-run", "carol#node-3", at(-3*time.Hour)...)
	must(err)
	must(l.Release(ctx))
	_, err = s.MetaCAS(ctx, runlease.LeasePrefix+"corrupt-run", nil, "{not json")
	must(err)
}

func TestBrowserSeesLeasesExpireAndReleasesOne(t *testing.T) {
	bin := chromium(t)
	s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := &clock{now: time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC)}
	seed(t, s, c.Now())
	page := statuspage.New(s, statuspage.WithClock(c.Now), statuspage.AllowForceRelease(),
		statuspage.WithName("sqlite:runs.db"), statuspage.WithLimits(map[string]int{"mem": 4}))
	var down atomic.Bool // the store is unreachable: every request fails
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "reading the store: unreachable", http.StatusServiceUnavailable)
			return
		}
		page.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox, // the tests run as root here
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profileDir(t)),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	defer cancel()
	// Start the browser without a timeout, which would stop the browser
	// itself, then bound the steps.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	ctx, cancelTimeout := context.WithTimeout(bctx, 60*time.Second)
	defer cancelTimeout()

	cell := func(run string, col int) string {
		return `tr[data-run="` + run + `"] td:nth-child(` + strconv.Itoa(col) + `)`
	}
	do(t, ctx, "open the page", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`#leases`))
	contains(t, text(t, ctx, `tr[data-run="live-run"]`), "live-run", "alice#node-1", "live", "in 1m", "at 2026-12-03T03:01:00Z", "release…")
	contains(t, text(t, ctx, `tr[data-run="expired-run"]`), "expired", "possible now")
	contains(t, text(t, ctx, `tr[data-run="corrupt-run"]`), "CORRUPT", "{not json", "never: inspect the row")
	contains(t, text(t, ctx, `#corrupt-banner`), "1 corrupt row")
	contains(t, text(t, ctx, `tr[data-scope="mem"]`), "1/4", "live-run (slot 0")

	// The store's clock moves past the live lease's expiry: the page's own
	// refresh, not a reload, shows it expired.
	c.Add(61 * time.Second)
	do(t, ctx, "wait for the refresh to show live-run expired",
		chromedp.Poll[chromedp.Void](`document.querySelector('`+cell("live-run", 4)+`').textContent === "expired"`,
			chromedp.WithPollingTimeout(15*time.Second)))
	contains(t, text(t, ctx, `tr[data-run="live-run"]`), "expired", "1s ago", "possible now")
	contains(t, text(t, ctx, `#refresh`), "Refreshes every 2 seconds.")
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(artifacts(t), "statuspage.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the status page: %s", path)

	// A person releases the expired run: the confirmation shows the row
	// and fence, and the browser's own POST (Origin, Sec-Fetch-Site, the
	// token) is accepted.
	navigate(t, ctx, "open expired-run's confirmation page", chromedp.Click(cell("expired-run", 7)+` a`, chromedp.NodeVisible))
	contains(t, text(t, ctx, `#fence`), "1")
	contains(t, text(t, ctx, `#stored`), `"holder":"bob#node-2"`)
	navigate(t, ctx, "confirm the release", chromedp.Click(`#confirm`, chromedp.NodeVisible))
	contains(t, text(t, ctx, `body`), "Released run expired-run", "Fence 1 kept")
	info, err := runlease.Peek(t.Context(), s, "expired-run")
	if err != nil || !info.Released || info.Fence != 1 {
		t.Fatalf("after the release: %+v, %v; want released at fence 1", info, err)
	}

	// The store stops answering: the page keeps what it showed and says
	// that it is stale, rather than going blank or looking current.
	do(t, ctx, "reopen the page", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`#leases`))
	contains(t, text(t, ctx, `tr[data-run="expired-run"]`), "released")
	down.Store(true)
	do(t, ctx, "wait for a failed refresh",
		chromedp.Poll[chromedp.Void](`document.getElementById("refresh").textContent.startsWith("Refresh failed")`,
			chromedp.WithPollingTimeout(15*time.Second)))
	contains(t, text(t, ctx, `#refresh`), "503", "showing the store as of")
	contains(t, text(t, ctx, `tr[data-run="live-run"]`), "alice#node-1")
}

// do runs steps in the browser, failing the test with what it was doing.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// navigate runs a step that loads a page, such as a click on a link, and
// waits for the page, which must be served with 200 OK.
func navigate(t *testing.T, ctx context.Context, what string, step chromedp.Action[chromedp.Void]) {
	t.Helper()
	resp, err := chromedp.RunResponse(ctx, step)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if resp.Status != 200 {
		t.Fatalf("%s: %d %s", what, resp.Status, resp.StatusText)
	}
}

// text returns the text the browser shows in the element sel selects.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(sel, chromedp.NodeVisible))
	if err != nil {
		t.Fatalf("reading %s: %v", sel, err)
	}
	return s
}

func contains(t *testing.T, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("the page shows %q, without %q", got, w)
		}
	}
}
