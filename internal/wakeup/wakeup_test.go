package wakeup

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestASetWakesTheSubscribersOfAKeyWithTheLatestRow checks the fan-out: a
// wake-up reaches the subscribers of its key only, wake-ups pending merge
// (a rows subscriber sees the latest row), WakeAll carries no row, and a
// cancelled subscription leaves the set.
func TestASetWakesTheSubscribersOfAKeyWithTheLatestRow(t *testing.T) {
	var s Set
	wake, cancelWake := s.Subscribe("a")
	rows, cancelRows := s.SubscribeRows("a")
	other, cancelOther := s.SubscribeRows("b")
	assert.Equal(t, 2, s.Count())
	assert.Equal(t, 2, s.CountKey("a"))

	s.Wake("a", "row 1")
	s.Wake("a", "row 2")
	require.Len(t, wake, 1, "pending wake-ups merge")
	<-wake
	require.Len(t, rows, 1)
	assert.Equal(t, "row 2", <-rows, "a pending row is replaced by the latest")
	assert.Empty(t, other, "another key's subscriber is not woken")

	s.WakeAll()
	assert.Equal(t, "", <-other, "WakeAll carries no row")
	assert.Equal(t, "", <-rows)
	<-wake

	cancelWake()
	cancelRows()
	assert.Equal(t, 1, s.Count())
	assert.Zero(t, s.CountKey("a"))
	s.Wake("a", "row 3")
	assert.Empty(t, rows, "a cancelled subscriber is not woken")
	cancelOther()
	assert.Zero(t, s.Count())
}

// TestSendNeverBlocks checks that wake-ups from many goroutines, sent
// through a Set while nobody receives, never block, and that the
// subscriber then holds one of the rows sent.
func TestSendNeverBlocks(t *testing.T) {
	var s Set
	rows, cancel := s.SubscribeRows("k")
	defer cancel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 1000 {
				s.Wake("k", string(rune('a'+i)))
			}
		})
	}
	wg.Wait()
	require.Len(t, rows, 1)
	row := <-rows
	assert.Len(t, row, 1)
	assert.True(t, row >= "a" && row <= "h")
}

// TestATagSubscriberSeesATagOnlyWhenOneWakeUpIsPending: a tagged wake-up
// carries its tag to tag subscribers, never to row subscribers (a tag is
// not a row); a row, WakeAll or a second wake-up while one is pending
// carries none, since no one tag then names what woke the subscriber (the
// room would take a release of another process for its own, and sleep
// past a free slot).
func TestATagSubscriberSeesATagOnlyWhenOneWakeUpIsPending(t *testing.T) {
	var s Set
	tags, cancel := s.SubscribeTags("bell")
	defer cancel()
	rows, cancelRows := s.SubscribeRows("bell")
	defer cancelRows()

	s.Wake("bell", TagRow("t1"))
	assert.Equal(t, "t1", <-tags, "one tagged wake-up pending: its tag")
	assert.Equal(t, "", <-rows, "a row subscriber gets no row from a tagged wake-up")

	s.Wake("bell", TagRow("t1"))
	s.Wake("bell", TagRow("t2"))
	require.Len(t, tags, 1, "pending wake-ups merge")
	assert.Equal(t, "", <-tags, "two tagged wake-ups merged: no tag")
	<-rows

	s.Wake("bell", TagRow("t3"))
	s.Wake("bell", "a row")
	assert.Equal(t, "", <-tags, "a tagged wake-up merged with an untagged one: no tag")
	assert.Equal(t, "a row", <-rows)

	s.Wake("bell", "a row")
	assert.Equal(t, "", <-tags, "a row is not a tag")
	<-rows
	s.WakeAll()
	assert.Equal(t, "", <-tags, "WakeAll carries no tag")
	<-rows
	s.Wake("bell", TagRow(""))
	assert.Equal(t, "", <-tags, "an empty tag is none")
	assert.Equal(t, "", <-rows)
	assert.Equal(t, "", tagOf("runlease-ta"), "a row shorter than the mark is not a tag")
}
