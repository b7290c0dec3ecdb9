package runlease

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lineageStore is a comparable Store value for keying lineages; its
// methods are never called.
type lineageStore struct {
	Store
	id int
}

func TestLineageStampsOfOneFenceNeverRepeat(t *testing.T) {
	t.Parallel()
	s := lineageStore{id: 1}
	a := lineageOf(s, "runlease:"+t.Name(), "A", 1)
	b := lineageOf(s, "runlease:"+t.Name(), "A", 1)
	require.Same(t, a, b, "equal Store values share a lineage")
	now := time.UnixMilli(1_000_000)
	seen := map[int64]bool{}
	for range 100 {
		ms, _ := a.stamp(now, time.Second, 0) // every stamp in one millisecond
		require.False(t, seen[ms], "stamp %d handed out twice", ms)
		seen[ms] = true
		require.GreaterOrEqual(t, ms, now.Add(time.Second).UnixMilli())
	}
	other := lineageOf(s, "runlease:"+t.Name(), "A", 2)
	ms, _ := other.stamp(now, time.Second, 0)
	assert.Equal(t, now.Add(time.Second).UnixMilli(), ms, "another fence starts from now+TTL again")
	apart := lineageOf(lineageStore{id: 2}, "runlease:"+t.Name(), "A", 1)
	assert.NotSame(t, a, apart, "another Store value has lineages of its own")
}

func TestLineageUnstampOnlyUndoesTheLastStamp(t *testing.T) {
	t.Parallel()
	c := lineageOf(lineageStore{id: 3}, "runlease:"+t.Name(), "A", 1)
	now := time.UnixMilli(2_000_000)
	first, prev := c.stamp(now, time.Second, 0)
	c.unstamp(first, prev)
	again, _ := c.stamp(now, time.Second, 0)
	assert.Equal(t, first, again, "a refused write's stamp is handed out again")
	next, _ := c.stamp(now, time.Second, 0)
	c.unstamp(again, prev) // a later stamp was handed out: too late
	last, _ := c.stamp(now, time.Second, 0)
	assert.Greater(t, last, next)
}

func TestLineageLivesWhileReferencedOrPinned(t *testing.T) {
	// Not parallel: it collects garbage and reads the process-wide pins.
	s := lineageStore{id: 4}
	key := "runlease:" + t.Name()
	now := time.UnixMilli(3_000_000)
	gone := func(fence uint64) bool {
		for range 10 {
			runtime.GC()
			if lineages.mu.Lock(); lineages.m[lineageKey{store: s, key: key, holder: "A", fence: fence}].Value() == nil {
				lineages.mu.Unlock()
				return true
			}
			lineages.mu.Unlock()
		}
		return false
	}

	func() {
		c := lineageOf(s, key, "A", 1)
		c.stamp(now, time.Second, 0)
	}()
	require.True(t, gone(1), "a lineage no Lease refers to is dropped")
	ms, _ := lineageOf(s, key, "A", 1).stamp(now, time.Second, 0)
	assert.Equal(t, now.Add(time.Second).UnixMilli(), ms, "a new lineage starts over")

	var pinned int64
	func() {
		c := lineageOf(s, key, "A", 2)
		pinned, _ = c.stamp(now, time.Minute, 0)
		c.pin(now, pinned) // its write's outcome is unknown
	}()
	require.False(t, gone(2), "a pinned lineage outlives its Lease values")
	ms, _ = lineageOf(s, key, "A", 2).stamp(now, time.Minute, 0)
	assert.Greater(t, ms, pinned, "a new Lease at the fence stamps above the write in doubt")

	func() {
		c := lineageOf(s, key, "A", 3)
		sent, _ := c.stamp(now, time.Second, 0)
		c.pin(now.Add(time.Hour), sent) // its row expired long ago
	}()
	lineages.mu.Lock()
	lineages.nextSweep = time.Time{}
	lineages.mu.Unlock()
	lineageOf(s, key, "A", 4) // sweeps
	require.True(t, gone(3), "a pin ends once its row has expired")
}
