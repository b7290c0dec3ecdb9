package storetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// testRanges checks the optional [runlease.RangeReader] capability, when
// the store has it: each range returns what a MetaScan of its prefix
// returns, without the keys up to and including After, cut after Limit
// rows, in byte order, and bad input is refused before anything is read.
// The admission queue reads the head of a scope's queue with it, so a
// store that gets it wrong lets waiters in out of turn. A store without it
// has nothing to check here: the library reads it with scans.
func testRanges(t *testing.T, newStore newStoreFunc) {
	if _, ok := newStore(t).(runlease.RangeReader); !ok {
		return
	}
	with := withCapability[runlease.RangeReader](newStore)
	t.Run("each_range_returns_its_prefix's_scan_after_After_cut_at_Limit", with(testRangesOracle))
	t.Run("a_range_of_a_large_prefix_reads_on_to_its_limit_or_its_end", with(testRangesLarge))
	t.Run("ranges_of_one_call_each_return_their_own_rows_in_the_order_asked", with(testRangesMany))
	t.Run("bad_input_is_refused_before_anything_is_read", with(testRangesBadInput))
	t.Run("an_ended_context_fails_with_a_StorageError_that_matches_it", with(testRangesEndedContext))
	t.Run("a_closed_store_refuses_ranges_with_ErrStoreClosed", with(testRangesClosed))
}

// cutRows is the model of a range: the rows of its prefix's scan (in byte
// order) whose key is greater than r.After, at most r.Limit of them when
// r.Limit is positive. It never returns nil.
func cutRows(scanned []runlease.Row, r runlease.Range) []runlease.Row {
	out := []runlease.Row{}
	for _, row := range scanned {
		if row.Key > r.After {
			out = append(out, row)
		}
	}
	if r.Limit > 0 && len(out) > r.Limit {
		out = out[:r.Limit]
	}
	return out
}

// requireRanges reads ranges in calls of at most MaxScanMany each and
// checks every result against the model, from scans of the prefixes.
func requireRanges(t *testing.T, s runlease.Store, rr runlease.RangeReader, ranges []runlease.Range) {
	t.Helper()
	scans := map[string][]runlease.Row{}
	for _, r := range ranges {
		if _, ok := scans[r.Prefix]; !ok {
			scans[r.Prefix] = scan(t, s, r.Prefix)
		}
	}
	for len(ranges) > 0 {
		call := ranges[:min(len(ranges), runlease.MaxScanMany)]
		ranges = ranges[len(call):]
		got, err := rr.MetaRanges(t.Context(), call)
		require.NoError(t, err, "MetaRanges(%+v)", call)
		require.Len(t, got, len(call), "MetaRanges(%+v) returns one list per range", call)
		for i, r := range call {
			require.Equal(t, cutRows(scans[r.Prefix], r), nonNil(got[i]), "MetaRanges: range %d of the call, %+v", i, r)
		}
	}
}

// rangeAfters returns the After keys worth reading prefix p from, when the
// prefix holds rows: none, one below the prefix, the prefix itself, every
// key it holds (each excluded) and a text just after each, one inside it
// that no key has, its end, and keys past it.
func rangeAfters(p string, rows []runlease.Row) []string {
	afters := []string{"", "!", p, p + "é", p + "\U0010FFFF", "\U0010FFFF\U0010FFFF\U0010FFFF"}
	if p != "" {
		afters = append(afters, p[:len(p)-1]) // may cut a rune: After is any text
	}
	if end, ok := runlease.PrefixEnd(p); ok {
		afters = append(afters, end, end+"a")
	}
	for _, row := range rows {
		afters = append(afters, row.Key, row.Key+" ")
	}
	var valid []string
	for _, a := range afters {
		if runlease.CheckRanges([]runlease.Range{{After: a}}) == nil {
			valid = append(valid, a)
		}
	}
	return valid
}

// testRangesOracle reads every oracle prefix from every After worth trying
// (see rangeAfters) with limits of none, 1, 2, 3 and the prefix's size and
// one more: the keys hold '%', '_', ':', quotes, backslashes, multi-byte
// text and U+10FFFF, so a range built on a pattern, on UTF-16 order or on
// a collation other than byte order returns other rows.
func testRangesOracle(t *testing.T, s runlease.Store, rr runlease.RangeReader) {
	fill(t, s, shuffled(oracleKeys))
	var ranges []runlease.Range
	for _, p := range oraclePrefixes() {
		rows := scan(t, s, p)
		require.Equal(t, rowsWithPrefix(oracleKeys, p), rows, "MetaScan(%q), the model of its ranges", p)
		for _, after := range rangeAfters(p, rows) {
			for _, limit := range []int{0, 1, 2, 3, len(rows), len(rows) + 1} {
				ranges = append(ranges, runlease.Range{Prefix: p, After: after, Limit: limit})
			}
		}
	}
	requireRanges(t, s, rr, ranges)
	t.Logf("%d ranges of %d prefixes", len(ranges), len(oraclePrefixes()))
}

// testRangesLarge reads a prefix of largeRows rows, with neighbours on both
// sides, whole and in heads of a few rows, from its start and from keys
// inside it, with limits below and above the page sizes stores like. When
// the store wakes subscribers with rows of its own (a DeleteNotifier), the
// prefix and its first keys are rung first, so that a store whose wake-ups
// are rows it skips still returns exactly Limit rows.
func testRangesLarge(t *testing.T, s runlease.Store, rr runlease.RangeReader) {
	const p = "head/"
	var keys []string
	for i := range largeRows {
		keys = append(keys, p+strconv.Itoa(i))
	}
	outside := []string{"head", "head.", "head0", "heac/1", "heae", "headx/1"}
	fill(t, s, append(shuffled(keys), outside...))
	sorted := sortedRows(keys)
	if n, ok := s.(runlease.DeleteNotifier); ok {
		for i, wake := range []string{p, sorted[0].Key, sorted[1].Key, sorted[3].Key, sorted[700].Key} {
			k := fmt.Sprintf("ring/%d", i)
			create(t, s, k, "v")
			deleted, err := n.MetaDeleteNotify(t.Context(), k, "v", wake)
			require.NoError(t, err, "MetaDeleteNotify(%q, wake %q)", k, wake)
			require.True(t, deleted)
		}
	}
	var ranges []runlease.Range
	for _, after := range []string{"", "a", p, sorted[0].Key, sorted[2].Key, sorted[698].Key, sorted[largeRows-2].Key, "heae"} {
		for _, limit := range []int{0, 1, 2, 8, 100, 499, 500, 501, 1000, largeRows} {
			ranges = append(ranges, runlease.Range{Prefix: p, After: after, Limit: limit})
		}
	}
	requireRanges(t, s, rr, ranges)
	got, err := rr.MetaRanges(t.Context(), []runlease.Range{{Prefix: p}})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Len(t, got[0], largeRows, "MetaRanges of %q without a limit returns every row", p)
	assert.Equal(t, sorted, got[0])
	requireRanges(t, s, rr, []runlease.Range{{Prefix: "", Limit: 3}, {Prefix: "", After: "heac/1", Limit: 3}, {Prefix: "hea"}, {Prefix: "head", Limit: 2}})
}

// testRangesMany reads several prefixes in one call, with a range repeated,
// ranges that contain each other, the empty prefix, and ranges that hold
// nothing (no such prefix, After past the prefix), checking each list
// against its own range.
func testRangesMany(t *testing.T, s runlease.Store, rr runlease.RangeReader) {
	fill(t, s, shuffled([]string{"q:a:1", "q:a:2", "q:a:3", "q:a;", "q:b:1", "q:b:2", "q:", "r", "p"}))
	call := []runlease.Range{
		{Prefix: "q:b:", Limit: 1},
		{Prefix: "q:a:", After: "q:a:1", Limit: 1},
		{Prefix: "q:a:", After: "q:a:1", Limit: 1},
		{Prefix: "q:"},
		{Prefix: "", Limit: 2},
		{Prefix: "none"},
		{Prefix: "q:a:", After: "q:a:3"},
		{Prefix: "q:a:", After: "q:b"},
		{Prefix: "q:a", Limit: 10},
	}
	requireRanges(t, s, rr, call)
	got, err := rr.MetaRanges(t.Context(), call)
	require.NoError(t, err)
	assert.Equal(t, [][]runlease.Row{
		{{Key: "q:b:1", Value: "v:q:b:1"}},
		{{Key: "q:a:2", Value: "v:q:a:2"}},
		{{Key: "q:a:2", Value: "v:q:a:2"}},
		sortedRows([]string{"q:a:1", "q:a:2", "q:a:3", "q:a;", "q:b:1", "q:b:2", "q:"}),
		{{Key: "p", Value: "v:p"}, {Key: "q:", Value: "v:q:"}},
		{},
		{},
		{},
		sortedRows([]string{"q:a:1", "q:a:2", "q:a:3", "q:a;"}),
	}, nonNilLists(got))
	full := make([]runlease.Range, runlease.MaxScanMany)
	for i := range full {
		full[i] = runlease.Range{Prefix: "q:a:", After: fmt.Sprintf("q:a:%d", i%4), Limit: i % 3}
	}
	requireRanges(t, s, rr, full)
	got, err = rr.MetaRanges(t.Context(), nil)
	require.NoError(t, err)
	assert.Empty(t, got, "no ranges, no lists")
}

// rangeCall is the ranges of one MetaRanges call, named.
type rangeCall struct {
	name   string
	ranges []runlease.Range
}

// testRangesBadInput makes calls whose last range is invalid, after a valid
// one: each is refused as a whole with ErrInvalidArgument, and returns no
// rows, not even those of the valid range.
func testRangesBadInput(t *testing.T, s runlease.Store, rr runlease.RangeReader) {
	want := seedRows(t, s)
	valid := runlease.Range{Prefix: "seed/"}
	tooMany := make([]runlease.Range, runlease.MaxScanMany+1)
	for i := range tooMany {
		tooMany[i] = valid
	}
	calls := []rangeCall{
		{"more_than_MaxScanMany_ranges", tooMany},
		{"a_negative_limit", []runlease.Range{valid, {Prefix: "seed/", Limit: -1}}},
		{"an_after_key_one_byte_over_MaxKeyLen", []runlease.Range{valid, {Prefix: "seed/", After: strings.Repeat("a", runlease.MaxKeyLen+1)}}},
		{"a_prefix_one_byte_over_MaxKeyLen", []runlease.Range{valid, {Prefix: strings.Repeat("s", runlease.MaxKeyLen+1)}}},
	}
	for _, p := range badPrefixes {
		calls = append(calls,
			rangeCall{"a_prefix_" + p.name, []runlease.Range{valid, {Prefix: p.text}}},
			rangeCall{"an_after_key_" + p.name, []runlease.Range{valid, {Prefix: "seed/", After: p.text}}})
	}
	for _, c := range calls {
		got, err := rr.MetaRanges(t.Context(), c.ranges)
		requireInvalid(t, s, want, err, "MetaRanges with "+c.name)
		assert.Nil(t, got, "MetaRanges with %s returns no rows", c.name)
	}
	// The longest After there is, and MaxScanMany ranges, are valid.
	maxAfter := strings.Repeat("\U0010FFFF", runlease.MaxKeyLen/4)
	full := make([]runlease.Range, runlease.MaxScanMany)
	for i := range full {
		full[i] = runlease.Range{Prefix: "seed/", After: []string{"", maxAfter, "seed/1"}[i%3]}
	}
	requireRanges(t, s, rr, full)
}

// testRangesEndedContext calls MetaRanges on contexts that ended before the
// call: it fails with a *StorageError that matches the context's error,
// whose outcome is known, and is no invalid argument.
func testRangesEndedContext(t *testing.T, s runlease.Store, rr runlease.RangeReader) {
	seedRows(t, s)
	for _, c := range endedContexts {
		for _, ranges := range [][]runlease.Range{{{Prefix: "seed/"}}, {{Prefix: "seed/", Limit: 1}, {Prefix: ""}}} {
			ctx := c.ctx(t)
			got, err := rr.MetaRanges(ctx, ranges)
			require.ErrorIs(t, err, c.want, "MetaRanges on a %s context", c.name)
			var se *runlease.StorageError
			assert.True(t, errors.As(err, &se), "MetaRanges on a %s context: a fault must be a *runlease.StorageError, got %T: %v", c.name, err, err)
			assert.False(t, runlease.IsOutcomeUnknown(err), "MetaRanges on a %s context: a read has a known outcome", c.name)
			assert.False(t, errors.Is(err, runlease.ErrInvalidArgument), "MetaRanges on a %s context", c.name)
			assert.Nil(t, got)
		}
	}
	_, err := rr.MetaRanges(context.Background(), []runlease.Range{{Prefix: "seed/"}})
	require.NoError(t, err, "the store still reads once the contexts have ended")
}

// testRangesClosed closes the store, when it can be closed, and calls
// MetaRanges on it.
func testRangesClosed(t *testing.T, s runlease.Store, rr runlease.RangeReader) {
	c, ok := s.(io.Closer)
	if !ok {
		return // nothing to close
	}
	seedRows(t, s)
	require.NoError(t, c.Close())
	got, err := rr.MetaRanges(t.Context(), []runlease.Range{{Prefix: "seed/", Limit: 1}})
	require.ErrorIs(t, err, runlease.ErrStoreClosed)
	assert.Nil(t, got)
}

// nonNilLists is nonNil for each list of lists.
func nonNilLists(lists [][]runlease.Row) [][]runlease.Row {
	out := make([][]runlease.Row, len(lists))
	for i, l := range lists {
		out[i] = nonNil(l)
	}
	return out
}
