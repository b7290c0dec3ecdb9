package runlease

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// sortQueue puts a queue in rank order and loses or repeats no entry, for
// queues of every length up to 300 with many ties on each field of the
// rank, already sorted, reversed and shuffled.
func TestSortQueueSortsAndKeepsEveryEntry(t *testing.T) {
	t.Parallel()
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 7))
		n := int(seed % 300)
		q := make([]queuedRow, n)
		for i := range q {
			q[i] = queuedRow{key: fmt.Sprintf("k%04d", i), e: queueEntry{
				Priority: rng.IntN(3),
				Tag:      int64(rng.IntN(5)),
				EnqMS:    int64(rng.IntN(5)),
				Run:      fmt.Sprintf("run-%d", rng.IntN(n/2+1)),
			}}
		}
		cmp := func(a, b queuedRow) int {
			switch {
			case a.e.before(&b.e):
				return -1
			case b.e.before(&a.e):
				return 1
			}
			return 0
		}
		switch seed % 3 {
		case 1:
			slices.SortFunc(q, cmp)
		case 2:
			slices.SortFunc(q, func(a, b queuedRow) int { return cmp(b, a) })
		}
		keys := func(q []queuedRow) []string {
			var ks []string
			for _, r := range q {
				ks = append(ks, r.key)
			}
			slices.Sort(ks)
			return ks
		}
		before := keys(q)
		byKey := map[string]queueEntry{}
		for _, r := range q {
			byKey[r.key] = r.e
		}
		sortQueue(q)
		require.True(t, slices.IsSortedFunc(q, cmp), "seed %d: not in rank order", seed)
		require.Equal(t, before, keys(q), "seed %d: entries lost or repeated", seed)
		for _, r := range q {
			require.Equal(t, byKey[r.key], r.e, "seed %d: an entry moved without its key", seed)
		}
	}
}
