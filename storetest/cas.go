package storetest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

func testGetAndCAS(t *testing.T, newStore newStoreFunc) {
	t.Run("get_of_an_absent_key_is_not_found_and_not_an_error", parallel(newStore, func(t *testing.T, s runlease.Store) {
		v, found, err := s.MetaGet(t.Context(), "absent")
		require.NoError(t, err)
		assert.False(t, found)
		assert.Empty(t, v)
	}))

	t.Run("cas_with_nil_expected_creates_an_absent_key", parallel(newStore, func(t *testing.T, s runlease.Store) {
		require.True(t, cas(t, s, "k", nil, "v1"))
		requireValue(t, s, "k", "v1")
	}))

	t.Run("cas_with_nil_expected_on_a_present_key_is_false_and_keeps_the_value", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "k", "v1")
		assert.False(t, cas(t, s, "k", nil, "v2"))
		requireValue(t, s, "k", "v1")
	}))

	t.Run("cas_with_nil_expected_on_a_key_holding_the_empty_value_is_false", parallel(newStore, func(t *testing.T, s runlease.Store) {
		// A store that confuses "absent" with "empty" would let a second
		// creator overwrite a row.
		create(t, s, "k", "")
		assert.False(t, cas(t, s, "k", nil, "v2"))
		requireValue(t, s, "k", "")
	}))

	t.Run("cas_with_the_exact_expected_value_swaps", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "k", "v1")
		require.True(t, cas(t, s, "k", ptr("v1"), "v2"))
		requireValue(t, s, "k", "v2")
		require.True(t, cas(t, s, "k", ptr("v2"), "v3"), "a second swap from the value just written")
		requireValue(t, s, "k", "v3")
	}))

	t.Run("cas_with_a_wrong_expected_value_is_false_and_keeps_the_value", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "k", "value")
		// Near misses catch stores that compare loosely: by prefix, by LIKE,
		// ignoring case or trailing spaces, or treating "" as absent.
		for _, wrong := range []string{"other", "valu", "value ", " value", "VALUE", "value\n", "val_e", "val%", ""} {
			assert.False(t, cas(t, s, "k", ptr(wrong), "overwritten"), "expected %q must not match %q", wrong, "value")
			requireValue(t, s, "k", "value")
		}
	}))

	t.Run("cas_with_an_expected_value_on_an_absent_key_is_false_and_creates_nothing", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for _, expected := range []string{"v1", ""} {
			assert.False(t, cas(t, s, "k", ptr(expected), "v2"), "expected %q on an absent key", expected)
			requireAbsent(t, s, "k")
		}
		assert.Empty(t, scan(t, s, ""))
	}))

	t.Run("cas_writing_the_value_already_present_swaps", parallel(newStore, func(t *testing.T, s runlease.Store) {
		// Some databases report zero affected rows for an UPDATE that
		// changes nothing; the condition held, so the answer is true.
		create(t, s, "k", "same")
		assert.True(t, cas(t, s, "k", ptr("same"), "same"))
		requireValue(t, s, "k", "same")
		create(t, s, "empty", "")
		assert.True(t, cas(t, s, "empty", ptr(""), ""))
		requireValue(t, s, "empty", "")
	}))

	t.Run("keys_differing_only_in_case_spacing_or_normalization_are_distinct_rows", parallel(newStore, func(t *testing.T, s runlease.Store) {
		keys := []string{"k", "K", "k ", " k", "k\t", "\u00e9", "e\u0301", "\uFB01", "fi"}
		for _, k := range keys {
			create(t, s, k, "value of "+k)
		}
		for _, k := range keys {
			requireValue(t, s, k, "value of "+k)
		}
		assert.Len(t, scan(t, s, ""), len(keys))
	}))

	t.Run("writes_to_one_key_leave_other_keys_alone", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "a", "1")
		create(t, s, "ab", "2")
		create(t, s, "b", "3")
		require.True(t, cas(t, s, "a", ptr("1"), "1'"))
		deleted, err := s.MetaDelete(t.Context(), "b", "3")
		require.NoError(t, err)
		require.True(t, deleted)
		assert.Equal(t, []runlease.Row{{Key: "a", Value: "1'"}, {Key: "ab", Value: "2"}}, scan(t, s, ""))
	}))
}

func testDelete(t *testing.T, newStore newStoreFunc) {
	t.Run("delete_with_the_exact_value_removes_the_row", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "k", "v1")
		deleted, err := s.MetaDelete(t.Context(), "k", "v1")
		require.NoError(t, err)
		assert.True(t, deleted)
		requireAbsent(t, s, "k")
		assert.Empty(t, scan(t, s, ""))
	}))

	t.Run("delete_with_a_wrong_value_is_false_and_keeps_the_row", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "k", "value")
		for _, wrong := range []string{"other", "valu", "value ", "VALUE", "val_e", "val%", ""} {
			deleted, err := s.MetaDelete(t.Context(), "k", wrong)
			require.NoError(t, err)
			assert.False(t, deleted, "expected %q must not match %q", wrong, "value")
			requireValue(t, s, "k", "value")
		}
	}))

	t.Run("delete_of_an_absent_key_is_false_and_not_an_error", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for _, expected := range []string{"v1", ""} {
			deleted, err := s.MetaDelete(t.Context(), "k", expected)
			require.NoError(t, err)
			assert.False(t, deleted, "delete with expected %q", expected)
		}
	}))

	t.Run("a_deleted_key_can_be_created_again", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "k", "v1")
		deleted, err := s.MetaDelete(t.Context(), "k", "v1")
		require.NoError(t, err)
		require.True(t, deleted)
		assert.False(t, cas(t, s, "k", ptr("v1"), "v2"), "a swap from the deleted value")
		create(t, s, "k", "v3")
		requireValue(t, s, "k", "v3")
	}))

	t.Run("the_empty_value_is_deleted_only_by_the_empty_expected_value", parallel(newStore, func(t *testing.T, s runlease.Store) {
		create(t, s, "k", "")
		deleted, err := s.MetaDelete(t.Context(), "k", " ")
		require.NoError(t, err)
		assert.False(t, deleted)
		deleted, err = s.MetaDelete(t.Context(), "k", "")
		require.NoError(t, err)
		assert.True(t, deleted)
		requireAbsent(t, s, "k")
	}))
}

// roundTripValues are values a store must return byte for byte: JSON that a
// JSON column would re-encode, text a normalizing or trimming store would
// change, and the awkward sizes.
func roundTripValues() []struct{ name, value string } {
	return []struct{ name, value string }{
		{"json_with_spacing_and_key_order", `{"b":1,  "a":2}`},
		{"json_lease_row", `{"holder":"alice#node/1","fence":7,"until_ms":1700000000000}`},
		{"json_with_duplicate_keys", `{"a":1,"a":2}`},
		{"json_with_escapes", `{"s":"\u00e9\n\"q\"","n":1.50,"e":1E3}`},
		{"leading_and_trailing_spaces", "  padded  "},
		{"only_whitespace", " \t\r\n "},
		{"crlf_line_endings", "one\r\ntwo\r\n"},
		{"multi_byte_utf8", "héllo wörld, 日本語, Ελληνικά, עברית"},
		{"emoji_with_modifiers", "😀👍🏽🇸🇪👩‍👩‍👧"},
		{"decomposed_accent_that_nfc_would_compose", "e\u0301"},
		{"byte_order_mark", "\uFEFFbom"},
		{"highest_code_point", "\U0010FFFF"},
		{"quotes", `it's "quoted" and 'single'`},
		{"backslashes", `C:\path\to\file \\ \n \0 \x00`},
		{"sql_metacharacters", `%_'; DROP TABLE runlease_meta; --`},
		{"words_a_driver_might_map_to_null", "NULL"},
		{"value_64KiB", sizedText(64 << 10)},
		{"empty", ""},
	}
}

func testValues(t *testing.T, newStore newStoreFunc) {
	t.Run("values_round_trip_byte_exact_and_compare_byte_exact", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for i, tc := range roundTripValues() {
			t.Run(tc.name, func(t *testing.T) {
				key := "value/" + tc.name
				create(t, s, key, tc.value)
				requireValue(t, s, key, tc.value)
				rows := scan(t, s, key)
				require.Len(t, rows, 1)
				assert.Equal(t, runlease.Row{Key: key, Value: tc.value}, rows[0], "MetaScan must return the value as written")
				// The stored form must compare equal to the bytes written, in
				// CAS and in delete alike.
				assert.True(t, cas(t, s, key, ptr(tc.value), tc.value), "CAS from the value just written (case %d)", i)
				deleted, err := s.MetaDelete(t.Context(), key, tc.value)
				require.NoError(t, err)
				assert.True(t, deleted, "delete with the value just written")
				requireAbsent(t, s, key)
			})
		}
	}))
}

// sizedText returns valid UTF-8 text of exactly n bytes that mixes one- to
// four-byte characters, quotes and backslashes.
func sizedText(n int) string {
	const unit = "é😀 \\\"{}x中"
	var b strings.Builder
	b.Grow(n)
	for b.Len()+len(unit) <= n {
		b.WriteString(unit)
	}
	b.WriteString(strings.Repeat("a", n-b.Len()))
	return b.String()
}
