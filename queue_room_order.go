package runlease

import (
	"slices"
	"strings"
)

// memberOrder holds the members of a room that hold a place in its
// scope's line, in the order of their line keys, so that a ring wakes
// only the members nearest the head: a member ranked behind the room's
// first headDepth members cannot be admitted by one release, since every
// one of those ahead of it reserves a unit at least. A room of 100,000
// waiters then wakes a few per release, not all of them.
//
// It is a list of sorted chunks of at most orderChunk members, so adding,
// moving or removing a member costs a search and a copy within one chunk,
// and the first members are read from the front. It is guarded by the
// room's mu.
type memberOrder struct {
	chunks [][]orderMember
	n      int
}

type orderMember struct {
	key  string
	wake chan struct{}
}

const orderChunk = 256

// insert adds wake at key.
func (o *memberOrder) insert(key string, wake chan struct{}) {
	m := orderMember{key, wake}
	o.n++
	if len(o.chunks) == 0 {
		o.chunks = [][]orderMember{{m}}
		return
	}
	c := o.chunkFor(key)
	chunk := o.chunks[c]
	i, _ := slices.BinarySearchFunc(chunk, key, func(a orderMember, k string) int { return strings.Compare(a.key, k) })
	chunk = slices.Insert(chunk, i, m)
	if len(chunk) <= orderChunk {
		o.chunks[c] = chunk
		return
	}
	// Split a full chunk in two halves of their own.
	half := len(chunk) / 2
	left := slices.Clone(chunk[:half])
	right := slices.Clone(chunk[half:])
	o.chunks[c] = left
	o.chunks = slices.Insert(o.chunks, c+1, right)
}

// remove takes wake at key out, if it is there. Members of equal keys may
// span chunks, so it looks back while a chunk starts at key.
func (o *memberOrder) remove(key string, wake chan struct{}) {
	for c := o.chunkFor(key); c >= 0 && c < len(o.chunks); c-- {
		chunk := o.chunks[c]
		i, _ := slices.BinarySearchFunc(chunk, key, func(a orderMember, k string) int { return strings.Compare(a.key, k) })
		for ; i < len(chunk) && chunk[i].key == key; i++ {
			if chunk[i].wake == wake {
				o.chunks[c] = slices.Delete(chunk, i, i+1)
				o.n--
				if len(o.chunks[c]) == 0 {
					o.chunks = slices.Delete(o.chunks, c, c+1)
				}
				return
			}
		}
		if chunk[0].key != key {
			return
		}
	}
}

// chunkFor returns the chunk that key belongs in: the last chunk whose
// first key is not above it (the first chunk for a key before them all).
func (o *memberOrder) chunkFor(key string) int {
	i, _ := slices.BinarySearchFunc(o.chunks, key, func(c []orderMember, k string) int {
		if strings.Compare(c[0].key, k) <= 0 {
			return -1
		}
		return 1
	})
	return max(i-1, 0)
}

// first calls f with the wake channels of the first n members, in order.
func (o *memberOrder) first(n int, f func(chan struct{})) {
	for _, chunk := range o.chunks {
		for _, m := range chunk {
			if n <= 0 {
				return
			}
			f(m.wake)
			n--
		}
	}
}

// nth returns the wake channel of the member at index i, nil if there are
// not that many.
func (o *memberOrder) nth(i int) chan struct{} {
	for _, chunk := range o.chunks {
		if i < len(chunk) {
			return chunk[i].wake
		}
		i -= len(chunk)
	}
	return nil
}

// within reports whether wake at key is among the first n members.
func (o *memberOrder) within(n int, key string, wake chan struct{}) bool {
	in := false
	o.first(n, func(w chan struct{}) { in = in || w == wake })
	return in
}
