package storetest

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// orderKeys sort differently in byte order than under a locale collation
// (case folded, accents ignored, punctuation skipped) or under UTF-16 order
// (where U+FFFF sorts after U+10000).
var orderKeys = []string{
	"B", "a", "Z", "é", "e", "a b", "a-b", "ab", "A", "aB", "Ab", "ä", "aa", "~", "ÿ",
	"中", "😀", "\uFFFF", "\U00010000", "\U0010FFFF", "e\u0301", "1", "10", "9", " ",
}

// oracleKeys hold every character a LIKE pattern, an escape or a quoting bug
// could trip on, with multi-byte text and the code points at the ends of
// UTF-8's ranges.
var oracleKeys = []string{
	"a", "a%", "a%b", "a_", "a_b", "ab", "aB", "A", "Ab", "a\\", "a\\b", "a\\%", "a\\_",
	"%", "%a", "%%", "_", "_a", "__", "\\", "\\\\", "\\a", "'", "'a'", "''", "\"", "\"q\"",
	"a b", "a-b", "a*", "a.b", "[a]", "a^", "?", "*", "é", "éa", "e", "e\u0301", "ü",
	"中", "中文", "😀", "😀x", "\uD7FF", "\uD7FFx", "\uE000", "\uFFFF", "\U00010000",
	"\U0010FFFF", "\U0010FFFFa", "\U0010FFFF\U0010FFFF", "a\U0010FFFF", "a\U0010FFFFb",
	"b", "\x7f", "\u0080", "run:1", "run:10", "run:1:x", "run;", "runlease:x", "runslot:mem:0",
}

// extraPrefixes match none, some or all of oracleKeys in ways a string
// pattern would get wrong.
var extraPrefixes = []string{
	"", "a%", "a_", "a\\", "%", "_", "\\", "'", "\"", "z", "[", "^", ".", "*", "ø", "E",
	"a%b%", "a_b_", "%%%", "\U0010FFFF\U0010FFFF\U0010FFFF", "a\U0010FFFF\U0010FFFF",
	"\uD7FF\U0010FFFF", "run", "run:", "run:1", "'; DROP TABLE runlease_meta; --",
}

func testScan(t *testing.T, newStore newStoreFunc) {
	t.Run("a_scan_of_an_empty_store_returns_no_rows", parallel(newStore, func(t *testing.T, s runlease.Store) {
		assert.Empty(t, scan(t, s, ""))
		assert.Empty(t, scan(t, s, "a"))
	}))

	t.Run("scan_returns_rows_in_ascending_byte_order", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for _, k := range shuffled(orderKeys) {
			create(t, s, k, "v:"+k)
		}
		want := sortedRows(orderKeys)
		assert.Equal(t, want, scan(t, s, ""), "the empty prefix returns every row, in byte order")
		// The same order must hold inside a prefix.
		assert.Equal(t, rowsWithPrefix(orderKeys, "a"), scan(t, s, "a"))
	}))

	t.Run("a_prefix_is_literal_and_matches_exactly_the_keys_that_start_with_it", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for _, k := range shuffled(oracleKeys) {
			create(t, s, k, "v:"+k)
		}
		for _, p := range oraclePrefixes() {
			assert.Equal(t, rowsWithPrefix(oracleKeys, p), scan(t, s, p), "MetaScan(%q)", p)
		}
	}))

	t.Run("a_scan_sees_every_committed_write_and_delete", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "p/1", "a")
		create(t, s, "p/2", "b")
		require.True(t, cas(t, s, "p/1", ptr("a"), "a2"))
		deleted, err := s.MetaDelete(t.Context(), "p/2", "b")
		require.NoError(t, err)
		require.True(t, deleted)
		create(t, s, "p/3", "c")
		assert.Equal(t, []runlease.Row{{Key: "p/1", Value: "a2"}, {Key: "p/3", Value: "c"}}, scan(t, s, "p/"))
	}))

	t.Run("a_scan_returns_every_row_of_a_large_prefix", parallel(newStore, testLargeScan))
}

// largeRows is how many rows testLargeScan puts under one prefix: well
// above the page sizes stores and their drivers like (100, 1,000), so that a
// scan that stops after a page is caught.
const largeRows = 1500

// testLargeScan scans a prefix of largeRows rows, with neighbours on both
// sides of it that must not be returned. The keys are decimal numbers, not
// padded, so byte order differs from insertion order and numeric order.
func testLargeScan(t *testing.T, s runlease.Store) {
	var keys []string
	for i := range largeRows {
		keys = append(keys, "big/"+strconv.Itoa(i))
	}
	outside := []string{"big", "big.", "big0", "bif/1", "bih", "bigx/1"}
	fill(t, s, append(shuffled(keys), outside...))
	rows := scan(t, s, "big/")
	require.Len(t, rows, largeRows, "MetaScan(%q) must return every row of the prefix", "big/")
	assert.Equal(t, sortedRows(keys), rows, "MetaScan(%q)", "big/")
	assert.Equal(t, sortedRows(append(keys, outside...)), scan(t, s, ""), "the empty prefix returns every row")
	assert.Equal(t, rowsWithPrefix(keys, "big/1"), scan(t, s, "big/1"), "MetaScan(%q)", "big/1")
}

// fill creates every key of keys, absent before, with the value "v:"+key,
// in as few calls as the store's capabilities allow.
func fill(t *testing.T, s runlease.Store, keys []string) {
	t.Helper()
	if m, ok := s.(runlease.MultiCASer); ok {
		for chunk := range slices.Chunk(keys, runlease.MaxMultiCAS) {
			writes := make([]runlease.CASWrite, len(chunk))
			for i, k := range chunk {
				writes[i] = runlease.CASWrite{Key: k, Value: "v:" + k}
			}
			swapped, err := m.MetaCASMany(t.Context(), writes)
			require.NoError(t, err, "MetaCASMany of %d new keys", len(writes))
			require.NotContains(t, swapped, false, "MetaCASMany of %d new keys", len(writes))
		}
		return
	}
	if b, ok := s.(runlease.Batcher); ok {
		for chunk := range slices.Chunk(keys, runlease.MaxBatch) {
			ops := make([]runlease.Op, len(chunk))
			for i, k := range chunk {
				ops[i] = runlease.Put(k, "v:"+k)
			}
			require.True(t, batch(t, b, nil, ops...), "a batch without conditions applies")
		}
		return
	}
	for _, k := range keys {
		create(t, s, k, "v:"+k)
	}
}

// oraclePrefixes returns every rune-aligned prefix of every oracle key, and
// the extra prefixes, without duplicates.
func oraclePrefixes() []string {
	seen := map[string]bool{}
	var out []string
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, k := range oracleKeys {
		for i := range k {
			add(k[:i])
		}
		add(k)
	}
	for _, p := range extraPrefixes {
		add(p)
	}
	for _, p := range out {
		if !utf8.ValidString(p) {
			panic("storetest: oracle prefix " + p + " is not valid UTF-8")
		}
	}
	return out
}

// rowsWithPrefix is the oracle: the rows MetaScan(prefix) must return when
// the store holds keys, each with the value "v:"+key.
func rowsWithPrefix(keys []string, prefix string) []runlease.Row {
	var match []string
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			match = append(match, k)
		}
	}
	return sortedRows(match)
}

// sortedRows returns the rows for keys in byte order (Go compares strings
// bytewise), each with the value "v:"+key. It never returns nil.
func sortedRows(keys []string) []runlease.Row {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	rows := make([]runlease.Row, 0, len(sorted))
	for _, k := range sorted {
		rows = append(rows, runlease.Row{Key: k, Value: "v:" + k})
	}
	return rows
}

// shuffled returns keys in a random order, so a store that returns rows in
// insertion order is caught.
func shuffled(keys []string) []string {
	out := slices.Clone(keys)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
