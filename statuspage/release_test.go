package statuspage_test

import (
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

var (
	tokenRE = regexp.MustCompile(`name="token" value="([^"]+)"`)
	rowRE   = regexp.MustCompile(`name="row" value="([^"]+)"`)
)

// confirmation opens runID's confirmation page and returns the form it
// would post.
func (f *fixture) confirmation(t *testing.T, runID string) url.Values {
	t.Helper()
	code, body := f.get(t, "/release?run="+url.QueryEscape(runID))
	require.Equal(t, http.StatusOK, code, body)
	tok, row := tokenRE.FindStringSubmatch(body), rowRE.FindStringSubmatch(body)
	require.NotNil(t, tok, body)
	require.NotNil(t, row, body)
	return url.Values{"run": {runID}, "row": {htmlUnescape(row[1])}, "token": {tok[1]}}
}

func htmlUnescape(s string) string {
	r := regexp.MustCompile(`&#34;|&quot;`)
	return r.ReplaceAllString(s, `"`)
}

func TestForceReleaseIsOffByDefault(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, st.open(t))
			before := peek(t, f.store, runLive)
			code, body := f.get(t, "/release?run="+runLive)
			assert.Equal(t, http.StatusForbidden, code)
			assert.Contains(t, body, "force release is disabled")
			code, _ = f.post(t, "/release", url.Values{"run": {runLive}, "row": {before.Row}, "token": {"1.x"}}, nil)
			assert.Equal(t, http.StatusForbidden, code)
			for _, m := range []string{http.MethodPut, http.MethodDelete} {
				req, err := http.NewRequestWithContext(t.Context(), m, f.srv.URL+"/release", nil)
				require.NoError(t, err)
				resp, err := f.srv.Client().Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, m)
			}
			assert.Equal(t, before, peek(t, f.store, runLive), "nothing changed")
		})
	}
}

func TestForceRelease(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			t.Run("the_confirmation_shows_the_exact_row_and_fence_then_releases_it", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, st.open(t), statuspage.AllowForceRelease())
				before := peek(t, f.store, runLive)
				_, page := f.get(t, "/")
				assert.Contains(t, page, `<a href="release?run=live-run">release…</a>`)
				_, body := f.get(t, "/release?run="+runLive)
				assert.Contains(t, body, `<td id="fence">1</td>`)
				assert.Contains(t, body, `Release run live-run at fence 1`)
				assert.Contains(t, body, "may still be running")
				form := f.confirmation(t, runLive)
				assert.Equal(t, before.Row, form.Get("row"))
				code, body := f.post(t, "/release", form, nil)
				require.Equal(t, http.StatusOK, code, body)
				assert.Contains(t, body, "Released run live-run")
				after := peek(t, f.store, runLive)
				assert.True(t, after.Released)
				assert.Equal(t, before.Fence, after.Fence, "the fence is kept")
			})
			t.Run("a_row_changed_between_confirmation_and_post_is_left_alone", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, st.open(t), statuspage.AllowForceRelease())
				form := f.confirmation(t, runExpired)
				// Another driver takes the expired run over meanwhile.
				now := f.clock.Now()
				_, err := runlease.Acquire(t.Context(), f.store, runExpired, "dave#node-4",
					runlease.WithTTL(time.Minute), runlease.WithClock(func() time.Time { return now }))
				require.NoError(t, err)
				taken := peek(t, f.store, runExpired)
				code, body := f.post(t, "/release", form, nil)
				assert.Equal(t, http.StatusConflict, code, body)
				assert.Contains(t, body, "changed since it was shown")
				assert.Contains(t, body, "dave#node-4", "the row as it is now")
				assert.Equal(t, taken, peek(t, f.store, runExpired), "nothing was written")
			})
			t.Run("a_released_or_absent_or_corrupt_run_has_nothing_to_confirm", func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, st.open(t), statuspage.AllowForceRelease())
				for run, want := range map[string]int{runReleased: http.StatusOK, "never-acquired": http.StatusNotFound, runCorrupt: http.StatusConflict} {
					code, body := f.get(t, "/release?run="+run)
					assert.Equal(t, want, code, run)
					assert.NotContains(t, body, `name="token"`, run)
				}
				code, _ := f.get(t, "/release?run=")
				assert.Equal(t, http.StatusBadRequest, code, "an empty run id")
			})
		})
	}
}

func TestReleaseCSRF(t *testing.T) {
	t.Parallel()
	f := newFixture(t, stores[0].open(t), statuspage.AllowForceRelease())
	before := peek(t, f.store, runLive)
	good := f.confirmation(t, runLive)
	with := func(k, v string) url.Values {
		form := url.Values{}
		for key, vals := range good {
			form[key] = vals
		}
		form.Set(k, v)
		return form
	}
	cases := []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"no_token", with("token", ""), nil},
		{"a_forged_token", with("token", "99999999999.00"), nil},
		{"a_token_for_another_row", with("row", `{"holder":"x","fence":9,"until_ms":1}`), nil},
		{"a_token_for_another_run", with("run", runExpired), nil},
		{"a_cross_site_request", good, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": ""}},
		{"another_origin", good, map[string]string{"Sec-Fetch-Site": "", "Origin": "https://evil.example"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := f.post(t, "/release", c.form, c.header)
			assert.Equal(t, http.StatusForbidden, code, body)
			assert.Equal(t, before, peek(t, f.store, runLive), "nothing changed")
		})
	}
	t.Run("a_token_from_another_handler", func(t *testing.T) {
		other := newFixture(t, stores[0].open(t), statuspage.AllowForceRelease())
		form := other.confirmation(t, runLive)
		form.Set("row", before.Row)
		code, _ := f.post(t, "/release", form, nil)
		assert.Equal(t, http.StatusForbidden, code)
	})
	t.Run("an_old_token", func(t *testing.T) {
		f := newFixture(t, stores[0].open(t), statuspage.AllowForceRelease())
		form := f.confirmation(t, runLive)
		f.clock.Add(11 * time.Minute)
		code, body := f.post(t, "/release", form, nil)
		assert.Equal(t, http.StatusForbidden, code, body)
		assert.False(t, peek(t, f.store, runLive).Released)
	})
	t.Run("the_good_token_still_works_after_the_refusals", func(t *testing.T) {
		code, body := f.post(t, "/release", good, nil)
		assert.Equal(t, http.StatusOK, code, body)
	})
}
