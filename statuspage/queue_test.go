package statuspage_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

// hostileRun is a waiting run whose id is markup.
const hostileRun = `q-<img src=x onerror=alert(1)>`

// seedQueues queues runs by clock c as drivers in ClaimSlotsWait do: gpu
// (limit 2) is held whole by gpu-holder, batch (limit 3) has one unit of
// three free. In gpu wait q-2 (priority 5, two units), q-1, q-3 (in batch
// too), q-4 and hostileRun; in batch q-3, q-6 (two units) and q-7, and in
// scratch, whose limit the page is not given, q-8. Nothing changes until
// the test ends, when the waiters give up.
func seedQueues(t *testing.T, s runlease.Store, c *clock) {
	t.Helper()
	opts := []runlease.Option{runlease.WithTTL(time.Hour), runlease.WithClock(c.Now)}
	gpu, batch := runlease.NamedScope("gpu", 2), runlease.NamedScope("batch", 3)
	_, err := runlease.ClaimSlots(t.Context(), s, "gpu-holder", []runlease.Scope{gpu.Take(2)}, opts...)
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(t.Context(), s, "batch-holder", []runlease.Scope{batch.Take(2)}, opts...)
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(t.Context(), s, "scratch-holder", []runlease.Scope{runlease.NamedScope("scratch", 1)}, opts...)
	require.NoError(t, err)
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
		{hostileRun, "dave", 0, []runlease.Scope{gpu}},
		{"q-6", "erin", 0, []runlease.Scope{batch.Take(2)}},
		{"q-7", "erin", 0, []runlease.Scope{batch}},
		{"q-8", "", 0, []runlease.Scope{runlease.NamedScope("scratch", 1)}},
	}
	entries := 0
	for _, w := range waiters {
		wg.Go(func() {
			_, err := runlease.ClaimSlotsWait(ctx, s, w.run, w.scopes, append(opts, runlease.WithWaitPoll(time.Hour),
				runlease.WithFairShare(w.principal, 1), runlease.WithPriority(w.priority))...)
			assert.ErrorIs(t, err, context.Canceled, "%s is never admitted", w.run)
		})
		entries += len(w.scopes)
		// One at a time, so that the queues' order is the order above.
		require.Eventually(t, func() bool {
			q, err := runlease.Queues(t.Context(), s, runlease.WithClock(c.Now))
			return err == nil && len(q) == entries
		}, 20*time.Second, 5*time.Millisecond, "%s queues", w.run)
	}
}

func newQueueFixture(t *testing.T, s runlease.Store) *fixture {
	t.Helper()
	f := newFixture(t, s, statuspage.WithLimits(map[string]int{"batch": 3}), statuspage.WithMaxAge(0))
	seedQueues(t, s, f.clock)
	return f
}

// queueRow is the text of a waiter's row in the page's HTML.
func queueRow(pos int, run, principal string, priority, units int, since, why string) string {
	return "<td>" + itoa(pos) + "</td><td>" + run + "</td><td>" + principal + "</td><td>" + itoa(priority) +
		"</td><td>" + itoa(units) + "</td><td title=\"2026-12-03T03:00:00Z\">" + since + "</td><td>" + why + "</td>"
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestQueueView(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			f := newQueueFixture(t, st.open(t))
			f.clock.Add(12 * time.Second)
			code, body := f.get(t, "/")
			require.Equal(t, http.StatusOK, code, body)

			t.Run("every_scope_lists_its_waiters_in_order_with_why_each_waits", func(t *testing.T) {
				capacity := "capacity: 2 of 2 units in use, 0 free; it asks "
				gpu := []string{
					queueRow(1, "q-2", "bob", 5, 2, "12s ago", capacity+"2"),
					queueRow(2, "q-1", "alice", 0, 1, "12s ago", capacity+"1"),
					queueRow(3, "q-4", "carol", 0, 1, "12s ago", capacity+"1"),
					queueRow(4, "q-&lt;img src=x onerror=alert(1)&gt;", "dave", 0, 1, "12s ago", capacity+"1"),
					// alice's second run, behind the other principals' first
					queueRow(5, "q-3", "alice", 0, 1, "12s ago", capacity+"1"),
				}
				batch := []string{
					queueRow(1, "q-3", "alice", 0, 1, "12s ago", "nothing here: held back in gpu (capacity)"),
					queueRow(2, "q-6", "erin", 0, 2, "12s ago", "capacity: 2 of 3 units in use, 1 free; it asks 2"),
					queueRow(3, "q-7", "erin", 0, 1, "12s ago", "order: 1 of 3 units free, 3 reserved by the 2 waiters ahead; it asks 1"),
				}
				for scope, rows := range map[string][]string{"gpu": gpu, "batch": batch} {
					i := strings.Index(body, `<table class="queue" data-queue="`+scope+`">`)
					require.GreaterOrEqual(t, i, 0, scope)
					table := body[i : i+strings.Index(body[i:], "</table>")]
					last := -1
					for _, row := range rows {
						j := strings.Index(table, row)
						assert.Greater(t, j, last, "%s: %s, in order", scope, row)
						last = j
					}
				}
				assert.Contains(t, body, queueRow(1, "q-8", "-", 0, 1, "12s ago",
					"unknown: no limit given for scratch (serve --limit SCOPE=N, statuspage.WithLimits)"))
				assert.NotContains(t, body, "<img", "a run id is text, never markup")
			})
			t.Run("a_waiter_links_its_explanation", func(t *testing.T) {
				assert.Contains(t, body, `<a href="?explain=q-7#explain">explain</a>`)
				assert.Contains(t, body, `<section id="explain" class="explain" hidden>`, "no run explained unless asked")
			})
			t.Run("the_explanation_of_one_run", func(t *testing.T) {
				_, body := f.get(t, "/?explain=q-7&released=1")
				assert.Contains(t, body, `<section id="explain" class="explain">`)
				assert.Contains(t, body, `Why <span id="explain-run">q-7</span> waits <a id="explain-close" href="?released=1">close</a>`)
				assert.Contains(t, body, `<p id="explain-summary">held back in batch (order)</p>`)
				_, q3 := f.get(t, "/?explain=q-3")
				assert.Contains(t, q3, `<tr data-scope="batch"><td>batch</td><td>2/3</td><td>1</td><td>1 of 3</td><td>0</td><td>nothing here: held back in gpu (capacity)</td>`)
				assert.Contains(t, body, `<tr data-scope="batch"><td>batch</td><td>2/3</td><td>1</td><td>3 of 3</td><td>3</td>`+
					`<td>order: 1 of 3 units free, 3 reserved by the 2 waiters ahead; it asks 1</td>`+
					`<td>q-3 (1 unit), q-6 (2 units)</td><td>batch-holder (slot 0, in 59m48s), batch-holder (slot 1, in 59m48s)</td></tr>`)
				assert.Contains(t, body, `href="?explain=q-1&amp;released=1#explain"`, "the links keep the page's filters")

				_, body = f.get(t, "/?explain="+strings.ReplaceAll(hostileRun, " ", "+"))
				assert.Contains(t, body, `Why <span id="explain-run">q-&lt;img src=x onerror=alert(1)&gt;</span> waits`)
				assert.NotContains(t, body, "<img")

				_, body = f.get(t, "/?explain=nobody")
				assert.Contains(t, body, `<p id="explain-summary">run nobody is in no queue: it was admitted, gave up, or never waited</p>`)
			})
			t.Run("page_json_has_the_why_and_the_explanation_status_json_has_neither", func(t *testing.T) {
				p := f.page(t, "?explain=q-3")
				assert.Equal(t, statuspage.Why{BlockedBy: "capacity", Text: "capacity: 2 of 2 units in use, 0 free; it asks 1"}, p.Why["gpu"]["q-3"])
				assert.Equal(t, "order", p.Why["batch"]["q-7"].BlockedBy)
				assert.Equal(t, "unknown", p.Why["scratch"]["q-8"].BlockedBy)
				require.NotNil(t, p.Explain)
				assert.True(t, p.Explain.Waiting)
				assert.False(t, p.Explain.Admissible)
				require.Len(t, p.Explain.Scopes, 2)
				assert.Equal(t, "held back in gpu (capacity)", p.Explain.Summary)
				d := f.status(t, "")
				assert.Equal(t, p.Document.Scopes, d.Scopes, "status.json's queues are the page's")
				assert.Len(t, d.Scopes, 5, "batch, gpu, mem, principal:alice and scratch")
			})
		})
	}
}
