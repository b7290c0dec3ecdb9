package storetest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

type namedText struct{ name, text string }

var (
	badKeys = []namedText{
		{"empty", ""},
		{"with_nul", "a\x00b"},
		{"only_nul", "\x00"},
		{"invalid_utf8", "a\xffb"},
		{"utf8_encoded_surrogate", "\xed\xa0\x80"},
		{"overlong_utf8_nul", "\xc0\x80"},
		{"truncated_utf8", "a\xe2\x82"},
		{"one_byte_over_MaxKeyLen", strings.Repeat("k", runlease.MaxKeyLen+1)},
		{"multi_byte_one_byte_over_MaxKeyLen", strings.Repeat("é", runlease.MaxKeyLen/2) + "k"},
	}
	badValues = []namedText{
		{"with_nul", "v\x00"},
		{"invalid_utf8", "v\xff"},
		{"one_byte_over_MaxValueLen", sizedText(runlease.MaxValueLen + 1)},
	}
	badPrefixes = []namedText{
		{"with_nul", "a\x00"},
		{"only_nul", "\x00"},
		{"invalid_utf8", "\xff"},
		{"truncated_utf8", "a\xe2\x82"},
	}
	// maxKeys are exactly MaxKeyLen bytes long, built of characters of each
	// UTF-8 length, so a limit counted in characters or UTF-16 units is caught.
	maxKeys = []namedText{
		{"ascii", strings.Repeat("k", runlease.MaxKeyLen)},
		{"two_byte", strings.Repeat("é", runlease.MaxKeyLen/2)},
		{"three_byte", strings.Repeat("中", runlease.MaxKeyLen/3) + strings.Repeat("k", runlease.MaxKeyLen%3)},
		{"four_byte", strings.Repeat("😀", runlease.MaxKeyLen/4)},
	}
)

// seedRows puts two rows in s and returns them, so that a test can check the
// store is unchanged.
func seedRows(t *testing.T, s runlease.Store) []runlease.Row {
	t.Helper()
	create(t, s, "seed/1", "one")
	create(t, s, "seed/2", "two")
	return []runlease.Row{{Key: "seed/1", Value: "one"}, {Key: "seed/2", Value: "two"}}
}

// requireInvalid fails t unless err matches runlease.ErrInvalidArgument and
// the store still holds exactly want.
func requireInvalid(t *testing.T, s runlease.Store, want []runlease.Row, err error, call string) {
	t.Helper()
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, call)
	require.Equal(t, want, scan(t, s, ""), "%s must leave the store unchanged", call)
}

func testBadInput(t *testing.T, newStore newStoreFunc) {
	t.Run("an_invalid_key_is_refused_by_every_method_and_changes_nothing", parallel(newStore, func(t *testing.T, s runlease.Store) {
		want := seedRows(t, s)
		for _, k := range badKeys {
			_, _, err := s.MetaGet(t.Context(), k.text)
			requireInvalid(t, s, want, err, "MetaGet of key "+k.name)
			_, err = s.MetaCAS(t.Context(), k.text, nil, "v")
			requireInvalid(t, s, want, err, "MetaCAS(nil) of key "+k.name)
			_, err = s.MetaCAS(t.Context(), k.text, ptr("one"), "v")
			requireInvalid(t, s, want, err, "MetaCAS(expected) of key "+k.name)
			_, err = s.MetaDelete(t.Context(), k.text, "one")
			requireInvalid(t, s, want, err, "MetaDelete of key "+k.name)
		}
	}))

	t.Run("an_invalid_value_is_refused_and_changes_nothing", parallel(newStore, func(t *testing.T, s runlease.Store) {
		want := seedRows(t, s)
		for _, v := range badValues {
			_, err := s.MetaCAS(t.Context(), "new", nil, v.text)
			requireInvalid(t, s, want, err, "MetaCAS creating value "+v.name)
			// The condition holds, so only the check can stop the write.
			_, err = s.MetaCAS(t.Context(), "seed/1", ptr("one"), v.text)
			requireInvalid(t, s, want, err, "MetaCAS swapping to value "+v.name)
		}
	}))

	t.Run("an_invalid_prefix_is_refused", parallel(newStore, func(t *testing.T, s runlease.Store) {
		want := seedRows(t, s)
		for _, p := range badPrefixes {
			rows, err := s.MetaScan(t.Context(), p.text)
			requireInvalid(t, s, want, err, "MetaScan of prefix "+p.name)
			assert.Empty(t, rows)
		}
	}))

	t.Run("a_prefix_longer_than_MaxKeyLen_is_refused_or_matches_nothing", parallel(newStore, func(t *testing.T, s runlease.Store) {
		seedRows(t, s)
		rows, err := s.MetaScan(t.Context(), strings.Repeat("s", runlease.MaxKeyLen+1))
		if err != nil {
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
		}
		assert.Empty(t, rows)
	}))

	t.Run("an_invalid_expected_value_is_refused_or_never_matches", parallel(newStore, func(t *testing.T, s runlease.Store) {
		want := seedRows(t, s)
		for _, v := range badValues {
			ok, err := s.MetaCAS(t.Context(), "seed/1", ptr(v.text), "v")
			if err != nil {
				require.ErrorIs(t, err, runlease.ErrInvalidArgument, "MetaCAS expecting value %s", v.name)
			}
			assert.False(t, ok)
			ok, err = s.MetaDelete(t.Context(), "seed/1", v.text)
			if err != nil {
				require.ErrorIs(t, err, runlease.ErrInvalidArgument, "MetaDelete expecting value %s", v.name)
			}
			assert.False(t, ok)
			require.Equal(t, want, scan(t, s, ""))
		}
	}))

	t.Run("a_key_of_exactly_MaxKeyLen_bytes_round_trips", parallel(newStore, func(t *testing.T, s runlease.Store) {
		for _, k := range maxKeys {
			require.Len(t, k.text, runlease.MaxKeyLen, k.name)
			create(t, s, k.text, k.name)
			requireValue(t, s, k.text, k.name)
			assert.Equal(t, []runlease.Row{{Key: k.text, Value: k.name}}, scan(t, s, k.text), k.name)
			deleted, err := s.MetaDelete(t.Context(), k.text, k.name)
			require.NoError(t, err)
			assert.True(t, deleted, k.name)
		}
	}))

	t.Run("a_value_of_exactly_MaxValueLen_bytes_round_trips", parallel(newStore, func(t *testing.T, s runlease.Store) {
		v := sizedText(runlease.MaxValueLen)
		create(t, s, "big", v)
		got, found := get(t, s, "big")
		require.True(t, found)
		require.True(t, got == v, "the %d-byte value came back changed (%d bytes)", len(v), len(got))
		assert.True(t, cas(t, s, "big", &v, "small"))
	}))
}
