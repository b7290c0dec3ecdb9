package runlease

import (
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTombstonesAreBounded checks that the memo of released rows never
// holds more than maxTombstones rows, that a row is taken once, and that
// rows of one key on two Store values are apart. It fills the memo, so it
// does not run beside the tests that count an acquisition's round trips.
func TestTombstonesAreBounded(t *testing.T) {
	a, b := lineageStore{id: 101}, lineageStore{id: 102}
	for i := range 3 * maxTombstones {
		rememberReleased(a, "k"+strconv.Itoa(i), "row")
		tombstones.mu.Lock()
		n := len(tombstones.m)
		tombstones.mu.Unlock()
		require.LessOrEqual(t, n, maxTombstones)
	}
	_, ok := takeReleased(a, "k0")
	assert.False(t, ok, "the oldest rows were forgotten first")
	row, ok := takeReleased(a, "k"+strconv.Itoa(3*maxTombstones-1))
	assert.True(t, ok, "the newest row is kept")
	assert.Equal(t, "row", row)
	for i := range 3 * maxTombstones {
		forgetReleased(a, "k"+strconv.Itoa(i)) // room again, so nothing below is pushed out
	}
	rememberReleased(a, "x", "row of a")
	rememberReleased(b, "x", "row of b")
	row, ok = takeReleased(a, "x")
	assert.True(t, ok)
	assert.Equal(t, "row of a", row)
	_, ok = takeReleased(a, "x")
	assert.False(t, ok, "a remembered row is taken once")
	forgetReleased(b, "x")
	_, ok = takeReleased(b, "x")
	assert.False(t, ok, "a forgotten row is gone")

	// The order list is bounded with the map: takes and forgets unlink
	// their elements, and a store's rows all go when it is forgotten.
	for i := range 4 * maxTombstones {
		k := "cycle" + strconv.Itoa(i%7)
		rememberReleased(a, k, "row")
		_, ok := takeReleased(a, k)
		require.True(t, ok, "cycle %d: the row just remembered is there", i)
		rememberReleased(b, k, "row")
		forgetReleased(b, k)
	}
	for i := range 10 {
		rememberReleased(a, "s"+strconv.Itoa(i), "row")
	}
	ForgetStore(a)
	_, ok = takeReleased(a, "s3")
	assert.False(t, ok, "a forgotten store's rows are gone")
	tombstones.mu.Lock()
	n, l := len(tombstones.m), tombstones.order.Len()
	tombstones.mu.Unlock()
	assert.Equal(t, n, l, "the order list holds exactly the rows of the map")
}

// closedLineageStore is a Store value that reports whether it is closed.
type closedLineageStore struct {
	lineageStore
	closed *atomic.Bool
}

func (s closedLineageStore) Closed() bool { return s.closed.Load() }

// TestAClosedStoreIsRememberedNothing checks that a store whose
// ClosedReporter says it is closed gets no released row remembered: a
// release in flight while its Close calls ForgetStore cannot leave a row
// that keeps it reachable.
func TestAClosedStoreIsRememberedNothing(t *testing.T) {
	s := closedLineageStore{lineageStore: lineageStore{id: 103}, closed: new(atomic.Bool)}
	rememberReleased(s, "k", "row")
	s.closed.Store(true)
	ForgetStore(s)
	rememberReleased(s, "k2", "row")
	_, ok := takeReleased(s, "k")
	assert.False(t, ok, "ForgetStore forgot the row remembered before")
	_, ok = takeReleased(s, "k2")
	assert.False(t, ok, "a store that reports itself closed is remembered nothing")
}
