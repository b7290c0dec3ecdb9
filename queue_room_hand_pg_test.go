package runlease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

// rangeAlphabet is the text of keys and prefixes the range reads are
// tried on: the characters LIKE, array literals and quoting give meaning
// to, multi-byte runes, the last code point (a prefix of it alone has no
// end) and the word an array literal reads as NULL.
var rangeAlphabet = []string{"a", "b", "%", "_", "\\", "\"", ",", "{", "}", " ", "\t", "\n", "é", "\uFFFF",
	"\U0010FFFF", "NULL", "null", "'", ":"}

func randText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteString(rangeAlphabet[rng.IntN(len(rangeAlphabet))])
	}
	return b.String()
}

// wantRanges is what MetaRanges must return for ranges over rows (sorted
// by key, byte order).
func wantRanges(rows []Row, ranges []Range) [][]Row {
	out := make([][]Row, len(ranges))
	for i, r := range ranges {
		got := []Row{}
		for _, row := range rows {
			if strings.HasPrefix(row.Key, r.Prefix) && row.Key > r.After {
				got = append(got, row)
				if r.Limit > 0 && len(got) == r.Limit {
					break
				}
			}
		}
		out[i] = got
	}
	return out
}

// TestPostgresRangesMatchTheirDefinition: MetaRanges, whose ranges with
// an end travel as one statement mapped back by ordinality, and the reads
// of MetaDeleteNotifyRanges return, for random keys and ranges (empty
// prefixes, prefixes without an end, duplicates, After inside, before and
// past a prefix, limits), exactly the rows the definition of Range names.
func TestPostgresRangesMatchTheirDefinition(t *testing.T) {
	pool := pgtest.Pool(t)
	s, err := NewPostgres(t.Context(), pool, WithTable(pgtest.NewTable(t, pool)))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	seed := rng.Uint64()
	rng = rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)

	byKey := map[string]string{}
	for range 120 {
		k := randText(rng, 1+rng.IntN(4))
		if _, ok := byKey[k]; ok {
			continue
		}
		v := fmt.Sprintf("v%d", len(byKey))
		ok, err := s.MetaCAS(ctx, k, nil, v)
		require.NoError(t, err)
		require.True(t, ok)
		byKey[k] = v
	}
	sorted := func() []Row {
		rows := make([]Row, 0, len(byKey))
		for k, v := range byKey {
			rows = append(rows, Row{Key: k, Value: v})
		}
		slices.SortFunc(rows, compareRowKeys)
		return rows
	}
	randRange := func(keys []Row) Range {
		var r Range
		switch rng.IntN(5) {
		case 0:
			r.Prefix = ""
		case 1:
			r.Prefix = strings.Repeat("\U0010FFFF", 1+rng.IntN(2))
		case 2:
			r.Prefix = randText(rng, 1+rng.IntN(2))
		default:
			k := keys[rng.IntN(len(keys))].Key
			r.Prefix = k[:rng.IntN(len(k)+1)]
			for !utf8Prefix(r.Prefix) {
				r.Prefix = r.Prefix[:len(r.Prefix)-1]
			}
		}
		switch rng.IntN(4) {
		case 0:
			r.After = keys[rng.IntN(len(keys))].Key
		case 1:
			r.After = randText(rng, 1+rng.IntN(3))
		}
		if rng.IntN(2) == 0 {
			r.Limit = rng.IntN(4)
		}
		return r
	}
	for round := range 300 {
		rows := sorted()
		ranges := make([]Range, rng.IntN(MaxScanMany+1))
		for i := range ranges {
			if i > 0 && rng.IntN(5) == 0 {
				ranges[i] = ranges[rng.IntN(i)] // a duplicate
				continue
			}
			ranges[i] = randRange(rows)
		}
		got, err := s.MetaRanges(ctx, ranges)
		require.NoError(t, err, "round %d: %q", round, ranges)
		require.Equal(t, wantRanges(rows, ranges), got, "round %d: MetaRanges of %q", round, ranges)

		// A delete with its reads: the reads follow it.
		victim := rows[rng.IntN(len(rows))]
		expected := victim.Value
		if rng.IntN(4) == 0 {
			expected = "not it"
		}
		deleted, got, err := s.MetaDeleteNotifyRanges(ctx, victim.Key, expected, "bell", "t", ranges)
		require.NoError(t, err)
		require.Equal(t, expected == victim.Value, deleted)
		if deleted {
			delete(byKey, victim.Key)
		}
		require.Equal(t, wantRanges(sorted(), ranges), got, "round %d: reads of MetaDeleteNotifyRanges of %q", round, ranges)
		if len(byKey) < 20 {
			break
		}
	}
}

func utf8Prefix(s string) bool { return CheckPrefix(s) == nil }

// TestPostgresHandOversNeverAdmitOverTheLimitNorLoseAWakeUp: as on
// SQLite, with notifications that travel through the server and may come
// back before the release's call returns, and with two Store values of
// one table (two rooms, whose tags are each other's rings).
func TestPostgresHandOversNeverAdmitOverTheLimitNorLoseAWakeUp(t *testing.T) {
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	open := func() *PostgresStore {
		s, err := NewPostgres(t.Context(), pool, WithTable(table))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open()
	t.Run("one", func(t *testing.T) { handOverStress(t, []Store{a}, 2, 8, 3) })
	t.Run("two", func(t *testing.T) { handOverStress(t, []Store{a, b}, 1, 8, 3) })
}

// TestPostgresHandOversAdmitInQueueOrder is TestHandOversAdmitInQueueOrder
// on Postgres.
func TestPostgresHandOversAdmitInQueueOrder(t *testing.T) {
	pool := pgtest.Pool(t)
	table := pgtest.NewTable(t, pool)
	s, err := NewPostgres(t.Context(), pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	s2, err := NewPostgres(t.Context(), pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s2.Close() })
	t.Run("one", func(t *testing.T) { handOverOrder(t, []Store{s}, 6) })
	t.Run("two", func(t *testing.T) { handOverOrder(t, []Store{s2, s}, 6) })
}
