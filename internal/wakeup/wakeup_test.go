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
