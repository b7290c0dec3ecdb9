package runlease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// The rows of the admission queue as the README's "Rows" lays them out,
// read and written here from outside the package, as an operator's tool
// would: a waiter's entry is runline:<n>:<scope>:<p>.<tag>.<enq>:<run id>,
// its place runplace:<n>:<scope>:<run id>.

// lineRankLen is the length of <p>.<tag>.<enq>: in a line key: 7, 19 and
// 16 digits, two dots and a colon.
const lineRankLen = 7 + 1 + 19 + 1 + 16 + 1

// scopeSeg is <n>:<scope>, the scope's part of a queue row's key.
func scopeSeg(scope string) string { return strconv.Itoa(len(scope)) + ":" + scope }

// linePrefix starts the entries of scope's line.
func linePrefix(scope string) string { return runlease.QueuePrefix + scopeSeg(scope) + ":" }

// placeKeyOf is the key of run's place row in scope.
func placeKeyOf(scope, run string) string { return runlease.PlacePrefix + scopeSeg(scope) + ":" + run }

// legacyKeyOf is the key of run's entry in scope in versions before the
// line.
func legacyKeyOf(scope, run string) string {
	return runlease.LegacyQueuePrefix + scopeSeg(scope) + ":" + run
}

// parseLine splits a line key into its scope and run id.
func parseLine(key string) (scope, run string, ok bool) {
	rest, ok := strings.CutPrefix(key, runlease.QueuePrefix)
	if !ok {
		return "", "", false
	}
	digits, rest, ok := strings.Cut(rest, ":")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n <= 0 || len(rest) <= n+lineRankLen || rest[n] != ':' {
		return "", "", false
	}
	rank := rest[n+1 : n+1+lineRankLen]
	if rank[7] != '.' || rank[27] != '.' || rank[lineRankLen-1] != ':' {
		return "", "", false
	}
	return rest[:n], rest[n+1+lineRankLen:], true
}

// lineRows returns the rows of scope's line, in key order, which is
// admission order.
func lineRows(t *testing.T, s runlease.Store, scope string) []runlease.Row {
	t.Helper()
	r, err := s.MetaScan(t.Context(), linePrefix(scope))
	require.NoError(t, err)
	return r
}

// lineRowsOf returns the line rows of run in scope.
func lineRowsOf(t *testing.T, s runlease.Store, scope, run string) []runlease.Row {
	t.Helper()
	var out []runlease.Row
	for _, r := range lineRows(t, s, scope) {
		if sc, rn, ok := parseLine(r.Key); ok && sc == scope && rn == run {
			out = append(out, r)
		}
	}
	return out
}

// lineRowOf returns the one line row of run in scope, and fails t when
// there is not exactly one.
func lineRowOf(t *testing.T, s runlease.Store, scope, run string) runlease.Row {
	t.Helper()
	r := lineRowsOf(t, s, scope, run)
	require.Len(t, r, 1, "the line rows of %s in %s", run, scope)
	return r[0]
}

// lineEntry decodes the one line entry of run in scope.
func lineEntry(t *testing.T, s runlease.Store, scope, run string) map[string]any {
	t.Helper()
	var e map[string]any
	require.NoError(t, json.Unmarshal([]byte(lineRowOf(t, s, scope, run).Value), &e))
	return e
}

// plantedEntry is a queue entry a test writes itself, as a waiter of
// another process (or one that died) would have.
type plantedEntry struct {
	Run, Waiter, Principal string
	Fence, Seq             uint64
	Weight, Priority       int
	Units                  int
	Tag, EnqMS, UntilMS    int64
	Scopes                 []string
}

func (e plantedEntry) json() string {
	b, err := json.Marshal(map[string]any{"run": e.Run, "waiter": e.Waiter, "fence": e.Fence, "seq": e.Seq,
		"principal": e.Principal, "weight": max(e.Weight, 1), "priority": e.Priority, "units": max(e.Units, 1),
		"tag": e.Tag, "enq_ms": e.EnqMS, "until_ms": e.UntilMS, "scopes": e.Scopes})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// key is the entry's key in scope's line: where its fields rank it.
func (e plantedEntry) key(scope string) string {
	return fmt.Sprintf("%s%07d.%019d.%016d:%s", linePrefix(scope), runlease.MaxPriority-e.Priority, e.Tag, e.EnqMS, e.Run)
}

// plant writes e's entry in each of its scopes, and its place rows, as a
// waiter does when it takes its place; it returns the entry's JSON.
func plant(t *testing.T, s runlease.Store, e plantedEntry) string {
	t.Helper()
	v := e.json()
	for _, sc := range e.Scopes {
		put(t, s, e.key(sc), v)
		place, err := json.Marshal(map[string]any{"waiter": e.Waiter, "fence": e.Fence, "key": e.key(sc), "until_ms": e.UntilMS})
		require.NoError(t, err)
		put(t, s, placeKeyOf(sc, e.Run), string(place))
	}
	return v
}

// plantAhead writes n live entries of other runs at the front of scope's
// line (tag 0, enqueued an hour ago), each with its place row, so that a
// run that queues now lies behind them.
func plantAhead(t *testing.T, s runlease.Store, scope string, n int) {
	t.Helper()
	now := time.Now()
	for i := range n {
		plant(t, s, plantedEntry{Run: "ahead" + strconv.Itoa(i), Waiter: "a" + strconv.Itoa(i), Seq: 1,
			EnqMS: now.Add(-time.Hour).UnixMilli() + int64(i), UntilMS: now.Add(time.Hour).UnixMilli(),
			Scopes: []string{scope}})
	}
}

// queueRows returns the rows of every queue.
func queueRows(t *testing.T, s runlease.Store) []runlease.Row {
	t.Helper()
	r, err := s.MetaScan(context.Background(), runlease.QueuePrefix)
	require.NoError(t, err)
	return r
}

// libRows returns the rows of the store but the marks a Postgres store
// keeps of the keys its subscribers wait on (runwait:), which come and go
// with the waiters' subscriptions, not with their claims.
func libRows(t *testing.T, s runlease.Store) []runlease.Row {
	t.Helper()
	var out []runlease.Row
	for _, r := range rows(t, s) {
		if !strings.HasPrefix(r.Key, runlease.WaitPrefix) {
			out = append(out, r)
		}
	}
	return out
}

// awaitQueued waits until the queues hold n rows in all.
func awaitQueued(t *testing.T, s runlease.Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(queueRows(t, s)) == n }, 20*time.Second, time.Millisecond,
		"the queues never held %d rows", n)
}

// admissions records the order in which waiters were admitted.
type admissions struct {
	mu    sync.Mutex
	order []string
}

func (a *admissions) add(run string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.order = append(a.order, run)
}

func (a *admissions) get() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.order...)
}

// waitAndRelease starts a waiter that, once admitted, records its run and
// releases its slots at once, so that the next waiter can be admitted.
func waitAndRelease(t *testing.T, wg *sync.WaitGroup, s runlease.Store, run string, scopes []runlease.Scope, got *admissions, opts ...runlease.Option) {
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sl, err := runlease.ClaimSlotsWait(ctx, s, run, scopes, opts...)
		if !assert.NoError(t, err, run) {
			return
		}
		got.add(run)
		assert.NoError(t, sl.Release(ctx))
	})
}

// startWait starts ClaimSlotsWait in a goroutine and returns the channel
// of its error.
func startWait(ctx context.Context, s runlease.Store, run string, scopes []runlease.Scope, opts ...runlease.Option) <-chan error {
	done := make(chan error, 1)
	go func() {
		sl, err := runlease.ClaimSlotsWait(ctx, s, run, scopes, opts...)
		if err == nil {
			_ = sl // held until the test ends
		}
		done <- err
	}()
	return done
}

func waitErr(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("ClaimSlotsWait did not return")
		return nil
	}
}
