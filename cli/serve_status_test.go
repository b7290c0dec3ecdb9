package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// The scopes seedQueues fills, and the limits their drivers claim with.
var queueLimits = []string{"--limit", "mem=4", "--limit", "gpu=2", "--limit", "batch=3"}

// seedQueues fills two scopes and queues runs in both, as drivers waiting
// in ClaimSlotsWait do: gpu (limit 2) is held whole by gpu-holder, batch
// (limit 3) has one unit of three free. Five runs wait in gpu (q-3 in
// batch too, and q-2 at a higher priority), and q-6 and q-7 wait in batch
// only. The holders and the queue entries live for an hour, and the
// waiters look again only when woken, so nothing changes until the test
// ends, when the waiters give up.
func seedQueues(t *testing.T, s runlease.Store) {
	t.Helper()
	long := runlease.WithTTL(time.Hour)
	_, err := runlease.ClaimSlots(t.Context(), s, "gpu-holder", []runlease.Scope{runlease.NamedScope("gpu", 2).Take(2)}, long)
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(t.Context(), s, "batch-holder", []runlease.Scope{runlease.NamedScope("batch", 3).Take(2)}, long)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // before the store closes
	gpu, batch := runlease.NamedScope("gpu", 2), runlease.NamedScope("batch", 3)
	waiters := []struct {
		run       string
		principal string
		priority  int
		scopes    []runlease.Scope
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
			_, err := runlease.ClaimSlotsWait(ctx, s, w.run, w.scopes, long, runlease.WithWaitPoll(time.Hour),
				runlease.WithFairShare(w.principal, 1), runlease.WithPriority(w.priority))
			assert.ErrorIs(t, err, context.Canceled, "%s is never admitted", w.run)
		})
		entries += len(w.scopes)
		// One at a time, so that the queues' order is the order above.
		require.Eventually(t, func() bool {
			q, err := runlease.Queues(t.Context(), s)
			return err == nil && len(q) == entries
		}, 20*time.Second, 5*time.Millisecond, "%s queues", w.run)
	}
}

// normalise deletes from a decoded status document the fields that
// depend on the instant it was read at, and on nothing else: now, and the
// expires_in_ms of every lease, slot and queue entry (until_ms minus now).
// Every other field depends on the store's rows alone; the rows of these
// tests stay on the same side of their expiry throughout.
func normalise(t *testing.T, doc map[string]any) {
	t.Helper()
	drop := func(m any) {
		require.Contains(t, m, "expires_in_ms")
		delete(m.(map[string]any), "expires_in_ms")
	}
	require.Contains(t, doc, "now")
	delete(doc, "now")
	for _, l := range doc["leases"].([]any) {
		drop(l)
	}
	for _, sc := range doc["scopes"].([]any) {
		for _, s := range sc.(map[string]any)["slots"].([]any) {
			drop(s)
		}
		for _, q := range sc.(map[string]any)["queue"].([]any) {
			drop(q)
		}
	}
}

// decodeAny decodes a JSON document into maps and slices.
func decodeAny(t *testing.T, doc string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(doc), &m), doc)
	return m
}

// The page's status.json and status --json, for the same store and the
// same filters, are the same document: every field, the queues included,
// but for the read instant and the countdowns that follow from it.
func TestServeStatusJSONIsStatusJSONFieldForField(t *testing.T) {
	t.Parallel()
	filters := []struct {
		name   string
		status []string
		query  url.Values
	}{
		{"no_filter", nil, nil},
		{"state", []string{"--state", "live,expired"}, url.Values{"state": {"live,expired"}}},
		{"released_only", []string{"--state", "released"}, url.Values{"state": {"released"}}},
		{"run_prefix", []string{"--run", "live"}, url.Values{"run": {"live"}}},
		{"max", []string{"--max", "2"}, url.Values{"limit": {"2"}}},
		{"all_together", []string{"--state", "live,corrupt", "--run", "c", "--max", "1"},
			url.Values{"state": {"live,corrupt"}, "run": {"c"}, "limit": {"1"}}},
	}
	compare := func(t *testing.T, store []string, s runlease.Store) {
		seed(t, s)
		seedQueues(t, s)
		srv := startServe(t, nil, append(append([]string{}, store...), queueLimits...)...)
		for _, f := range filters {
			t.Run(f.name, func(t *testing.T) {
				args := append(append(append([]string{"status", "--json"}, store...), queueLimits...), f.status...)
				st := runCLI(t, args...)
				require.Contains(t, []int{exitOK, exitCorrupt}, st.code, st.stderr)
				code, body := httpGet(t, srv.url+"status.json?"+f.query.Encode(), "")
				require.Equal(t, http.StatusOK, code, body)
				cli, page := decodeAny(t, st.stdout), decodeAny(t, body)
				normalise(t, cli)
				normalise(t, page)
				assert.Equal(t, cli, page)
			})
		}
		// The state the filters saw: two scopes with five waiters and
		// more, the why of each being the page's alone.
		doc := decodeStatus(t, runCLI(t, append(append([]string{"status", "--json"}, store...), queueLimits...)...).stdout)
		assert.Len(t, doc.scope(t, "gpu").Queue, 5)
		assert.Len(t, doc.scope(t, "batch").Queue, 3)
		assert.Len(t, doc.Leases, 4)
		assert.Equal(t, "q-2", doc.scope(t, "gpu").Queue[0].RunID, "the higher priority first")
	}
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "runs.db")
		s, err := runlease.OpenSQLite(path)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		compare(t, []string{"--db", path}, s)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dsn, table, s := newPGStore(t)
		compare(t, []string{"--postgres", dsn, "--table", table}, s)
	})
}
