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

// seedQueues queues runs by clock c as drivers in ClaimSlotsWait do: gpu
// (limit 2) is held whole, batch (limit 3) has one unit of three free.
// Five runs wait in gpu (q-3 in batch too), and q-6 and q-7 in batch
// only; the holders and entries live for an hour of c, and the waiters
// look again only when woken, so the queues stay as they are until the
// test ends, when the waiters give up.
func seedQueues(t *testing.T, s runlease.Store, c *clock) {
	t.Helper()
	opts := []runlease.Option{runlease.WithTTL(time.Hour), runlease.WithClock(c.Now)}
	gpu, batch := runlease.NamedScope("gpu", 2), runlease.NamedScope("batch", 3)
	for run, sc := range map[string]runlease.Scope{"train-a": gpu.Take(2), "etl-b": batch.Take(2)} {
		if _, err := runlease.ClaimSlots(t.Context(), s, run, []runlease.Scope{sc}, opts...); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // before the store closes
	waiters := []struct {
		run, principal string
		priority       int
		scopes         []runlease.Scope
	}{
		{"q-1", "alice", 0, []runlease.Scope{gpu}},
		{"q-2", "bob", 5, []runlease.Scope{gpu.Take(2)}},
		{"q-3", "alice", 0, []runlease.Scope{gpu, batch}},
		{"q-4", "carol", 0, []runlease.Scope{gpu}},
		{"q-5", "dave", 0, []runlease.Scope{gpu}},
		{"q-6", "erin", 0, []runlease.Scope{batch.Take(2)}},
		{"q-7", "erin", 0, []runlease.Scope{batch}},
	}
	entries := 0
	for _, w := range waiters {
		wg.Go(func() {
			_, err := runlease.ClaimSlotsWait(ctx, s, w.run, w.scopes, append(opts, runlease.WithWaitPoll(time.Hour),
				runlease.WithFairShare(w.principal, 1), runlease.WithPriority(w.priority))...)
			if err != context.Canceled {
				t.Errorf("%s: %v; want it never admitted", w.run, err)
			}
		})
		entries += len(w.scopes)
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			q, err := runlease.Queues(t.Context(), s, runlease.WithClock(c.Now))
			if err == nil && len(q) == entries {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not queue: %d entries, %v", w.run, len(q), err)
			}
		}
	}
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
	seedQueues(t, s, c)
	page := statuspage.New(s, statuspage.WithClock(c.Now), statuspage.AllowForceRelease(),
		statuspage.WithName("sqlite:runs.db"), statuspage.WithLimits(map[string]int{"mem": 4, "gpu": 2, "batch": 3}))
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
	contains(t, text(t, ctx, `tr[data-run="live-run"]`), "live-run", "alice#node-1", "live", "in 1m", "release…")
	contains(t, attr(t, ctx, cell("live-run", 6), "title"), "at 2026-12-03T03:01:00Z")
	if got := text(t, ctx, cell("live-run", 6)); got != "in 1m" {
		t.Errorf("takeover of live-run: %q, want it relative to now", got)
	}
	contains(t, text(t, ctx, `tr[data-run="expired-run"]`), "expired", "possible now")
	contains(t, text(t, ctx, `tr[data-run="corrupt-run"]`), "CORRUPT", "{not json", "never: inspect the row")
	contains(t, text(t, ctx, `#corrupt-banner`), "Corrupt rows: 1.")
	contains(t, text(t, ctx, `tr[data-scope="mem"]`), "1/4", "live-run (slot 0")

	// The store's clock moves past the live lease's expiry: the page's own
	// refresh, not a reload, shows it expired.
	c.Add(61 * time.Second)
	do(t, ctx, "wait for the refresh to show live-run expired",
		chromedp.Poll[chromedp.Void](`document.querySelector('`+cell("live-run", 4)+`').textContent === "expired"`,
			chromedp.WithPollingTimeout(15*time.Second)))
	contains(t, text(t, ctx, `tr[data-run="live-run"]`), "expired", "1s ago", "possible now")
	contains(t, text(t, ctx, `#refresh`), "Refreshes every 2 seconds.")

	// The queues, as refreshed: two scopes, their waiters in order, how
	// long each has waited, and why.
	queue := func(scope string, pos int) string {
		return `table.queue[data-queue="` + scope + `"] tbody tr:nth-child(` + strconv.Itoa(pos) + `)`
	}
	do(t, ctx, "wait for the refresh to age the waiters",
		chromedp.Poll[chromedp.Void](`document.querySelector('`+queue("gpu", 5)+` td:nth-child(6)').textContent === "1m1s ago"`,
			chromedp.WithPollingTimeout(15*time.Second)))
	for i, want := range [][]string{
		{"q-2", "bob", "5", "2", "1m1s ago", "capacity: 2 of 2 units in use, 0 free; it asks 2"},
		{"q-1", "alice", "0", "1", "capacity"},
		{"q-4", "carol", "capacity"},
		{"q-5", "dave", "capacity"},
		{"q-3", "alice", "capacity"},
	} {
		contains(t, text(t, ctx, queue("gpu", i+1)), append(want, strconv.Itoa(i+1), "explain")...)
	}
	contains(t, text(t, ctx, queue("batch", 1)), "q-3", "nothing here: held back in gpu (capacity)")
	contains(t, text(t, ctx, queue("batch", 2)), "q-6", "erin", "capacity: 2 of 3 units in use, 1 free; it asks 2")
	contains(t, text(t, ctx, queue("batch", 3)), "q-7", "erin", "order: 1 of 3 units free, 3 reserved by the 2 waiters ahead; it asks 1")
	if n := count(t, ctx, `table.queue tbody tr`); n != 8 {
		t.Errorf("%d waiters shown, want 8 in two scopes", n)
	}
	screenshot(t, ctx, "statuspage.png")

	// A person asks why q-7 waits: its explanation, which the page's
	// refresh keeps current.
	navigate(t, ctx, "open q-7's explanation", chromedp.Click(queue("batch", 3)+` a`, chromedp.NodeVisible))
	contains(t, text(t, ctx, `#explain`), "Why q-7 waits", "held back in batch (order)")
	contains(t, text(t, ctx, `#explain-scopes tr[data-scope="batch"]`), "2/3", "3 of 3",
		"order: 1 of 3 units free", "q-3 (1 unit), q-6 (2 units)", "etl-b (slot 0, in 58m59s)")
	c.Add(60 * time.Second)
	do(t, ctx, "wait for the refresh to update the explanation",
		chromedp.Poll[chromedp.Void](`document.querySelector('#explain-scopes tr[data-scope="batch"]').textContent.includes("in 57m59s")`,
			chromedp.WithPollingTimeout(15*time.Second)))
	contains(t, text(t, ctx, `#explain-summary`), "held back in batch (order)")
	screenshot(t, ctx, "statuspage-explain.png")
	navigate(t, ctx, "close the explanation", chromedp.Click(`#explain-close`, chromedp.NodeVisible))
	if n := count(t, ctx, `#explain:not([hidden])`); n != 0 {
		t.Errorf("the explanation is still shown after close")
	}

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
	// Released leases are hidden until asked for.
	do(t, ctx, "reopen the page", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`#leases`))
	if n := count(t, ctx, `tr[data-run="expired-run"]`); n != 0 {
		t.Errorf("the released expired-run is shown without being asked for")
	}
	contains(t, text(t, ctx, `.pages`), "(2 released hidden)")
	navigate(t, ctx, "show released leases", chromedp.Click(`#released-toggle`, chromedp.NodeVisible))
	contains(t, text(t, ctx, `tr[data-run="expired-run"]`), "released")
	contains(t, text(t, ctx, `#released-toggle`), "hide released leases")
	down.Store(true)
	do(t, ctx, "wait for a failed refresh",
		chromedp.Poll[chromedp.Void](`document.getElementById("refresh").textContent.startsWith("Refresh failed")`,
			chromedp.WithPollingTimeout(15*time.Second)))
	contains(t, text(t, ctx, `#refresh`), "503", "showing the store as of")
	contains(t, text(t, ctx, `tr[data-run="live-run"]`), "alice#node-1")
}

// screenshot saves the whole page to name in the artifacts directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(artifacts(t), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the status page: %s", path)
}

// attr returns the attribute name of the element sel selects.
func attr(t *testing.T, ctx context.Context, sel, name string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.AttributeValue(sel, name, chromedp.NodeVisible))
	if err != nil {
		t.Fatalf("reading %s's %s: %v", sel, name, err)
	}
	return v.Value
}

// count returns how many elements sel selects.
func count(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('`+sel+`').length`))
	if err != nil {
		t.Fatalf("counting %s: %v", sel, err)
	}
	return n
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
