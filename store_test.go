package runlease_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

type checkCase struct {
	name  string
	input string
	ok    bool
}

// invalidText is refused as a key, a value and a prefix alike.
var invalidText = []checkCase{
	{"nul", "a\x00b", false},
	{"only_nul", "\x00", false},
	{"invalid_byte", "a\xffb", false},
	{"utf8_encoded_surrogate", "\xed\xa0\x80", false},
	{"overlong_encoding_of_nul", "\xc0\x80", false},
	{"truncated_sequence", "a\xe2\x82", false},
	{"lone_continuation_byte", "\x80", false},
	{"beyond_U+10FFFF", "\xf4\x90\x80\x80", false},
}

// validText is accepted as a key, a value and a prefix alike.
var validText = []checkCase{
	{"ascii", "runlease:run-1", true},
	{"sql_and_like_metacharacters", `%_\'"`, true},
	{"multi_byte", "é中😀", true},
	{"highest_code_point", "\U0010FFFF", true},
	{"noncharacter", "\uFFFE", true},
	{"control_characters_other_than_nul", "\x01\t\n\x7f", true},
}

func TestCheckKey(t *testing.T) {
	t.Parallel()
	cases := []checkCase{
		{"empty", "", false},
		{"MaxKeyLen_ascii_bytes", strings.Repeat("k", runlease.MaxKeyLen), true},
		{"MaxKeyLen_bytes_of_four_byte_runes", strings.Repeat("😀", runlease.MaxKeyLen/4), true},
		{"one_byte_over_MaxKeyLen", strings.Repeat("k", runlease.MaxKeyLen+1), false},
		{"multi_byte_one_byte_over_MaxKeyLen", strings.Repeat("é", runlease.MaxKeyLen/2) + "k", false},
	}
	runChecks(t, "key", runlease.CheckKey, append(append(cases, validText...), invalidText...))
}

func TestCheckValue(t *testing.T) {
	t.Parallel()
	cases := []checkCase{
		{"empty", "", true},
		{"MaxValueLen_bytes", strings.Repeat("v", runlease.MaxValueLen), true},
		{"one_byte_over_MaxValueLen", strings.Repeat("v", runlease.MaxValueLen+1), false},
	}
	runChecks(t, "value", runlease.CheckValue, append(append(cases, validText...), invalidText...))
}

func TestCheckPrefix(t *testing.T) {
	t.Parallel()
	cases := []checkCase{
		{"empty", "", true},
		{"MaxKeyLen_bytes", strings.Repeat("p", runlease.MaxKeyLen), true},
		{"one_byte_over_MaxKeyLen", strings.Repeat("p", runlease.MaxKeyLen+1), false},
	}
	runChecks(t, "prefix", runlease.CheckPrefix, append(append(cases, validText...), invalidText...))
}

func runChecks(t *testing.T, arg string, check func(string) error, cases []checkCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := check(tc.input)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			var argErr *runlease.ArgumentError
			require.ErrorAs(t, err, &argErr)
			assert.Equal(t, arg, argErr.Arg)
			assert.Equal(t, runlease.CodeInvalidArgument, runlease.Code(err))
			assert.True(t, strings.HasPrefix(err.Error(), runlease.CodeInvalidArgument+": "), "message %q starts with the code", err)
			assert.True(t, utf8.ValidString(err.Error()), "the message quotes nothing raw: %q", err)
		})
	}
}

func TestPrefixEnd(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, prefix, end string
		ok                bool
	}{
		{"empty_has_no_end", "", "", false},
		{"ascii", "a", "b", true},
		{"last_byte_carries_into_a_longer_encoding", "\x7f", "\u0080", true},
		{"two_byte_to_three_byte", "\u07FF", "\u0800", true},
		{"three_byte_to_four_byte", "\uFFFF", "\U00010000", true},
		{"skips_the_surrogates", "\uD7FF", "\uE000", true},
		{"skips_the_surrogates_after_a_stem", "a\uD7FF", "a\uE000", true},
		{"highest_code_point_alone_has_no_end", "\U0010FFFF", "", false},
		{"only_highest_code_points_have_no_end", "\U0010FFFF\U0010FFFF", "", false},
		{"highest_code_point_carries", "a\U0010FFFF", "b", true},
		{"several_highest_code_points_carry", "z\U0010FFFF\U0010FFFF", "{", true},
		{"carry_into_the_surrogate_gap", "\uD7FF\U0010FFFF", "\uE000", true},
		{"percent_is_literal", "a%", "a&", true},
		{"underscore_is_literal", "a_", "a`", true},
		{"backslash_is_literal", "a\\", "a]", true},
		{"multi_byte", "runslot:é", "runslot:ê", true},
		{"lease_namespace", "runlease:", "runlease;", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			end, ok := runlease.PrefixEnd(tc.prefix)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.end, end)
		})
	}
}

// TestPrefixEndBoundsExactlyThePrefixedKeys checks the property MetaScan
// relies on, over every string of up to three runes drawn from an alphabet
// of boundary code points: a key starts with prefix exactly when it lies in
// [prefix, PrefixEnd(prefix)).
func TestPrefixEndBoundsExactlyThePrefixedKeys(t *testing.T) {
	t.Parallel()
	alphabet := []string{"a", "b", "%", "_", "\\", "\x7f", "\u0080", "\u07FF", "\uD7FF", "\uE000", "\uFFFF", "\U00010000", "\U0010FFFF"}
	keys := stringsUpTo(alphabet, 3)
	for _, prefix := range stringsUpTo(alphabet, 2) {
		end, bounded := runlease.PrefixEnd(prefix)
		for _, key := range keys {
			has := strings.HasPrefix(key, prefix)
			inRange := key >= prefix && (!bounded || key < end)
			if has != inRange {
				t.Fatalf("prefix %q, end %q (bounded %v), key %q: has prefix %v, in range %v",
					prefix, end, bounded, key, has, inRange)
			}
		}
	}
}

// stringsUpTo returns every concatenation of at most n elements of alphabet.
func stringsUpTo(alphabet []string, n int) []string {
	out := []string{""}
	layer := []string{""}
	for range n {
		var next []string
		for _, s := range layer {
			for _, r := range alphabet {
				next = append(next, s+r)
			}
		}
		out = append(out, next...)
		layer = next
	}
	return out
}

func FuzzPrefixEnd(f *testing.F) {
	for _, seed := range []struct{ prefix, suffix string }{
		{"", ""},
		{"\U0010FFFF", "\U0010FFFF"},
		{"a\U0010FFFF", "\U0010FFFF\U0010FFFF"},
		{"\uD7FF", "x"},
		{"\uD7FF\U0010FFFF", ""},
		{"%", "%"},
		{"_", "_"},
		{"\\", "\\\\"},
		{"é中😀", "\U0010FFFF"},
		{"\x7f", "\u0080"},
		{"runlease:", "run-1"},
		{"\xff", ""},
	} {
		f.Add(seed.prefix, seed.suffix)
	}
	f.Fuzz(func(t *testing.T, prefix, suffix string) {
		end, ok := runlease.PrefixEnd(prefix)
		if !utf8.ValidString(prefix) {
			return // outside PrefixEnd's domain; it must merely not panic
		}
		if !ok {
			if strings.Trim(prefix, "\U0010FFFF") != "" {
				t.Fatalf("PrefixEnd(%q) has no end, but the prefix has a rune below U+10FFFF", prefix)
			}
			return
		}
		if !utf8.ValidString(end) {
			t.Fatalf("PrefixEnd(%q) = %q, not valid UTF-8", prefix, end)
		}
		if end <= prefix {
			t.Fatalf("PrefixEnd(%q) = %q, not above the prefix", prefix, end)
		}
		if strings.HasPrefix(end, prefix) {
			t.Fatalf("PrefixEnd(%q) = %q starts with the prefix", prefix, end)
		}
		for _, s := range []string{"", "\x00", "a", "\U0010FFFF", "\U0010FFFF\U0010FFFF", strings.Repeat("\U0010FFFF", 64), suffix} {
			if prefix+s >= end {
				t.Fatalf("PrefixEnd(%q) = %q, not above the key %q", prefix, end, prefix+s)
			}
		}
		requireLeastEnd(t, prefix, end)
	})
}

// requireLeastEnd checks that end is the least string above every string
// with prefix: a stem of prefix, then the successor of prefix's next rune,
// where every rune of prefix after that one is U+10FFFF.
func requireLeastEnd(t *testing.T, prefix, end string) {
	last, size := utf8.DecodeLastRuneInString(end)
	stem := end[:len(end)-size]
	if !strings.HasPrefix(prefix, stem) || len(stem) == len(prefix) {
		t.Fatalf("PrefixEnd(%q) = %q: %q is not a proper stem of the prefix", prefix, end, stem)
	}
	rest := prefix[len(stem):]
	r, size := utf8.DecodeRuneInString(rest)
	want := r + 1
	if r == 0xD7FF {
		want = 0xE000
	}
	if last != want {
		t.Fatalf("PrefixEnd(%q) = %q: last rune %U is not the successor of %U", prefix, end, last, r)
	}
	if strings.Trim(rest[size:], "\U0010FFFF") != "" {
		t.Fatalf("PrefixEnd(%q) = %q: dropped runes %q that are not all U+10FFFF", prefix, end, rest[size:])
	}
}
