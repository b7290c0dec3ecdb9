package runlease

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRowEncodingMatchesSerde(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		row  leaseRow
		want string
	}{
		{leaseRow{"A", 1, 61000}, `{"holder":"A","fence":1,"until_ms":61000}`},
		{leaseRow{"", 0, 0}, `{"holder":"","fence":0,"until_ms":0}`},
		{leaseRow{"x", math.MaxUint64, math.MinInt64}, `{"holder":"x","fence":18446744073709551615,"until_ms":-9223372036854775808}`},
		{leaseRow{"\b\f\n\r\t\x00\x1f\x7f", 2, 3}, `{"holder":"\b\f\n\r\t\u0000\u001f` + "\x7f" + `","fence":2,"until_ms":3}`},
		{leaseRow{"<>&\u2028\u2029é😀", 2, 3}, `{"holder":"<>&` + "\u2028\u2029é😀" + `","fence":2,"until_ms":3}`},
	} {
		assert.Equal(t, tc.want, tc.row.encode())
		got, err := decodeRow(tc.want)
		require.NoError(t, err)
		assert.Equal(t, tc.row, got)
	}
}

// FuzzRowCodec checks that every row round-trips, that the encoding is valid
// JSON that a standard decoder reads the same way, and that decoding never
// panics on hostile input.
func FuzzRowCodec(f *testing.F) {
	f.Add("A#node/1", uint64(1), int64(61000), `{"holder":"A","fence":1,"until_ms":61000}`)
	f.Add("", uint64(0), int64(0), `{}`)
	f.Add("\x00\x1f\"\\", uint64(math.MaxUint64), int64(math.MinInt64), `{"fence":-1}`)
	f.Add("\u2028<>&", uint64(7), int64(-1), `{"holder":null}`)
	f.Add("\xff", uint64(3), int64(3), "{\"holder\":\"\xff\"}")
	f.Add("é", uint64(1), int64(1), `{"fence":1e3,"until_ms":1.0}`)
	f.Add("x", uint64(1), int64(1), `[{"holder":"a"}]`)
	f.Fuzz(func(t *testing.T, holder string, fence uint64, until int64, raw string) {
		if utf8.ValidString(holder) {
			row := leaseRow{holder, fence, until}
			enc := row.encode()
			got, err := decodeRow(enc)
			if err != nil || got != row {
				t.Fatalf("round trip of %#v: %#v, %v (encoded %q)", row, got, err, enc)
			}
			var std struct {
				Holder  string `json:"holder"`
				Fence   uint64 `json:"fence"`
				UntilMS int64  `json:"until_ms"`
			}
			if err := json.Unmarshal([]byte(enc), &std); err != nil || std.Holder != holder || std.Fence != fence || std.UntilMS != until {
				t.Fatalf("encoding/json reads %q as %+v, %v", enc, std, err)
			}
		}
		if got, err := decodeRow(raw); err == nil {
			again, err := decodeRow(got.encode())
			if err != nil || again != got {
				t.Fatalf("decoded %q to %#v, which does not round-trip: %#v, %v", raw, got, again, err)
			}
		}
	})
}

// rowCases are rows and how serde_json::from_str reads them as the
// reference's #[serde(default)] LeaseRow: the row, or corrupt (ok false).
var rowCases = []struct {
	name string
	raw  string
	ok   bool
	want leaseRow
}{
	{"the_canonical_row_is_read", `{"holder":"A","fence":1,"until_ms":61000}`, true, leaseRow{"A", 1, 61000}},
	{"fields_may_come_in_any_order", `{"until_ms":-5,"holder":"B","fence":2}`, true, leaseRow{"B", 2, -5}},
	{"missing_fields_are_zero", `{}`, true, leaseRow{}},
	{"a_missing_holder_is_empty", `{"fence":3,"until_ms":4}`, true, leaseRow{"", 3, 4}},
	{"whitespace_around_everything_is_fine", " \t\r\n{ \"holder\" : \"a\" , \"fence\" :1 }\n\t\r ", true, leaseRow{"a", 1, 0}},
	{"unknown_fields_are_ignored", `{"holder":"a","v":2,"x":{"y":[1,-0.5e+10,true,false,null,"\ud800"]}}`, true, leaseRow{"a", 0, 0}},
	{"an_unknown_field_may_repeat", `{"x":1,"x":2}`, true, leaseRow{}},
	{"an_unknown_field_may_be_minus_zero_or_huge", `{"x":-0,"y":1e999,"z":123456789012345678901234567890}`, true, leaseRow{}},
	{"an_escaped_key_names_its_field", `{"\u0068older":"a","f\u0065nce":2}`, true, leaseRow{"a", 2, 0}},
	{"escapes_in_the_holder_are_decoded", `{"holder":"\"\\\/\b\f\n\r\t\u0000\u00e9\ud83d\ude00"}`, true, leaseRow{"\"\\/\b\f\n\r\t\x00é😀", 0, 0}},
	{"the_largest_fence_is_read", `{"fence":18446744073709551615}`, true, leaseRow{Fence: math.MaxUint64}},
	{"the_extreme_until_values_are_read", `{"until_ms":-9223372036854775808}`, true, leaseRow{UntilMS: math.MinInt64}},
	{"the_largest_until_is_read", `{"until_ms":9223372036854775807}`, true, leaseRow{UntilMS: math.MaxInt64}},
	{"zero_is_a_fence", `{"fence":0,"until_ms":0}`, true, leaseRow{}},
	{"the_array_form_is_read_in_field_order", `["A",1,61000]`, true, leaseRow{"A", 1, 61000}},
	{"a_short_array_leaves_the_rest_zero", `[ "A" ]`, true, leaseRow{"A", 0, 0}},
	{"an_empty_array_is_the_zero_row", `[]`, true, leaseRow{}},
	{"a_deeply_nested_unknown_value_is_skipped", `{"x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, true, leaseRow{}},

	{"a_duplicate_holder_field_is_corrupt", `{"holder":"a","holder":"b"}`, false, leaseRow{}},
	{"a_duplicate_written_with_an_escape_is_corrupt", `{"holder":"a","hold\u0065r":"a"}`, false, leaseRow{}},
	{"a_duplicate_fence_is_corrupt", `{"fence":1,"fence":1}`, false, leaseRow{}},
	{"a_duplicate_until_is_corrupt", `{"until_ms":1,"until_ms":1}`, false, leaseRow{}},
	{"a_lone_high_surrogate_is_corrupt", `{"holder":"\ud800"}`, false, leaseRow{}},
	{"a_lone_low_surrogate_is_corrupt", `{"holder":"\udc00"}`, false, leaseRow{}},
	{"a_high_surrogate_before_a_character_is_corrupt", `{"holder":"\ud800x"}`, false, leaseRow{}},
	{"two_high_surrogates_are_corrupt", `{"holder":"\ud800\ud800"}`, false, leaseRow{}},
	{"a_swapped_pair_is_corrupt", `{"holder":"\ude00\ud83d"}`, false, leaseRow{}},
	{"a_lone_surrogate_in_a_key_is_corrupt", `{"\ud800":1}`, false, leaseRow{}},
	{"minus_zero_is_not_a_fence", `{"fence":-0}`, false, leaseRow{}},
	{"minus_zero_is_not_an_until", `{"until_ms":-0}`, false, leaseRow{}},
	{"a_negative_fence_is_corrupt", `{"fence":-1}`, false, leaseRow{}},
	{"an_exponent_is_not_an_integer", `{"fence":1e3}`, false, leaseRow{}},
	{"a_capital_exponent_is_not_an_integer", `{"until_ms":1E3}`, false, leaseRow{}},
	{"a_fraction_is_not_an_integer", `{"until_ms":1.0}`, false, leaseRow{}},
	{"a_zero_fraction_is_not_a_fence", `{"fence":0.0}`, false, leaseRow{}},
	{"a_leading_zero_is_corrupt", `{"fence":01}`, false, leaseRow{}},
	{"a_double_zero_is_corrupt", `{"until_ms":-00}`, false, leaseRow{}},
	{"a_plus_sign_is_corrupt", `{"fence":+1}`, false, leaseRow{}},
	{"a_fence_past_uint64_is_corrupt", `{"fence":18446744073709551616}`, false, leaseRow{}},
	{"an_until_past_int64_is_corrupt", `{"until_ms":9223372036854775808}`, false, leaseRow{}},
	{"an_until_below_int64_is_corrupt", `{"until_ms":-9223372036854775809}`, false, leaseRow{}},
	{"a_null_holder_is_corrupt", `{"holder":null}`, false, leaseRow{}},
	{"a_null_fence_is_corrupt", `{"fence":null}`, false, leaseRow{}},
	{"a_null_until_is_corrupt", `{"until_ms":null}`, false, leaseRow{}},
	{"a_number_holder_is_corrupt", `{"holder":7}`, false, leaseRow{}},
	{"a_string_fence_is_corrupt", `{"fence":"1"}`, false, leaseRow{}},
	{"a_boolean_until_is_corrupt", `{"until_ms":true}`, false, leaseRow{}},
	{"an_invalid_unknown_value_is_corrupt", `{"x":01}`, false, leaseRow{}},
	{"a_misspelt_literal_is_corrupt", `{"x":tru}`, false, leaseRow{}},
	{"a_trailing_comma_in_an_unknown_value_is_corrupt", `{"x":[1,]}`, false, leaseRow{}},
	{"an_invalid_escape_in_an_unknown_value_is_corrupt", `{"x":"\q"}`, false, leaseRow{}},
	{"a_short_unicode_escape_is_corrupt", `{"x":"\u12"}`, false, leaseRow{}},
	{"a_bare_key_is_corrupt", `{fence:1}`, false, leaseRow{}},
	{"a_missing_comma_is_corrupt", `{"holder":"a" "fence":1}`, false, leaseRow{}},
	{"a_trailing_comma_is_corrupt", `{"fence":1,}`, false, leaseRow{}},
	{"a_raw_control_character_is_corrupt", "{\"holder\":\"a\nb\"}", false, leaseRow{}},
	{"trailing_characters_are_corrupt", `{"holder":"a"} trailing`, false, leaseRow{}},
	{"a_second_object_is_corrupt", `{}{}`, false, leaseRow{}},
	{"a_trailing_comma_after_the_row_is_corrupt", `{},`, false, leaseRow{}},
	{"an_unterminated_row_is_corrupt", `{"holder":"a"`, false, leaseRow{}},
	{"an_array_of_four_is_corrupt", `["A",1,2,3]`, false, leaseRow{}},
	{"a_trailing_comma_in_the_array_is_corrupt", `["A",1,]`, false, leaseRow{}},
	{"an_array_element_of_the_wrong_type_is_corrupt", `[1]`, false, leaseRow{}},
	{"an_object_inside_the_array_is_corrupt", `[{"holder":"a"}]`, false, leaseRow{}},
	{"null_is_corrupt", `null`, false, leaseRow{}},
	{"a_string_is_corrupt", `"text"`, false, leaseRow{}},
	{"a_number_is_corrupt", `7`, false, leaseRow{}},
	{"nothing_is_corrupt", ``, false, leaseRow{}},
	{"whitespace_alone_is_corrupt", " \n", false, leaseRow{}},
	{"a_byte_order_mark_is_corrupt", "\ufeff{}", false, leaseRow{}},
	{"invalid_UTF8_is_corrupt", "{\"holder\":\"\xff\"}", false, leaseRow{}},
	{"invalid_UTF8_in_an_unknown_value_is_corrupt", "{\"x\":\"\xff\"}", false, leaseRow{}},
}

func TestRowDecodingFollowsSerde(t *testing.T) {
	t.Parallel()
	for _, tc := range rowCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := decodeRow(tc.raw)
			if !tc.ok {
				require.Error(t, err, "decoded as %#v", got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestReferenceDecoderFollowsSerde holds the fuzz target's reference
// decoder to the same cases, so that the two are checked against the rules
// and not only against each other.
func TestReferenceDecoderFollowsSerde(t *testing.T) {
	t.Parallel()
	for _, tc := range rowCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := referenceDecodeRow(tc.raw)
			if errors.Is(err, errTooDeep) {
				t.Skip("deeper than encoding/json reads")
			}
			if !tc.ok {
				require.Error(t, err, "decoded as %#v", got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// FuzzRowDecode holds decodeRow to referenceDecodeRow, an independent
// statement of serde_json's rules: both accept the same rows and read them
// the same way, the canonical fast path agrees with the general parser,
// and every row read re-encodes to a row read the same way.
//
// Run it with: go test -run '^$' -fuzz '^FuzzRowDecode$' -fuzztime 30s .
func FuzzRowDecode(f *testing.F) {
	for _, tc := range rowCases {
		if len(tc.raw) < 1000 {
			f.Add(tc.raw)
		}
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := decodeRow(raw)
		want, werr := referenceDecodeRow(raw)
		if errors.Is(werr, errTooDeep) {
			t.Skip()
		}
		if (err == nil) != (werr == nil) || got != want {
			t.Fatalf("decodeRow(%q) = %#v, %v; the reference reads %#v, %v", raw, got, err, want, werr)
		}
		if fast, ok := decodeCanonicalRow(raw); ok {
			slow, err := decodeRowSlow(raw)
			if err != nil || slow != fast {
				t.Fatalf("fast path reads %q as %#v; the parser as %#v, %v", raw, fast, slow, err)
			}
		}
		if err == nil {
			again, err := decodeRow(got.encode())
			if err != nil || again != got {
				t.Fatalf("decoded %q to %#v, which does not round-trip: %#v, %v", raw, got, again, err)
			}
		}
	})
}

// BenchmarkDecodeRow measures reading a row: the canonical form our encoder
// writes (the fast path, which allocates nothing) and the same row in a
// form only the general parser reads.
func BenchmarkDecodeRow(b *testing.B) {
	for _, bc := range []struct{ name, raw string }{
		{"canonical", leaseRow{"billing#worker-7/4121/9f86d081884c7d65", 42, 1767225600000}.encode()},
		{"spaced_and_escaped", `{ "holder" : "billing#worker-7\/4121", "fence" : 42, "until_ms" : 1767225600000 }`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeRow(bc.raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// referenceDecodeRow is an independent statement of serde_json's rules for
// the reference's #[serde(default)] LeaseRow, for FuzzRowDecode to hold
// decodeRow to. It is built on encoding/json's token stream, which checks
// JSON's grammar (control characters, escapes, number syntax, commas), and
// adds what encoding/json does not check or decides otherwise: duplicate
// known fields, surrogate pairs in the holder and in keys (encoding/json
// replaces a lone surrogate with U+FFFD), integer syntax and range, the
// array form, and invalid UTF-8 (which encoding/json also replaces). One
// difference remains and is reported as errTooDeep: encoding/json refuses
// values nested more than 10,000 deep, which serde_json skips in an unknown
// field.
func referenceDecodeRow(raw string) (leaseRow, error) {
	var r leaseRow
	if !utf8.ValidString(raw) {
		return r, errors.New("not UTF-8")
	}
	d := &refDecoder{raw: raw, dec: json.NewDecoder(strings.NewReader(raw))}
	d.dec.UseNumber()
	tok, err := d.token()
	if err != nil {
		return r, err
	}
	switch tok {
	case json.Delim('{'):
		err = d.object(&r)
	case json.Delim('['):
		err = d.array(&r)
	default:
		err = fmt.Errorf("top-level %v", tok)
	}
	if err != nil {
		return leaseRow{}, err
	}
	if tok, err := d.dec.Token(); err != io.EOF {
		return leaseRow{}, fmt.Errorf("after the row: %v, %v", tok, err)
	}
	return r, nil
}

var errTooDeep = errors.New("nested deeper than encoding/json reads")

type refDecoder struct {
	raw  string
	dec  *json.Decoder
	last int64 // input offset after the previous token
}

// token returns the next token and, through d.last, where it ended.
func (d *refDecoder) token() (json.Token, error) {
	tok, err := d.dec.Token()
	if err != nil && strings.Contains(err.Error(), "exceeded max depth") {
		err = errTooDeep
	}
	return tok, err
}

// rawString returns the source text of the string token just read: the
// first quote after the end of the token before it, up to where it ended.
func (d *refDecoder) rawString(prev int64) string {
	span := d.raw[prev:d.dec.InputOffset()]
	return span[strings.IndexByte(span, '"'):]
}

func (d *refDecoder) object(r *leaseRow) error {
	seen := map[string]bool{}
	for {
		prev := d.dec.InputOffset()
		tok, err := d.token()
		if err != nil {
			return err
		}
		if tok == json.Delim('}') {
			return nil
		}
		key := tok.(string) // encoding/json refuses any other key
		if err := pairedSurrogates(d.rawString(prev)); err != nil {
			return fmt.Errorf("key: %w", err)
		}
		i, known := map[string]int{"holder": 0, "fence": 1, "until_ms": 2}[key]
		if !known {
			var skip json.RawMessage
			if err := d.dec.Decode(&skip); err != nil {
				if strings.Contains(err.Error(), "exceeded max depth") {
					return errTooDeep
				}
				return err
			}
			continue
		}
		if seen[key] {
			return fmt.Errorf("duplicate %s", key)
		}
		seen[key] = true
		if err := d.field(i, r); err != nil {
			return err
		}
	}
}

func (d *refDecoder) array(r *leaseRow) error {
	for i := 0; i < 3 && d.dec.More(); i++ {
		if err := d.field(i, r); err != nil {
			return err
		}
	}
	if tok, err := d.token(); err != nil || tok != json.Delim(']') {
		return fmt.Errorf("want the array's end, got %v, %v", tok, err)
	}
	return nil
}

var (
	unsignedText = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)
	signedText   = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)
)

// field reads field i: 0 holder, 1 fence, 2 until_ms.
func (d *refDecoder) field(i int, r *leaseRow) error {
	prev := d.dec.InputOffset()
	tok, err := d.token()
	if err != nil {
		return err
	}
	if i == 0 {
		s, ok := tok.(string)
		if !ok {
			return fmt.Errorf("holder %v", tok)
		}
		r.Holder = s
		return pairedSurrogates(d.rawString(prev))
	}
	n, ok := tok.(json.Number)
	if !ok {
		return fmt.Errorf("field %d: %v", i, tok)
	}
	if i == 1 {
		if !unsignedText.MatchString(string(n)) {
			return fmt.Errorf("fence %s", n)
		}
		r.Fence, err = strconv.ParseUint(string(n), 10, 64)
		return err
	}
	if !signedText.MatchString(string(n)) || n == "-0" {
		return fmt.Errorf("until_ms %s", n)
	}
	r.UntilMS, err = strconv.ParseInt(string(n), 10, 64)
	return err
}

// pairedSurrogates checks the \u escapes of the quoted JSON string q: an
// escaped high surrogate must be followed at once by an escaped low one,
// and a low one must follow a high one.
func pairedSurrogates(q string) error {
	var units []rune // -1 for anything that is not a \u escape
	for i := 1; i < len(q)-1; i++ {
		switch {
		case q[i] != '\\':
			units = append(units, -1)
		case q[i+1] == 'u':
			v, _ := strconv.ParseUint(q[i+2:i+6], 16, 16)
			units = append(units, rune(v))
			i += 5
		default:
			units = append(units, -1)
			i++
		}
	}
	for k := 0; k < len(units); k++ {
		u := units[k]
		if !utf16.IsSurrogate(u) {
			continue
		}
		if u >= 0xdc00 || k+1 == len(units) || units[k+1] < 0xdc00 || units[k+1] > 0xdfff {
			return fmt.Errorf("unpaired surrogate %U", u)
		}
		k++
	}
	return nil
}
