package statuspage_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

func TestPage(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			t.Run("the_page_shows_every_lease_its_state_and_when_takeover_is_possible", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, st.open(t))
				code, body := f.get(t, "/?released=1")
				require.Equal(t, http.StatusOK, code, body)
				assert.Contains(t, body, `<td>live-run</td><td>alice#node-1</td><td>1</td><td>live</td><td>in 1m</td><td title="at 2026-12-03T03:01:00Z">in 1m</td>`)
				assert.Contains(t, body, `<td>expired-run</td><td>bob#node-2</td><td>1</td><td>expired</td><td>1h59m ago</td><td>possible now</td>`)
				assert.Contains(t, body, `<td>released-run</td><td>-</td><td>2</td><td>released</td><td>released 3h ago</td><td>possible now</td>`)
				assert.Contains(t, body, "leases 1–4 of 4")
				assert.NotContains(t, body, "release…", "no release links without AllowForceRelease")
			})
			t.Run("a_corrupt_row_is_flagged_and_its_text_escaped", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, st.open(t))
				_, body := f.get(t, "/")
				assert.Contains(t, body, `<tr class="state-corrupt" data-run="corrupt-run">`)
				assert.Contains(t, body, `row does not parse: <code>{not json &lt;script&gt;alert(1)&lt;/script&gt;</code></td><td><strong>CORRUPT</strong>`)
				assert.NotContains(t, body, "<script>alert")
				assert.Regexp(t, `<div id="corrupt-banner" class="banner" role="alert">\s*Corrupt rows: <strong id="corrupt-count">2</strong>\. A row that does not parse`, body,
					"one corrupt lease and one corrupt slot")
				assert.Contains(t, body, `CORRUPT row &#34;runslot:mem:3&#34;`)
			})
			t.Run("slots_show_their_fill_against_the_limits_given", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, st.open(t))
				_, body := f.get(t, "/")
				assert.Contains(t, body, `<td>mem</td><td>2/4</td><td><meter min="0" max="4" value="2"></meter></td><td>live-run (slot 0, in 1m), CORRUPT row`)
				assert.Contains(t, body, `<td>gpu</td><td>0/2</td>`, "a scope of the limits that holds nothing")
				assert.Contains(t, body, `<td>principal:alice</td><td>1</td><td></td><td>live-run (slot 0, in 1m)</td>`)
			})
			t.Run("status_json_has_the_fields_of_status_json", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, st.open(t))
				p := f.page(t, "?released=1")
				assert.Equal(t, base, p.Now)
				require.Len(t, p.Leases, 4)
				assert.Equal(t, []string{runCorrupt, runExpired, runLive, runReleased},
					[]string{p.Leases[0].RunID, p.Leases[1].RunID, p.Leases[2].RunID, p.Leases[3].RunID})
				live := p.Leases[2]
				assert.Equal(t, statuspage.StateLive, live.State)
				assert.Equal(t, liveHolder, live.Holder)
				assert.Equal(t, int64(60_000), *live.ExpiresInMS)
				assert.False(t, live.TakeoverPossible)
				assert.Equal(t, map[string]int{"live": 1, "expired": 1, "released": 1, "corrupt": 1}, p.Counts)
				assert.Equal(t, 1, p.CorruptSlots)
				assert.Equal(t, 4, p.Matched)
				assert.Equal(t, 0, p.Omitted)
				assert.False(t, p.ForceRelease)

				// The stable field names, exactly and nothing else: a script
				// written against status --json reads this endpoint unchanged.
				_, body := f.get(t, "/status.json")
				var raw map[string]any
				require.NoError(t, json.Unmarshal([]byte(body), &raw))
				assert.Equal(t, []string{"leases", "now", "omitted", "scopes", "store", "table"}, keys(raw))
				assert.Equal(t, p.Document, f.status(t, ""), "status.json is the page's document, released leases shown")
				lease := raw["leases"].([]any)[0].(map[string]any)
				assert.ElementsMatch(t, []string{"run_id", "state", "holder", "fence", "until", "until_ms",
					"expires_in_ms", "takeover_possible", "takeover_at", "row"}, keys(lease))
			})
			t.Run("the_clock_turns_a_live_lease_expired", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, st.open(t))
				f.clock.Add(61 * time.Second)
				_, body := f.get(t, "/")
				assert.Contains(t, body, `<td>live-run</td><td>alice#node-1</td><td>1</td><td>expired</td><td>1s ago</td><td>possible now</td>`)
			})
		})
	}
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestFilters(t *testing.T) {
	t.Parallel()
	s := stores[0].open(t)
	f := newFixture(t, s)
	ids := func(p statuspage.Page) []string {
		var out []string
		for _, l := range p.Leases {
			out = append(out, l.RunID)
		}
		return out
	}
	cases := []struct {
		name, query string
		want        []string
		matched     int
		omitted     int
	}{
		{"every_lease_but_released_without_filters", "", []string{runCorrupt, runExpired, runLive}, 3, 0},
		{"released_shows_released_leases_too", "?released=1", []string{runCorrupt, runExpired, runLive, runReleased}, 4, 0},
		{"state_keeps_the_states_given", "?state=live,corrupt", []string{runCorrupt, runLive}, 2, 0},
		{"state_may_repeat", "?state=live&state=released", []string{runLive, runReleased}, 2, 0},
		{"run_keeps_a_prefix", "?run=l", []string{runLive}, 1, 0},
		{"run_and_state_together", "?run=e&state=live", nil, 0, 0},
		{"limit_pages_and_counts_the_rest", "?limit=1&released=1", []string{runCorrupt}, 4, 3},
		{"offset_moves_the_page", "?limit=2&offset=1&released=1", []string{runExpired, runLive}, 4, 1},
		{"offset_beyond_the_end_is_empty", "?offset=10", nil, 3, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := f.page(t, c.query)
			assert.Equal(t, c.want, ids(p))
			assert.Equal(t, c.matched, p.Matched)
			assert.Equal(t, c.omitted, p.Omitted)
			assert.Len(t, p.Scopes, 3, "scopes are never filtered")
		})
	}
	t.Run("counts_follow_the_run_prefix_not_the_state", func(t *testing.T) {
		t.Parallel()
		p := f.page(t, "?run=live&state=expired")
		assert.Equal(t, map[string]int{"live": 1, "expired": 0, "released": 0, "corrupt": 0}, p.Counts)
	})
	t.Run("the_page_links_the_next_and_previous_pages", func(t *testing.T) {
		t.Parallel()
		_, body := f.get(t, "/?limit=1&offset=1&released=1")
		assert.Contains(t, body, `href="?limit=1&amp;released=1">← previous</a>`)
		assert.Contains(t, body, `href="?limit=1&amp;offset=2&amp;released=1">next →</a>`)
		assert.Contains(t, body, "leases 2–2 of 4")
	})
	t.Run("status_json_shows_released_leases_as_status_json_does", func(t *testing.T) {
		t.Parallel()
		d := f.status(t, "")
		assert.Equal(t, []string{runCorrupt, runExpired, runLive, runReleased}, ids(statuspage.Page{Document: d}))
		d = f.status(t, "?state=live,expired&limit=1")
		assert.Equal(t, []string{runExpired}, ids(statuspage.Page{Document: d}))
		assert.Equal(t, 1, d.Omitted)
	})
	t.Run("the_page_hides_released_leases_and_links_them", func(t *testing.T) {
		t.Parallel()
		_, body := f.get(t, "/")
		assert.NotContains(t, body, `data-run="released-run"`)
		assert.Contains(t, body, `<a id="released-toggle" href="?released=1">show released leases (<span id="released-hidden">1</span>)</a>`)
		assert.Contains(t, body, "(1 released hidden)")
		_, body = f.get(t, "/?released=1")
		assert.Contains(t, body, `data-run="released-run"`)
		assert.Contains(t, body, `<a id="released-toggle" href="?">hide released leases</a>`)
		_, body = f.get(t, "/?state=released")
		assert.Contains(t, body, `data-run="released-run"`, "a state filter shows what it names")
		assert.NotContains(t, body, "released-toggle")
	})
	for _, q := range []string{"?state=held", "?limit=0", "?limit=1001", "?limit=x", "?offset=-1", "?released=yes"} {
		t.Run("a_bad_query_is_refused_"+q, func(t *testing.T) {
			t.Parallel()
			for _, path := range []string{"/", "/page.json", "/status.json"} {
				code, body := f.get(t, path+q)
				assert.Equal(t, http.StatusBadRequest, code, body)
			}
		})
	}
	for _, q := range []string{"?released=1", "?explain=live-run"} {
		t.Run("status_json_refuses_the_pages_own_settings_"+q, func(t *testing.T) {
			t.Parallel()
			code, body := f.get(t, "/status.json"+q)
			assert.Equal(t, http.StatusBadRequest, code, body)
		})
	}
}

func TestPasswordNeverReachesThePage(t *testing.T) {
	t.Parallel()
	const password = "s3cret-pw"
	target, err := runlease.ParseTarget("postgres://ops:" + password + "@db.internal:5432/runs?table=leases")
	require.NoError(t, err)
	f := newFixture(t, stores[0].open(t), statuspage.WithTarget(target), statuspage.AllowForceRelease())
	for _, path := range []string{"/", "/status.json", "/release?run=" + runLive, "/release?run=" + runCorrupt} {
		_, body := f.get(t, path)
		assert.NotContains(t, body, password, path)
		assert.Contains(t, body, "postgres://ops@db.internal:5432/runs?table=leases", path)
	}
	p := f.page(t, "")
	require.NotNil(t, p.Table)
	assert.Equal(t, "leases", *p.Table)
}

func TestNotFoundAndAssets(t *testing.T) {
	t.Parallel()
	f := newFixture(t, stores[0].open(t))
	code, _ := f.get(t, "/nothing")
	assert.Equal(t, http.StatusNotFound, code)
	code, body := f.get(t, "/assets/page.js")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "page.json")
	resp, err := f.srv.Client().Get(f.srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.True(t, strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'"),
		"no inline script runs")
}

func TestNewRefusesMisuse(t *testing.T) {
	t.Parallel()
	assert.PanicsWithValue(t, "statuspage: RUN-E001: New: nil store", func() { statuspage.New(nil) })
	assert.Panics(t, func() { statuspage.New(stores[0].open(t), statuspage.WithLimits(map[string]int{"mem": 0})) })
}
