package runlease

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

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
