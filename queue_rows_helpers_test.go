package runlease_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

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
