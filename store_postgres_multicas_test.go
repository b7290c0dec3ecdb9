package runlease_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// TestPostgresMetaCASMany covers what the conformance suite cannot: the
// locks that concurrent calls take on the server.
func TestPostgresMetaCASMany(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)

	t.Run("overlapping_calls_in_different_orders_never_deadlock", func(t *testing.T) {
		t.Parallel()
		s := pgStore(t, pool)
		const keys, writers, rounds = 10, 8, 10
		for k := range keys {
			require.True(t, mustCAS(t, s, fmt.Sprint("k", k), nil, "0"))
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers*rounds)
		for w := range writers {
			wg.Go(func() {
				for r := range rounds {
					errs <- casManyShuffled(t, s, keys, fmt.Sprintf("w%d-r%d", w, r))
				}
			})
		}
		wg.Wait()
		close(errs)
		failed := 0
		for err := range errs {
			if err != nil {
				failed++
				t.Log(err)
			}
		}
		assert.Zero(t, failed, "calls out of %d that failed", writers*rounds)
	})
}

// casManyShuffled reads every key and writes most of them, in a random
// order, each conditional on the value it read, and every tenth round
// deletes one so that some writes are inserts of an absent key.
func casManyShuffled(t *testing.T, s *runlease.PostgresStore, keys int, value string) error {
	rows, err := s.MetaScan(t.Context(), "k")
	if err != nil {
		return err
	}
	held := map[string]string{}
	for _, r := range rows {
		held[r.Key] = r.Value
	}
	var writes []runlease.CASWrite
	for _, k := range rand.Perm(keys)[:keys-2] {
		key := fmt.Sprint("k", k)
		w := runlease.CASWrite{Key: key, Value: value}
		if v, ok := held[key]; ok {
			w.Expected = &v
		}
		writes = append(writes, w)
	}
	if rand.IntN(10) == 0 && writes[0].Expected != nil {
		if _, err := s.MetaDelete(t.Context(), writes[0].Key, *writes[0].Expected); err != nil {
			return err
		}
	}
	_, err = s.MetaCASMany(t.Context(), writes)
	return err
}
