package runlease

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// handCounter is a SQLite store, with every capability of it, that counts
// the reads of slot rows (MetaRanges that read a scope) and the hand-overs
// (MetaDeleteNotifyRanges), and can run mid a hand-over's call: after the
// delete, before its reads return.
type handCounter struct {
	*SQLiteStore
	reads, hands atomic.Int64
	mid          atomic.Pointer[func()]
}

func (c *handCounter) MetaRanges(ctx context.Context, ranges []Range) ([][]Row, error) {
	for _, r := range ranges {
		if strings.HasPrefix(r.Prefix, SlotPrefix) {
			c.reads.Add(1)
			break
		}
	}
	return c.SQLiteStore.MetaRanges(ctx, ranges)
}

func (c *handCounter) MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []Range) (bool, [][]Row, error) {
	c.hands.Add(1)
	if f := c.mid.Load(); f != nil {
		(*f)()
	}
	return c.SQLiteStore.MetaDeleteNotifyRanges(ctx, key, expected, wakeKey, tag, ranges)
}

// asleepInRoom waits until the room of scope has want members with a
// place. A member records its place (syncRooms) after its last write and
// before it sleeps, with no store call between: a ring that comes before
// it sleeps waits in its wake-up channel, and the read it then needs is
// the same.
func asleepInRoom(t *testing.T, store Store, scope string, want int) *room {
	t.Helper()
	require.Eventually(t, func() bool {
		r := roomOf(store, scope)
		if r == nil {
			return false
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.placed) == want
	}, 10*time.Second, time.Millisecond, "the waiters take their places")
	return roomOf(store, scope)
}

// waiterBehindHolder has "holder" hold the one unit of scope "gpu" of s
// and "waiter" wait for it, asleep in its room, with a poll and a TTL far
// longer than a test; done receives the waiter's result once it is
// admitted and has released.
func waiterBehindHolder(t *testing.T, s Store) (context.Context, *Slots, chan error, *room) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	sc := []Scope{NamedScope("gpu", 1)}
	held, err := ClaimSlots(ctx, s, "holder", sc, WithTTL(time.Minute))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		w, err := ClaimSlotsWait(ctx, s, "waiter", sc, WithTTL(time.Minute), WithWaitPoll(time.Minute))
		if err == nil {
			err = w.Release(context.Background())
		}
		done <- err
	}()
	return ctx, held, done, asleepInRoom(t, s, "gpu", 1)
}

// TestAReleaseHandsItsReadToTheWaitersOfItsProcess: a waiter of the
// releasing process is admitted on the read the release made, with no
// read of its own, and the release's own wake-up, when it comes back, is
// not a second ring (it would wake the waiters to read again).
func TestAReleaseHandsItsReadToTheWaitersOfItsProcess(t *testing.T) {
	t.Parallel()
	s := &handCounter{SQLiteStore: roomSQLite(t)}
	ctx, held, done, r := waiterBehindHolder(t, s)
	r.mu.Lock()
	rings := r.rings
	r.mu.Unlock()
	reads := s.reads.Load()

	require.NoError(t, held.Release(ctx))
	require.NoError(t, <-done)
	assert.EqualValues(t, 1, s.hands.Load(), "the holder's release, made while a waiter of its process waited, hands its read over")
	assert.Equal(t, reads, s.reads.Load(), "the waiter was admitted on the release's read, without one of its own")
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Equal(t, rings+1, r.rings, "one ring: the hand-over's; its wake-up that came back is not another")
	assert.Empty(t, r.handed, "the release's wake-up came back and was taken for what it was")
}

// TestAHandOverRingsWhenARingCameWhileItWasOut: a ring that arrives while
// a hand-over's call is out may announce a change its read does not show,
// and its waiters may have read before the delete: the hand-over then
// rings as a ring does, and the waiter reads for itself (and is admitted).
func TestAHandOverRingsWhenARingCameWhileItWasOut(t *testing.T) {
	t.Parallel()
	s := &handCounter{SQLiteStore: roomSQLite(t)}
	ctx, held, done, r := waiterBehindHolder(t, s)
	ringMid := func() { r.ring() }
	s.mid.Store(&ringMid)
	reads := s.reads.Load()

	require.NoError(t, held.Release(ctx))
	require.NoError(t, <-done)
	assert.EqualValues(t, 1, s.hands.Load())
	r.mu.Lock()
	hand := r.hand
	r.mu.Unlock()
	assert.Nil(t, hand, "a ring came while the call was out: no read is handed over")
	assert.Greater(t, s.reads.Load(), reads, "the waiter read for itself")
}

// TestAHandOversReadAnswersOnlyWhatItIsFreshFor: the read of a hand-over
// answers a waiter whose own moves all came before it was sent and whose
// latest ring is no later than the hand-over's own; any later need reads.
func TestAHandOversReadAnswersOnlyWhatItIsFreshFor(t *testing.T) {
	h := &roomHand{sent: 10, ring: 12}
	for _, c := range []struct {
		fresh, rung uint64
		want        bool
		why         string
	}{
		{9, 12, true, "woken by the hand-over, its own moves before it"},
		{9, 5, true, "an older ring, which the read follows"},
		{0, 0, true, "nothing needed yet"},
		{10, 12, false, "a move of its own at the tick the call was sent: the read may not show it"},
		{11, 12, false, "a move of its own while the call was out"},
		{13, 12, false, "a move of its own after the hand-over"},
		{9, 13, false, "a later ring"},
	} {
		assert.Equal(t, c.want, h.answers(c.fresh, c.rung), "fresh %d, rung %d: %s", c.fresh, c.rung, c.why)
	}
}

// TestARoomExpectsABoundedNumberOfTags: tags whose wake-ups never come
// back (a store that notifies only while someone is marked as waiting)
// are let go past maxHanded, the newest kept; a tag let go only makes its
// wake-up, should it come, a ring.
func TestARoomExpectsABoundedNumberOfTags(t *testing.T) {
	r := &room{handed: map[string]struct{}{}}
	var tags []string
	for range 5 * maxHanded {
		tag := nextHandTag()
		tags = append(tags, tag)
		r.expectLocked(tag)
		assert.LessOrEqual(t, len(r.handed), maxHanded)
		assert.LessOrEqual(t, len(r.handedOrder), 2*maxHanded+1)
	}
	for _, tag := range tags[len(tags)-maxHanded:] {
		assert.Contains(t, r.handed, tag, "the newest are kept")
	}
	r.heard(tags[0])
	assert.EqualValues(t, 1, r.rings, "a tag let go rings")
	r.heard(tags[len(tags)-1])
	assert.EqualValues(t, 1, r.rings, "an expected tag does not")
	r.heard(tags[len(tags)-1])
	assert.EqualValues(t, 2, r.rings, "nor twice: a second wake-up with it rings")
	r.heard("")
	assert.EqualValues(t, 3, r.rings, "a wake-up without a tag rings")
	assert.NotEqual(t, nextHandTag(), nextHandTag(), "tags are unique")
}
