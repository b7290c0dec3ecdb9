package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// testBatch checks the optional [runlease.Batcher] capability, when the
// store has it: all or nothing, isolated from every other call.
func testBatch(t *testing.T, newStore newStoreFunc) {
	with := withCapability[runlease.Batcher](newStore)
	t.Run("conditions_that_hold_apply_every_op", with(testBatchApplies))
	t.Run("a_failed_condition_writes_nothing", with(testBatchRefuses))
	t.Run("bad_batches_are_refused_and_write_nothing", with(testBatchBadInput))
	t.Run("concurrent_batches_over_overlapping_keys_are_atomic", with(testBatchAtomicity))
	t.Run("one_of_many_racing_absent_claims_wins", with(testBatchAbsentRace))
	t.Run("batches_conditioned_on_each_others_keys_never_both_apply", with(testBatchWriteSkew))
}

func batch(t *testing.T, b runlease.Batcher, conds []runlease.Cond, ops ...runlease.Op) bool {
	t.Helper()
	ok, err := b.MetaBatch(t.Context(), conds, ops)
	require.NoError(t, err, "MetaBatch")
	return ok
}

func testBatchApplies(t *testing.T, s runlease.Store, b runlease.Batcher) {
	create(t, s, "lease", "v1")
	create(t, s, "old", "x")
	ok := batch(t, b, []runlease.Cond{runlease.IfEquals("lease", "v1"), runlease.IfAbsent("new")},
		runlease.Put("lease", "v2"), runlease.Put("new", "n"), runlease.Delete("old"), runlease.Delete("never-there"))
	require.True(t, ok)
	requireValue(t, s, "lease", "v2")
	requireValue(t, s, "new", "n")
	requireAbsent(t, s, "old")
	requireAbsent(t, s, "never-there")
	require.True(t, batch(t, b, nil, runlease.Put("free", "f")), "no conditions: always applies")
	requireValue(t, s, "free", "f")
}

func testBatchRefuses(t *testing.T, s runlease.Store, b runlease.Batcher) {
	create(t, s, "lease", "v1")
	create(t, s, "data", "d")
	before := scan(t, s, "")
	for name, conds := range map[string][]runlease.Cond{
		"wrong_value":        {runlease.IfEquals("lease", "v0")},
		"present_not_absent": {runlease.IfAbsent("lease")},
		"absent_not_equal":   {runlease.IfEquals("missing", "v1")},
		"one_of_two_fails":   {runlease.IfEquals("lease", "v1"), runlease.IfAbsent("data")},
	} {
		require.False(t, batch(t, b, conds, runlease.Put("lease", "v9"), runlease.Put("fresh", "f"),
			runlease.Delete("data")), name)
		require.Equal(t, before, scan(t, s, ""), "%s: nothing written", name)
	}
}

func testBatchBadInput(t *testing.T, s runlease.Store, b runlease.Batcher) {
	create(t, s, "k", "v")
	before := scan(t, s, "")
	many := make([]runlease.Op, runlease.MaxBatch+1)
	for i := range many {
		many[i] = runlease.Put("m"+strconv.Itoa(i), "x")
	}
	for name, tc := range map[string]struct {
		conds []runlease.Cond
		ops   []runlease.Op
	}{
		"no_ops":          {[]runlease.Cond{runlease.IfAbsent("a")}, nil},
		"too_many_ops":    {nil, many},
		"two_ops_one_key": {nil, []runlease.Op{runlease.Put("a", "1"), runlease.Delete("a")}},
		"nul_in_key":      {nil, []runlease.Op{runlease.Put("a", "1"), runlease.Put("b\x00", "1")}},
		"invalid_value":   {nil, []runlease.Op{runlease.Put("a", "1"), runlease.Put("b", "\xff")}},
		"empty_key":       {nil, []runlease.Op{runlease.Delete("")}},
		"bad_cond_key":    {[]runlease.Cond{runlease.IfAbsent(strings.Repeat("k", runlease.MaxKeyLen+1))}, []runlease.Op{runlease.Put("a", "1")}},
		"bad_cond_value":  {[]runlease.Cond{runlease.IfEquals("k", "v\x00")}, []runlease.Op{runlease.Put("a", "1")}},
	} {
		ok, err := b.MetaBatch(t.Context(), tc.conds, tc.ops)
		require.ErrorIs(t, err, runlease.ErrInvalidArgument, name)
		require.False(t, ok, name)
		require.Equal(t, before, scan(t, s, ""), "%s: nothing written", name)
	}
}

// testBatchAtomicity runs 16 writers over 6 counters: batches that add one
// to two counters each, conditional on both, and single-key CAS increments
// beside them. Any batch that applied in part, or two writers that both
// won against one value, breaks the final sum.
func testBatchAtomicity(t *testing.T, s runlease.Store, b runlease.Batcher) {
	const counters = 6
	var batched, single atomic.Int64
	sum := raceCounters(t, s, counters, 16, shortOr(15, 40), 7, func(ctx context.Context, w int, rng *rand.Rand, key func(int) string) error {
		return batchIncrement(ctx, s, b, rng, key, counters, w%4 == 0, &batched, &single)
	})
	require.Equal(t, int(2*batched.Load()+single.Load()), sum, "every applied write counted once, no partial batch")
	require.Positive(t, batched.Load())
}

// raceCounters creates counters rows holding "0", has writers goroutines
// make rounds increments each with inc (given the writer's number, a
// generator seeded by it and seed, and the counters' keys), and returns
// the counters' sum once all are done. A writer stops at its first error,
// which fails t.
func raceCounters(t *testing.T, s runlease.Store, counters, writers, rounds int, seed uint64,
	inc func(ctx context.Context, w int, rng *rand.Rand, key func(int) string) error) int {
	key := func(i int) string { return "counter/" + strconv.Itoa(i) }
	for i := range counters {
		create(t, s, key(i), "0")
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for range rounds {
				if err := inc(t.Context(), w, rng, key); err != nil {
					assert.NoError(t, err)
					return
				}
			}
		})
	}
	wg.Wait()
	sum := 0
	for i := range counters {
		v, _ := get(t, s, key(i))
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		sum += n
	}
	return sum
}

func batchIncrement(ctx context.Context, s runlease.Store, b runlease.Batcher, rng *rand.Rand,
	key func(int) string, counters int, singleKey bool, batched, single *atomic.Int64) error {
	i, j := rng.IntN(counters), rng.IntN(counters-1)
	if j >= i {
		j++
	}
	vi, _, err := s.MetaGet(ctx, key(i))
	if err != nil {
		return err
	}
	if singleKey {
		ok, err := s.MetaCAS(ctx, key(i), &vi, incr(vi))
		if ok {
			single.Add(1)
		}
		return err
	}
	vj, _, err := s.MetaGet(ctx, key(j))
	if err != nil {
		return err
	}
	ok, err := b.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals(key(i), vi), runlease.IfEquals(key(j), vj)},
		[]runlease.Op{runlease.Put(key(i), incr(vi)), runlease.Put(key(j), incr(vj))})
	if ok {
		batched.Add(1)
	}
	return err
}

func incr(v string) string {
	n, _ := strconv.Atoi(v)
	return strconv.Itoa(n + 1)
}

// testBatchAbsentRace races batches that claim one absent key, each also
// writing a marker of its own, against single-key creates of the same key:
// exactly one call wins, and only the winner's marker exists.
func testBatchAbsentRace(t *testing.T, s runlease.Store, b runlease.Batcher) {
	rounds := raceRounds() / 10
	for round := range rounds {
		claim := "claim/" + strconv.Itoa(round)
		n := racers(round) + 2
		won := make([]bool, n)
		errs := make([]error, n)
		race(n, func(i int) {
			me := strconv.Itoa(i)
			if i%3 == 2 {
				won[i], errs[i] = s.MetaCAS(context.Background(), claim, nil, me)
				return
			}
			won[i], errs[i] = b.MetaBatch(context.Background(), []runlease.Cond{runlease.IfAbsent(claim)},
				[]runlease.Op{runlease.Put(claim, me), runlease.Put(claim+"/marker/"+me, "x")})
		})
		for i, err := range errs {
			require.NoError(t, err, "racer %d", i)
		}
		w := winners(won)
		require.Len(t, w, 1, "round %d: winners %v", round, w)
		requireValue(t, s, claim, strconv.Itoa(w[0]))
		markers := scan(t, s, claim+"/marker/")
		if w[0]%3 == 2 {
			require.Empty(t, markers, "a losing batch left a marker")
		} else {
			require.Equal(t, []runlease.Row{{Key: claim + "/marker/" + strconv.Itoa(w[0]), Value: "x"}}, markers)
		}
	}
}

// testBatchWriteSkew races pairs of batches that each read one key and
// write the other: x turns "off" only if y is "on", and y turns "off" only
// if x is "on". Executed one after the other, exactly one of a pair applies;
// a store that checks the condition on a key it only reads outside its lock
// (write skew) lets both apply, and turns both keys off.
func testBatchWriteSkew(t *testing.T, s runlease.Store, b runlease.Batcher) {
	for round := range raceRounds() / 10 {
		pairs := 1 + round%3
		key := func(pair, i int) string { return fmt.Sprintf("skew/%04d/%d/%d", round, pair, i) }
		for pair := range pairs {
			create(t, s, key(pair, 0), "on")
			create(t, s, key(pair, 1), "on")
		}
		won := make([]bool, 2*pairs)
		errs := make([]error, 2*pairs)
		race(2*pairs, func(i int) {
			pair, me := i/2, i%2
			won[i], errs[i] = b.MetaBatch(t.Context(), []runlease.Cond{runlease.IfEquals(key(pair, 1-me), "on")},
				[]runlease.Op{runlease.Put(key(pair, me), "off")})
		})
		require.NoError(t, errors.Join(errs...), "round %d", round)
		for pair := range pairs {
			w := winners(won[2*pair : 2*pair+2])
			require.Len(t, w, 1, "round %d: of two batches each conditioned on the key the other writes, exactly one applies; winners %v", round, w)
			requireValue(t, s, key(pair, w[0]), "off")
			requireValue(t, s, key(pair, 1-w[0]), "on")
		}
	}
}
