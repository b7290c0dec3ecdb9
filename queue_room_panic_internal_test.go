package runlease

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// panickySubscribe is a SQLite store whose Subscribe panics for the
// bell of scope "b" (a store bug, or a decorator that panics): the library
// already guards a shared scan against a store that panics (errScanAborted),
// and a Subscribe is just as much a store call.
type panickySubscribe struct {
	*SQLiteStore
}

func (s *panickySubscribe) Subscribe(key string) (<-chan struct{}, func()) {
	if key == queueBell("b") {
		panic("subscribe failed")
	}
	return s.SQLiteStore.Subscribe(key)
}

// TestAStorePanickingInSubscribeLeavesNoRoomBehind: ClaimSlotsWait
// joins the rooms of its scopes one by one (joinRooms) and only then defers
// leaveRooms. A panic in the second room's Subscribe leaves the first room,
// its subscription and its fanOut goroutine in place for good (refs never
// drops to 0), and the second room in the map with a member that never
// leaves: the promise "no goroutine or subscription outlives the last
// waiter of a room" breaks, and every later waiter of scope "b" waits in a
// room with no subscription at all (no bell: poll only).
func TestAStorePanickingInSubscribeLeavesNoRoomBehind(t *testing.T) {
	s := &panickySubscribe{SQLiteStore: roomSQLite(t)}
	_, err := ClaimSlots(t.Context(), s.SQLiteStore, "holder", []Scope{NamedScope("a", 1)})
	require.NoError(t, err)
	func() {
		defer func() { _ = recover() }()
		_, err := ClaimSlotsWait(t.Context(), s, "w", []Scope{NamedScope("a", 1), NamedScope("b", 1)})
		panic(fmt.Sprint("no panic: ", err))
	}()
	defer func() { // let other tests run clean whatever happens
		for _, sc := range []string{"a", "b"} {
			if r := roomOf(s, sc); r != nil {
				rooms.mu.Lock()
				delete(rooms.m, roomKey{store: s, scope: sc})
				rooms.mu.Unlock()
				if r.stop != nil {
					close(r.stop)
					<-r.exited
				}
				if r.cancel != nil {
					r.cancel()
				}
			}
		}
	}()
	subsA := s.SQLiteStore.subs.CountKey(queueBell("a"))
	assert.Nil(t, roomOf(s, "a"), "the call that made room a has returned (panicked): the room must be gone")
	assert.Zero(t, subsA, "and the subscription of scope a's bell with it")
	assert.Nil(t, roomOf(s, "b"), "room b has no waiter left")
}
