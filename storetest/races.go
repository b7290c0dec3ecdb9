package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// raceRounds is how many rounds each race test runs.
func raceRounds() int {
	if testing.Short() {
		return 100
	}
	return 1000
}

// shortOr returns short when testing.Short reports true and full
// otherwise: how many times to repeat a check whose count is only for
// confidence.
func shortOr(short, full int) int {
	if testing.Short() {
		return short
	}
	return full
}

// race runs fn(0) … fn(n-1) on n goroutines and returns when all are done.
// A start barrier holds every goroutine until all of them exist, so the calls
// overlap instead of running one after another as the goroutines are spawned.
func race(n int, fn func(i int)) {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(n)
	for i := range n {
		done.Go(func() {
			ready.Done()
			<-start
			fn(i)
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
}

// winners returns the indexes of the true entries of won.
func winners(won []bool) []int {
	var out []int
	for i, w := range won {
		if w {
			out = append(out, i)
		}
	}
	return out
}

// racers varies the number of goroutines from 2 to 8 with the round.
func racers(round int) int { return 2 + round%7 }

// oneWinner races the round's racers, racer i calling call(i), requires
// that none of them fails and exactly one wins (the op, "create" say, names
// the race in a failure), and returns the winner.
func oneWinner(t *testing.T, round int, op string, call func(i int) (bool, error)) int {
	t.Helper()
	n := racers(round)
	won, errs := make([]bool, n), make([]error, n)
	race(n, func(i int) { won[i], errs[i] = call(i) })
	require.NoError(t, errors.Join(errs...), "round %d, %d racers", round, n)
	w := winners(won)
	require.Len(t, w, 1, "round %d, %d racers: exactly one %s wins", round, n, op)
	return w[0]
}

func testRaces(t *testing.T, newStore newStoreFunc) {
	t.Run("a_lost_race_is_false_not_an_error", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for round := range raceRounds() {
			key := fmt.Sprintf("race/create/%04d", round)
			w := oneWinner(t, round, "create", func(i int) (bool, error) {
				return s.MetaCAS(t.Context(), key, nil, fmt.Sprintf("created by %d", i))
			})
			requireValue(t, s, key, fmt.Sprintf("created by %d", w))
		}
	}))

	t.Run("racing_swaps_from_one_expected_value_have_exactly_one_winner", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for round := range raceRounds() / 4 {
			key := fmt.Sprintf("race/swap/%04d", round)
			create(t, s, key, "start")
			w := oneWinner(t, round, "swap", func(i int) (bool, error) {
				return s.MetaCAS(t.Context(), key, ptr("start"), fmt.Sprintf("swapped by %d", i))
			})
			requireValue(t, s, key, fmt.Sprintf("swapped by %d", w))
		}
	}))

	t.Run("racing_deletes_of_one_value_have_exactly_one_winner", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for round := range raceRounds() / 4 {
			key := fmt.Sprintf("race/delete/%04d", round)
			create(t, s, key, "doomed")
			oneWinner(t, round, "delete", func(i int) (bool, error) { return s.MetaDelete(t.Context(), key, "doomed") })
			requireAbsent(t, s, key)
		}
	}))
}

const (
	mixWorkers = 16
	mixCounter = "mix/counter"
)

// mixOps is how many operations each worker of the mixed load makes.
func mixOps() int { return shortOr(60, 200) }

var mixKeys = []string{"mix/a", "mix/b", "mix/c"}

func testMixedLoad(t *testing.T, newStore newStoreFunc) {
	t.Run("concurrent_mixed_load_has_no_errors_and_loses_no_update", parallel(newStore, func(t *testing.T, s runlease.Store) {
		var increments atomic.Int64
		errs := make([][]error, mixWorkers)
		race(mixWorkers, func(w int) {
			rng := rand.New(rand.NewPCG(uint64(w), 0x5eed))
			for op := range mixOps() {
				if err := mixedOp(t.Context(), s, rng, fmt.Sprintf("w%d-op%d", w, op), &increments); err != nil {
					errs[w] = append(errs[w], fmt.Errorf("worker %d op %d: %w", w, op, err))
				}
			}
		})
		require.NoError(t, errors.Join(slices.Concat(errs...)...))

		// Every successful increment was a CAS from the value it read, so
		// the counter equals their number unless an update was lost.
		v, found := get(t, s, mixCounter)
		require.True(t, found)
		assert.Equal(t, strconv.FormatInt(increments.Load(), 10), v, "lost or phantom counter updates")
		for _, row := range scan(t, s, "mix/") {
			requireValue(t, s, row.Key, row.Value)
		}
	}))
}

// mixedOp performs one random operation of the mixed load. It returns an
// error for a store error or for a scan that breaks the contract.
func mixedOp(ctx context.Context, s runlease.Store, rng *rand.Rand, tag string, increments *atomic.Int64) error {
	key := mixKeys[rng.IntN(len(mixKeys))]
	switch rng.IntN(6) {
	case 0:
		_, _, err := s.MetaGet(ctx, key)
		return err
	case 1:
		cur, found, err := s.MetaGet(ctx, mixCounter)
		if err != nil {
			return err
		}
		var expected *string
		next := 1
		if found {
			n, err := strconv.Atoi(cur)
			if err != nil {
				return fmt.Errorf("counter holds %q: %w", cur, err)
			}
			expected, next = &cur, n+1
		}
		ok, err := s.MetaCAS(ctx, mixCounter, expected, strconv.Itoa(next))
		if ok {
			increments.Add(1)
		}
		return err
	case 2:
		_, err := s.MetaCAS(ctx, key, nil, tag)
		return err
	case 3:
		v, found, err := s.MetaGet(ctx, key)
		if err != nil || !found {
			return err
		}
		_, err = s.MetaDelete(ctx, key, v)
		return err
	case 4:
		v, found, err := s.MetaGet(ctx, key)
		if err != nil || !found {
			return err
		}
		_, err = s.MetaCAS(ctx, key, &v, tag)
		return err
	default:
		rows, err := s.MetaScan(ctx, "mix/")
		if err != nil {
			return err
		}
		for i, r := range rows {
			if !strings.HasPrefix(r.Key, "mix/") || (i > 0 && rows[i-1].Key >= r.Key) {
				return fmt.Errorf("scan of %q returned keys out of range or order: %q", "mix/", rows)
			}
		}
		return nil
	}
}
