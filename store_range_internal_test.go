package runlease

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckRanges(t *testing.T) {
	t.Parallel()
	valid := [][]Range{
		nil,
		{},
		{{}},
		{{Prefix: "runqueue:3:mem:", After: "runqueue:3:mem:000017:x", Limit: 8}},
		{{Prefix: "p", After: strings.Repeat("é", MaxKeyLen/2)}}, // After of MaxKeyLen bytes
		{{Prefix: strings.Repeat("p", MaxKeyLen)}},
		{{After: "anything below, inside or past the prefix", Prefix: "m"}},
		slices.Repeat([]Range{{Prefix: "p"}}, MaxScanMany),
	}
	for _, ranges := range valid {
		assert.NoError(t, CheckRanges(ranges), "%+v", ranges)
	}
	invalid := []struct {
		arg    string
		ranges []Range
	}{
		{"ranges", slices.Repeat([]Range{{Prefix: "p"}}, MaxScanMany+1)},
		{"prefix", []Range{{Prefix: "ok"}, {Prefix: "a\x00"}}},
		{"prefix", []Range{{Prefix: "\xff"}}},
		{"prefix", []Range{{Prefix: strings.Repeat("p", MaxKeyLen+1)}}},
		{"after", []Range{{Prefix: "p", After: "p\x00"}}},
		{"after", []Range{{Prefix: "p", After: "a\xe2\x82"}}},
		{"after", []Range{{Prefix: "p", After: strings.Repeat("a", MaxKeyLen+1)}}},
		{"limit", []Range{{Prefix: "p", Limit: 1}, {Prefix: "p", Limit: -1}}},
	}
	for _, c := range invalid {
		err := CheckRanges(c.ranges)
		require.ErrorIs(t, err, ErrInvalidArgument, "%d ranges, the last %+.40v", len(c.ranges), c.ranges[len(c.ranges)-1])
		var ae *ArgumentError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, c.arg, ae.Arg, "%v", err)
	}
}

// TestCutRange compares cutRange with a model that filters every row, on
// random sorted keys, Afters and limits.
func TestCutRange(t *testing.T) {
	t.Parallel()
	alphabet := []string{"a", "b", "é", "%", "_", ":", "\U0010FFFF"}
	word := func() string {
		var b strings.Builder
		for range rand.IntN(4) {
			b.WriteString(alphabet[rand.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 2000 {
		seen := map[string]bool{}
		var rows []Row
		for range rand.IntN(12) {
			if k := word(); k != "" && !seen[k] {
				seen[k] = true
				rows = append(rows, Row{Key: k, Value: "v:" + k})
			}
		}
		slices.SortFunc(rows, func(a, b Row) int { return strings.Compare(a.Key, b.Key) })
		r := Range{After: word(), Limit: rand.IntN(5)}
		if rand.IntN(3) == 0 && len(rows) > 0 {
			r.After = rows[rand.IntN(len(rows))].Key // an existing key: excluded
		}
		want := []Row{}
		for _, row := range rows {
			if row.Key > r.After && (r.Limit == 0 || len(want) < r.Limit) {
				want = append(want, row)
			}
		}
		input := slices.Clone(rows)
		got := cutRange(rows, r)
		require.Equal(t, want, nonNilRows(got), "cutRange(%q, %+v)", rows, r)
		// The result's capacity ends with it, so that appending to it
		// never writes over the rows it was cut from.
		_ = append(got, Row{Key: "appended"})
		require.Equal(t, input, rows, "cutRange(%+v) changed its input once appended to", r)
	}
}

func nonNilRows(rows []Row) []Row {
	if rows == nil {
		return []Row{}
	}
	return rows
}

// rangeCounter counts the reads of a store, as a Store and nothing more:
// it has no RangeReader and no MultiScanner of its own.
type rangeCounter struct {
	Store
	scans, scanManys, ranges atomic.Int64
}

func (c *rangeCounter) MetaScan(ctx context.Context, prefix string) ([]Row, error) {
	c.scans.Add(1)
	return c.Store.MetaScan(ctx, prefix)
}

// multiScanOnly adds MultiScanner to a rangeCounter.
type multiScanOnly struct{ *rangeCounter }

func (c multiScanOnly) MetaScanMany(ctx context.Context, prefixes []string) ([][]Row, error) {
	c.scanManys.Add(1)
	return c.Store.(MultiScanner).MetaScanMany(ctx, prefixes)
}

// withRanges adds RangeReader to a rangeCounter.
type withRanges struct{ multiScanOnly }

func (c withRanges) MetaRanges(ctx context.Context, ranges []Range) ([][]Row, error) {
	c.ranges.Add(1)
	return c.Store.(RangeReader).MetaRanges(ctx, ranges)
}

// TestReadRanges reads the same ranges through a store that is a
// RangeReader, one that is only a MultiScanner and one that is neither:
// each returns the same rows, in the calls its capabilities allow, and bad
// input is refused before any of them reads.
func TestReadRanges(t *testing.T) {
	t.Parallel()
	s, err := OpenSQLite(":memory:")
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	var keys []string
	for i := range 40 {
		keys = append(keys, "q/"+strconv.Itoa(i), "r/"+strconv.Itoa(i))
	}
	for _, k := range append(keys, "q", "q0", "p/1") {
		ok, err := s.MetaCAS(t.Context(), k, nil, "v:"+k)
		require.NoError(t, err)
		require.True(t, ok)
	}
	ranges := []Range{
		{Prefix: "q/", Limit: 8},
		{Prefix: "q/", After: "q/17", Limit: 3},
		{Prefix: "r/", After: "r/9"},
		{Prefix: "", After: "q/8", Limit: 5},
		{Prefix: "q/", After: "q0"},
		{Prefix: "none/", Limit: 1},
	}
	want := make([][]Row, len(ranges))
	for i, r := range ranges {
		rows, err := s.MetaScan(t.Context(), r.Prefix)
		require.NoError(t, err)
		want[i] = []Row{}
		for _, row := range rows {
			if row.Key > r.After && (r.Limit == 0 || len(want[i]) < r.Limit) {
				want[i] = append(want[i], row)
			}
		}
	}
	bad := append(slices.Clone(ranges), Range{Prefix: "q/", Limit: -1})
	type calls struct{ scans, scanManys, ranges int64 }
	for _, c := range []struct {
		name  string
		store func(*rangeCounter) Store
		calls calls
	}{
		{"range_reader", func(c *rangeCounter) Store { return withRanges{multiScanOnly{c}} }, calls{ranges: 1}},
		{"multi_scanner", func(c *rangeCounter) Store { return multiScanOnly{c} }, calls{scanManys: 1}},
		{"plain_store", func(c *rangeCounter) Store { return c }, calls{scans: int64(len(ranges))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			counter := &rangeCounter{Store: s}
			store := c.store(counter)
			got, err := readRanges(t.Context(), store, ranges...)
			require.NoError(t, err)
			require.Len(t, got, len(ranges))
			for i := range ranges {
				assert.Equal(t, want[i], nonNilRows(got[i]), "range %+v", ranges[i])
			}
			assert.Equal(t, c.calls, calls{counter.scans.Load(), counter.scanManys.Load(), counter.ranges.Load()})

			counter.scans.Store(0)
			counter.scanManys.Store(0)
			counter.ranges.Store(0)
			got, err = readRanges(t.Context(), store, bad...)
			require.ErrorIs(t, err, ErrInvalidArgument)
			assert.Nil(t, got)
			if c.name == "range_reader" {
				assert.Equal(t, calls{ranges: 1}, calls{counter.scans.Load(), counter.scanManys.Load(), counter.ranges.Load()}, "the store refuses it")
			} else {
				assert.Equal(t, calls{}, calls{counter.scans.Load(), counter.scanManys.Load(), counter.ranges.Load()}, "refused before any read")
			}

			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			_, err = readRanges(ctx, store, ranges...)
			require.ErrorIs(t, err, context.Canceled)
			var se *StorageError
			assert.True(t, errors.As(err, &se), "%T: %v", err, err)
		})
	}
}
