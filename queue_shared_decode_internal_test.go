package runlease

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
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
		judgesAlike(t, sc, nowMS, raw, shared, round)
	}
}

// judgesAlike requires decodeScope to judge sc alike from raw, decoded on
// its own, and from other, the same rows with a shared decoding, for
// several runs at moments around nowMS.
func judgesAlike(t *testing.T, sc Scope, nowMS int64, raw, other scopeRows, round int) {
	t.Helper()
	for _, at := range []int64{nowMS - 2000, nowMS, nowMS + 1500, nowMS + 5000} {
		o := options{now: func() time.Time { return time.UnixMilli(at) }}
		for _, run := range []string{"run-0003", "holder-1", "someone"} {
			want, err := decodeScope(sc, run, o, raw)
			require.NoError(t, err)
			got, err := decodeScope(sc, run, o, other)
			require.NoError(t, err)
			assert.Equal(t, want, got, "round %d, at %d, run %s", round, at, run)
		}
	}
}

// TestASharedDecodeSetsACorruptEntryAsideForEveryWaiter: a corrupt entry
// holds no place in any waiter's judgement, and each sees it among the
// rows nothing may write over, as in a decoding of its own.
func TestASharedDecodeSetsACorruptEntryAsideForEveryWaiter(t *testing.T) {
	t.Parallel()
	raw := sharedDecodeRows(rand.New(rand.NewPCG(1, 2)), 5, 1_000_000)
	bad := queueKey("gpu", "zz-bad")
	raw.queue = append(raw.queue, Row{Key: bad, Value: "{not json"})
	o := options{now: func() time.Time { return time.UnixMilli(1_000_000) }}
	own, err := decodeScope(NamedScope("gpu", 4), "r", o, raw)
	require.NoError(t, err)
	raw.shared = &sharedQueue{}
	for range 2 {
		st, err := decodeScope(NamedScope("gpu", 4), "r", o, raw)
		require.NoError(t, err)
		assert.Equal(t, map[string]string{bad: "{not json"}, st.badRows)
		assert.Nil(t, findEntry(st.queue, "zz-bad"))
		assert.Equal(t, own.queue, st.queue)
		assert.Equal(t, own.badRows, st.badRows)
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

// renewSome returns raw with every k-th entry of its queue rewritten as a
// renewal writes it (a later seq and until_ms): what a reader of a long
// queue finds changed between two of its reads.
func renewSome(t testing.TB, raw scopeRows, k int) scopeRows {
	out := raw
	out.queue = slices.Clone(raw.queue)
	for i := 0; i < len(out.queue); i += k {
		e, err := decodeEntry(out.queue[i].Value)
		require.NoError(t, err)
		e.Seq++
		e.UntilMS += 1500
		out.queue[i].Value = e.encode()
	}
	return out
}

// BenchmarkDecodeScopeRewake: the CPU a lone waiter spends judging a
// scope it read before, when one entry in twenty changed since: decoding
// every entry of its own ("own"), through a scan's shared decoding ("shared"),
// or through one that reuses the entries of the previous read's decoding
// that did not change ("reused"). One op is one judgement.
func BenchmarkDecodeScopeRewake(b *testing.B) {
	sc := NamedScope("gpu", 4)
	const nowMS = 1_000_000
	o := options{now: func() time.Time { return time.UnixMilli(nowMS) }}
	for _, n := range []int{100, 10_000} {
		before := sharedDecodeRows(rand.New(rand.NewPCG(3, 4)), n, nowMS)
		after := renewSome(b, before, 20)
		for _, mode := range []string{"own", "shared", "reused"} {
			b.Run(fmt.Sprintf("queue=%d/%s", n, mode), func(b *testing.B) {
				prev := &sharedQueue{}
				if _, err := prev.decode(before, sc.name); err != nil {
					b.Fatal(err)
				}
				for range b.N {
					r := after
					switch mode {
					case "shared":
						r.shared = &sharedQueue{}
					case "reused":
						r.shared = &sharedQueue{prev: prev}
					}
					if _, err := decodeScope(sc, "run-1", o, r); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestAReusedDecodeJudgesAsADecodeOfItsOwn: a scan's shared decoding that
// reuses the previous scan's entries where a row is unchanged judges the
// scope exactly as a decoding of its own, whatever changed between the two
// scans: entries renewed, gone, added, or rewritten under the same key.
func TestAReusedDecodeJudgesAsADecodeOfItsOwn(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 9))
	sc := NamedScope("gpu", 4)
	for round := range 50 {
		const nowMS = 1_000_000
		before := sharedDecodeRows(rng, rng.IntN(60), nowMS)
		after := renewSome(t, before, 1+rng.IntN(4))
		// Some entries leave, and others come, with keys of the ones
		// before (a run queued again) or new ones.
		added := sharedDecodeRows(rng, rng.IntN(20), nowMS)
		after.queue = slices.DeleteFunc(after.queue, func(Row) bool { return rng.IntN(5) == 0 })
		for _, r := range added.queue {
			r.Key += "-new"
			if rng.IntN(2) == 0 && len(after.queue) > 0 {
				r.Key = after.queue[rng.IntN(len(after.queue))].Key
				after.queue = slices.DeleteFunc(after.queue, func(q Row) bool { return q.Key == r.Key })
			}
			after.queue = append(after.queue, r)
		}
		slices.SortFunc(after.queue, func(a, b Row) int { return strings.Compare(a.Key, b.Key) })
		prev := &sharedQueue{}
		_, err := prev.decode(before, sc.name)
		require.NoError(t, err)
		require.Same(t, prev, prev.decoded())
		reused := after
		reused.shared = &sharedQueue{prev: prev}
		judgesAlike(t, sc, nowMS, after, reused, round)
		require.Nil(t, reused.shared.prev, "a decoding lets go of the one it reused")
	}
}

// TestAReusedDecodeStillFindsACorruptEntry: an entry that was valid in the
// previous scan and is corrupt now is set aside, not reused as it was.
func TestAReusedDecodeStillFindsACorruptEntry(t *testing.T) {
	t.Parallel()
	sc := NamedScope("gpu", 4)
	o := options{now: func() time.Time { return time.UnixMilli(1_000_000) }}
	before := sharedDecodeRows(rand.New(rand.NewPCG(1, 2)), 5, 1_000_000)
	prev := &sharedQueue{}
	_, err := prev.decode(before, sc.name)
	require.NoError(t, err)
	after := before
	after.queue = slices.Clone(before.queue)
	after.queue[2].Value = "{not json"
	after.shared = &sharedQueue{prev: prev}
	st, err := decodeScope(sc, "r", o, after)
	require.NoError(t, err)
	require.Contains(t, st.badRows, after.queue[2].Key)
	for _, q := range st.queue {
		require.NotEqual(t, after.queue[2].Key, q.key, "the corrupt entry holds no place")
	}
	require.Nil(t, (&sharedQueue{}).decoded(), "a decoding not yet made is not reused")
}
