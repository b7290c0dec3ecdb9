package runlease

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMemberOrderKeepsKeyOrder drives a room's member order with random
// inserts, moves and removals, against a sorted model: first must always
// give the members with the smallest keys, in order.
func TestMemberOrderKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	var o memberOrder
	model := map[chan struct{}]string{}
	var chans []chan struct{}
	for range 2000 {
		chans = append(chans, make(chan struct{}))
	}
	for step := range 30000 {
		c := chans[rng.IntN(len(chans))]
		if old, ok := model[c]; ok {
			o.remove(old, c)
			delete(model, c)
		}
		if rng.IntN(4) > 0 {
			key := "k" + strconv.Itoa(rng.IntN([]int{5000, 20}[step%2]))
			o.insert(key, c)
			model[c] = key
		}
		if step%500 != 0 {
			continue
		}
		require.Equal(t, len(model), o.n)
		var want []string
		for _, k := range model {
			want = append(want, k)
		}
		slices.Sort(want)
		var got []string
		o.first(len(model)+1, func(w chan struct{}) { got = append(got, model[w]) })
		require.Equal(t, want, got, "step %d", step)
		for _, ch := range o.chunks {
			require.NotEmpty(t, ch)
			require.LessOrEqual(t, len(ch), orderChunk)
		}
	}
}

// TestARingWakesTheMembersNearTheHead checks that a ring of a room of many
// placed waiters wakes those without a place and only the first depth of
// those with one, in key order, and that a member that moves to the front
// is woken by the next ring.
func TestARingWakesTheMembersNearTheHead(t *testing.T) {
	t.Parallel()
	r := &room{waiters: map[chan struct{}]struct{}{}, placed: map[chan struct{}]string{}, depth: 3}
	var placed []chan struct{}
	for i := range 1000 {
		c := make(chan struct{}, 1)
		r.waiters[c] = struct{}{}
		r.place(c, "k"+strconv.Itoa(100000+i))
		placed = append(placed, c)
	}
	unplaced := make(chan struct{}, 1)
	r.waiters[unplaced] = struct{}{}
	woken := func() []int {
		var out []int
		for i, c := range placed {
			select {
			case <-c:
				out = append(out, i)
			default:
			}
		}
		return out
	}
	r.ring()
	require.Equal(t, []int{0, 1, 2}, woken())
	require.Len(t, unplaced, 1, "a member without a place is woken by every ring")
	<-unplaced
	require.True(t, r.near(placed[2]))
	require.False(t, r.near(placed[3]))
	// A member far back leaves: nobody's place among the first changes.
	delete(r.waiters, placed[700])
	r.unplaceLocked(placed[700])
	require.Empty(t, woken())
	// The first leaves the room, which lets the fourth in: it is woken,
	// since far members do not poll.
	delete(r.waiters, placed[0])
	r.unplaceLocked(placed[0])
	require.Equal(t, []int{3}, woken())
	// The 500th moves ahead of everyone (its old place was far back).
	r.place(placed[500], "k0")
	require.Empty(t, woken())
	r.ring()
	require.Equal(t, []int{1, 2, 500}, woken())
}
