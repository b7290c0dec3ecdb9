package runlease_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// queueBubbleStore opens a SQLite store for a test's synctest bubble.
func queueBubbleStore(t *testing.T) *runlease.SQLiteStore {
	t.Helper()
	s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// takeoverEntry is what these tests read of a line entry.
type takeoverEntry struct {
	Key       string `json:"-"`
	Run       string `json:"run"`
	Principal string `json:"principal"`
	Priority  int    `json:"priority"`
	Tag       int64  `json:"tag"`
	Fence     uint64 `json:"fence"`
	UntilMS   int64  `json:"until_ms"`
}

// takeoverLine returns the entries of scope's line, in rank (key) order.
func takeoverLine(t *testing.T, s runlease.Store, scope string) []takeoverEntry {
	t.Helper()
	rows, err := s.MetaScan(context.Background(), runlease.QueuePrefix+strconv.Itoa(len(scope))+":"+scope+":")
	require.NoError(t, err)
	sort.Slice(rows, func(i, j int) bool { return rows[i].Key < rows[j].Key })
	var out []takeoverEntry
	for _, r := range rows {
		var e takeoverEntry
		require.NoError(t, json.Unmarshal([]byte(r.Value), &e), r.Key)
		e.Key = r.Key
		out = append(out, e)
	}
	return out
}

// A newer driver's waiter of a run (a higher fence) takes the older
// driver's waiter's place. It keeps that waiter's rank only where the rank
// was charged: to the same principal, at the same priority, in every scope
// it waits for. Otherwise the inherited tag could be one another waiter of
// its principal holds, or rank it ahead of that principal's runs queued
// after the older waiter; it ranks as a new waiter instead, behind them.
//
// Each case: gpu and mem are full; the older driver of run r waits; q, of
// principal "a", waits 1 s later; the newer driver of r, for principal
// "a", waits 1 s after that. Where the rank was not charged, r must rank
// behind q and hold a tag of its own; where it was, r keeps its place
// ahead of q.
func TestANewerDriverKeepsTheOlderWaitersRankOnlyWhereItWasCharged(t *testing.T) {
	t.Parallel()
	gpu, mem := runlease.NamedScope("gpu", 1), runlease.MemScope(1)
	type claim struct {
		scopes    []runlease.Scope
		principal string
		priority  int
	}
	cases := []struct {
		name          string
		older, q, new claim
		keeps         bool // r keeps the older waiter's rank, ahead of q
	}{
		{"another principal", claim{[]runlease.Scope{mem}, "", 0}, claim{[]runlease.Scope{mem}, "a", 0}, claim{[]runlease.Scope{mem}, "a", 0}, false},
		{"a scope the older waiter did not wait in", claim{[]runlease.Scope{mem}, "a", 0}, claim{[]runlease.Scope{gpu}, "a", 0}, claim{[]runlease.Scope{gpu, mem}, "a", 0}, false},
		{"another priority", claim{[]runlease.Scope{mem}, "a", 0}, claim{[]runlease.Scope{mem}, "a", 1}, claim{[]runlease.Scope{mem}, "a", 1}, false},
		{"the same principal and priority, in fewer scopes", claim{[]runlease.Scope{gpu, mem}, "a", 0}, claim{[]runlease.Scope{mem}, "a", 0}, claim{[]runlease.Scope{mem}, "a", 0}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := queueBubbleStore(t)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				hour := runlease.WithTTL(time.Hour)
				_, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{gpu, mem}, hour)
				require.NoError(t, err)
				opts := func(cl claim) []runlease.Option {
					return []runlease.Option{runlease.WithFairShare(cl.principal, 1), runlease.WithPriority(cl.priority)}
				}
				var done []chan error
				wait := func(f func() error) {
					d := make(chan error, 1)
					done = append(done, d)
					go func() { d <- f() }()
					synctest.Wait()
				}

				older, err := runlease.Acquire(ctx, s, "r", "D1", hour)
				require.NoError(t, err)
				wait(func() error { _, err := older.ClaimSlotsWait(ctx, c.older.scopes, opts(c.older)...); return err })
				time.Sleep(time.Second)
				wait(func() error {
					_, err := runlease.ClaimSlotsWait(ctx, s, "q", c.q.scopes, append(opts(c.q), hour)...)
					return err
				})
				time.Sleep(time.Second)
				newer, err := runlease.Acquire(ctx, s, "r", "D1", hour) // re-entry: a higher fence
				require.NoError(t, err)
				require.Greater(t, newer.Fence(), older.Fence())
				wait(func() error { _, err := newer.ClaimSlotsWait(ctx, c.new.scopes, opts(c.new)...); return err })

				for _, sc := range c.q.scopes {
					var order []string
					tags := map[int64]string{}
					for _, e := range takeoverLine(t, s, sc.Name()) {
						if e.Run == "r" && e.Fence != newer.Fence() {
							continue // the older waiter's entry, where the newer one does not wait
						}
						order = append(order, e.Run)
						if e.Principal == "a" {
							assert.NotContains(t, tags, e.Tag, "%s: entries of principal a share a tag: %s and %s", sc.Name(), tags[e.Tag], e.Run)
							tags[e.Tag] = e.Run
						}
					}
					want := []string{"q", "r"}
					if c.keeps {
						want = []string{"r", "q"}
					}
					assert.Equal(t, want, order, "the order of %s's line", sc.Name())
				}
				cancel()
				for _, d := range done {
					<-d
				}
			})
		})
	}
}
