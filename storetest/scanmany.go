package storetest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// testScanMany checks the optional [runlease.MultiScanner] capability, when
// the store has it: each prefix returns exactly what MetaScan of it would,
// in the order asked, and bad input is refused before anything is read.
// Claims of slots and waiters read a scope's slots, queue and fair-share
// marks with it, so a store that gets it wrong breaks the limit.
func testScanMany(t *testing.T, newStore newStoreFunc) {
	with := withCapability[runlease.MultiScanner](newStore)
	t.Run("each_prefix_returns_what_its_own_scan_returns", with(testScanManyOracle))
	t.Run("large_prefixes_are_returned_whole", with(testScanManyLarge))
	t.Run("bad_input_is_refused_before_anything_is_read", with(testScanManyBadInput))
}

// testScanManyOracle asks for every prefix of the oracle keys, in groups
// as large as a call takes, with a prefix repeated, prefixes that contain
// each other and the empty one in the same call.
func testScanManyOracle(t *testing.T, s runlease.Store, m runlease.MultiScanner) {
	for _, k := range shuffled(oracleKeys) {
		create(t, s, k, "v:"+k)
	}
	prefixes := oraclePrefixes()
	for len(prefixes) > 0 {
		n := min(len(prefixes), runlease.MaxScanMany-2)
		group := append([]string{prefixes[0], ""}, prefixes[:n]...) // repeated, and the empty prefix
		prefixes = prefixes[n:]
		got, err := m.MetaScanMany(t.Context(), group)
		require.NoError(t, err)
		require.Len(t, got, len(group), "MetaScanMany(%q) returns one list per prefix", group)
		for i, p := range group {
			assert.Equal(t, rowsWithPrefix(oracleKeys, p), nonNil(got[i]), "MetaScanMany(%q)[%d], the prefix %q", group, i, p)
		}
	}
	got, err := m.MetaScanMany(t.Context(), nil)
	require.NoError(t, err)
	assert.Empty(t, got, "no prefixes, no lists")
	got, err = m.MetaScanMany(t.Context(), []string{"no such prefix"})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Empty(t, got[0])
}

// testScanManyLarge scans two prefixes of largeRows rows each, and one
// between them, in one call: a store that pages the call as a whole, or
// each prefix, must still return every row.
func testScanManyLarge(t *testing.T, s runlease.Store, m runlease.MultiScanner) {
	var a, b []string
	for i := range largeRows {
		a = append(a, "many/a/"+strconv.Itoa(i))
		b = append(b, "many/b/"+strconv.Itoa(i))
	}
	mid := []string{"many/a0", "many/a/", "many/b"}
	fill(t, s, shuffled(append(append(append([]string{}, a...), b...), mid...)))
	got, err := m.MetaScanMany(t.Context(), []string{"many/b/", "many/a", "many/a/"})
	require.NoError(t, err)
	require.Len(t, got, 3)
	assert.Equal(t, sortedRows(b), got[0], "MetaScanMany: %q", "many/b/")
	assert.Equal(t, rowsWithPrefix(append(append([]string{}, a...), mid...), "many/a"), got[1], "MetaScanMany: %q", "many/a")
	assert.Equal(t, rowsWithPrefix(append(a, "many/a/"), "many/a/"), got[2], "MetaScanMany: %q", "many/a/")
}

func testScanManyBadInput(t *testing.T, s runlease.Store, m runlease.MultiScanner) {
	create(t, s, "k", "v")
	tooMany := make([]string, runlease.MaxScanMany+1)
	for _, prefixes := range [][]string{
		tooMany,
		{"k", "bad\x00prefix"},
		{"k", strings.Repeat("p", runlease.MaxKeyLen+1)},
		{"\xff\xfe"},
	} {
		got, err := m.MetaScanMany(t.Context(), prefixes)
		assert.ErrorIs(t, err, runlease.ErrInvalidArgument, "MetaScanMany(%d prefixes, %.20q…)", len(prefixes), prefixes[len(prefixes)-1])
		assert.Nil(t, got)
	}
	requireValue(t, s, "k", "v")
}

// nonNil returns rows, or an empty list for nil, so that "no rows" compares
// equal however a store says it.
func nonNil(rows []runlease.Row) []runlease.Row {
	if rows == nil {
		return []runlease.Row{}
	}
	return rows
}
