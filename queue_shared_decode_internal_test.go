package runlease

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sharedDecodeRows makes the rows of scope "gpu" a scan could return: slot
// rows, queue entries live and expired, of several principals and
// priorities, entries of another scope, and fair-share marks.
func sharedDecodeRows(rng *rand.Rand, n int, nowMS int64) scopeRows {
	var raw scopeRows
	for i := range 3 {
		row := leaseRow{Holder: "holder-" + strconv.Itoa(i), Fence: 1, UntilMS: nowMS + int64(rng.IntN(4000)) - 1000}
		raw.slots = append(raw.slots, Row{Key: NamedScope("gpu", 4).prefix() + strconv.Itoa(i), Value: row.encode()})
	}
	for i := range n {
		scope := "gpu"
		if rng.IntN(10) == 0 {
			scope = "gpux" // another scope's entry, which no reader of gpu counts
		}
		e := queueEntry{Run: fmt.Sprintf("run-%04d", i), Waiter: "w" + strconv.Itoa(i), Seq: uint64(rng.IntN(5)),
			Principal: []string{"", "a", "b"}[rng.IntN(3)], Weight: 1 + rng.IntN(3), Priority: rng.IntN(3) - 1,
			Units: 1 + rng.IntN(2), Tag: int64(rng.IntN(50)), EnqMS: nowMS - int64(rng.IntN(10000)),
			UntilMS: nowMS + int64(rng.IntN(4000)) - 1000, Scopes: []string{scope}}
		raw.queue = append(raw.queue, Row{Key: queueKey(scope, e.Run), Value: e.encode()})
	}
	sort.Slice(raw.queue, func(i, j int) bool { return raw.queue[i].Key < raw.queue[j].Key })
	for _, p := range []string{"a", "b"} {
		m, _ := json.Marshal(fairMark{Finish: int64(rng.IntN(100)), UntilMS: nowMS + int64(rng.IntN(4000)) - 1000})
		raw.marks = append(raw.marks, Row{Key: fairKey("gpu", p), Value: string(m)})
	}
	return raw
}

// TestASharedDecodeJudgesAsADecodeOfItsOwn: waiters of a room that share
// one decoding of the queue (a scan's sharedQueue) judge a scope exactly
// as each decoding the rows for itself, at any moment and for any run.
func TestASharedDecodeJudgesAsADecodeOfItsOwn(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	sc := NamedScope("gpu", 4)
	for round := range 50 {
		const nowMS = 1_000_000
		raw := sharedDecodeRows(rng, rng.IntN(60), nowMS)
		shared := raw
		shared.shared = &sharedQueue{}
		for _, at := range []int64{nowMS - 2000, nowMS, nowMS + 1500, nowMS + 5000} {
			o := options{now: func() time.Time { return time.UnixMilli(at) }}
			for _, run := range []string{"run-0003", "holder-1", "someone"} {
				want, err := decodeScope(sc, run, o, raw)
				require.NoError(t, err)
				got, err := decodeScope(sc, run, o, shared)
				require.NoError(t, err)
				assert.Equal(t, want, got, "round %d, at %d, run %s", round, at, run)
			}
		}
	}
}

// TestASharedDecodeOfACorruptEntryFailsEveryWaiter: a corrupt entry fails
// each waiter's judgement, as it fails a decoding of its own.
func TestASharedDecodeOfACorruptEntryFailsEveryWaiter(t *testing.T) {
	t.Parallel()
	raw := sharedDecodeRows(rand.New(rand.NewPCG(1, 2)), 5, 1_000_000)
	raw.queue = append(raw.queue, Row{Key: queueKey("gpu", "zz-bad"), Value: "{not json"})
	raw.shared = &sharedQueue{}
	o := options{now: func() time.Time { return time.UnixMilli(1_000_000) }}
	for range 2 {
		_, err := decodeScope(NamedScope("gpu", 4), "r", o, raw)
		require.ErrorIs(t, err, ErrCorruptRow)
	}
}

// BenchmarkDecodeScopeWake: the CPU one wake-up costs the waiters of a
// room who judge a scope whose queue holds n entries: w decodings of their
// own ("own"), or one decoding shared by the w of them ("shared"). One op
// is one wake-up of all w waiters.
func BenchmarkDecodeScopeWake(b *testing.B) {
	sc := NamedScope("gpu", 4)
	const nowMS = 1_000_000
	o := options{now: func() time.Time { return time.UnixMilli(nowMS) }}
	for _, n := range []int{100, 10_000} {
		raw := sharedDecodeRows(rand.New(rand.NewPCG(3, 4)), n, nowMS)
		for _, w := range []int{1, 20} {
			for _, shared := range []bool{false, true} {
				name := fmt.Sprintf("queue=%d/waiters=%d/own", n, w)
				if shared {
					name = fmt.Sprintf("queue=%d/waiters=%d/shared", n, w)
				}
				b.Run(name, func(b *testing.B) {
					for range b.N {
						r := raw
						if shared {
							r.shared = &sharedQueue{}
						}
						for i := range w {
							if _, err := decodeScope(sc, "run-"+strconv.Itoa(i), o, r); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
		}
	}
}
