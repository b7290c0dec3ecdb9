package runlease

import (
	"runtime"
	"testing"
	"testing/synctest"
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

// The pins' sweep runs once the clock passes the last sweep's time, and
// also when the clock went back past it: each testing/synctest bubble's
// clock starts over, and pins made in one whose clock had run far would
// otherwise keep every later bubble's pins until its clock caught up.
// Either way only pins whose time has passed go.
func TestLineagePinsAreSweptAfterTheClockWentBack(t *testing.T) {
	// Not parallel: it reads and sweeps the process-wide pins.
	s := lineageStore{id: 5}
	var late, early *lineage
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Minute)
		late = &lineage{}
		late.pin(time.Now(), time.Now().Add(time.Hour).UnixMilli())
		time.Sleep(2 * pinSlack)
		lineageOf(s, "runlease:late", "A", 1) // sweeps; the next is due a minute in
	})
	t.Cleanup(func() {
		lineages.mu.Lock()
		delete(lineages.pins, late)
		lineages.mu.Unlock()
	})
	synctest.Test(t, func(t *testing.T) {
		early = &lineage{}
		early.pin(time.Now(), time.Now().UnixMilli())
		time.Sleep(2 * pinSlack)
		lineageOf(s, "runlease:early", "A", 1) // a minute before the last sweep
		lineages.mu.Lock()
		_, earlyKept := lineages.pins[early]
		_, lateKept := lineages.pins[late]
		lineages.mu.Unlock()
		assert.False(t, earlyKept, "a pin whose time has passed stays after the clock went back")
		assert.True(t, lateKept, "a pin whose time has not come went")
	})
}
