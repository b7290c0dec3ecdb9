package runlease

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// decodeRow parses a stored row exactly as the reference does with
// serde_json::from_str::<LeaseRow>, the struct being #[serde(default)]:
//
//   - The row is one JSON object, or one JSON array of at most three
//     elements read as holder, fence and until_ms in that order (serde_json
//     reads a struct from either), between optional whitespace (space, tab,
//     CR, LF). Anything else after it is an error.
//   - Missing fields are zero. Unknown fields are ignored, but their values
//     must be valid JSON, of any depth. A known field given twice is an
//     error; keys are compared after their escapes are decoded.
//   - holder must be a string. Its escapes, and those of the object's keys,
//     must be valid: a \u escape of a UTF-16 surrogate must be half of a
//     pair written as two escapes.
//   - fence must be an integer in [0, 2^64-1] and until_ms one in
//     [-2^63, 2^63-1], written without a fraction, an exponent, leading
//     zeros or a '+', and not as -0 (serde_json reads -0 as a float). null
//     is refused for every field.
//   - Strings hold no raw control characters, and the row is valid UTF-8.
//
// The caller turns the error into a [CorruptRowError]; a row that does not
// parse is never treated as free.
func decodeRow(raw string) (leaseRow, error) {
	if r, ok := decodeCanonicalRow(raw); ok {
		return r, nil
	}
	return decodeRowSlow(raw)
}

// decodeCanonicalRow reads the rows [leaseRow.encode] writes, when the
// holder needs no escapes: the common case, read without allocating (the
// holder is a substring of raw). ok is false for anything else, which
// [decodeRowSlow] then decides; every row this accepts, the slow path reads
// the same way.
func decodeCanonicalRow(raw string) (r leaseRow, ok bool) {
	const head, mid, tail = `{"holder":"`, `","fence":`, `,"until_ms":`
	s, found := strings.CutPrefix(raw, head)
	if !found {
		return r, false
	}
	end := 0
	for end < len(s) && s[end] != '"' {
		if s[end] == '\\' || s[end] < 0x20 {
			return r, false
		}
		end++
	}
	if end == len(s) || !utf8.ValidString(s[:end]) {
		return r, false
	}
	r.Holder = s[:end]
	if s, found = strings.CutPrefix(s[end:], mid); !found {
		return r, false
	}
	fence, n, ok := scanDigits(s)
	if !ok {
		return r, false
	}
	r.Fence = fence
	if s, found = strings.CutPrefix(s[n:], tail); !found {
		return r, false
	}
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	mag, n, ok := scanDigits(s)
	if !ok || s[n:] != "}" {
		return r, false
	}
	if r.UntilMS, ok = signed(mag, neg); !ok {
		return r, false
	}
	return r, true
}

// scanDigits reads the decimal integer at the start of s, written as JSON
// writes one: "0", or a nonzero digit and more digits. It returns its value
// and length; ok is false when s does not start with one or it exceeds
// 2^64-1. The caller checks what follows.
func scanDigits(s string) (v uint64, n int, ok bool) {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, 0, false
	}
	if s[0] == '0' {
		return 0, 1, len(s) == 1 || s[1] < '0' || s[1] > '9'
	}
	for n < len(s) && '0' <= s[n] && s[n] <= '9' {
		d := uint64(s[n] - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, 0, false
		}
		v = v*10 + d
		n++
	}
	return v, n, true
}

// signed returns the int64 of magnitude mag and sign neg, as serde_json
// reads an i64: in range, and never -0.
func signed(mag uint64, neg bool) (int64, bool) {
	switch {
	case !neg && mag <= math.MaxInt64:
		return int64(mag), true
	case neg && mag != 0 && mag <= 1<<63:
		return int64(-mag), true // two's complement: -(1<<63) wraps to MinInt64
	}
	return 0, false
}

// decodeRowSlow is decodeRow for any input: a strict parser that follows
// serde_json's rules step by step.
func decodeRowSlow(raw string) (leaseRow, error) {
	var r leaseRow
	if !utf8.ValidString(raw) {
		return r, errors.New("not valid UTF-8")
	}
	p := &rowParser{s: raw}
	p.space()
	var err error
	switch c, _ := p.peek(); c {
	case '{':
		err = p.object(&r)
	case '[':
		err = p.array(&r)
	default:
		err = p.errorf("want a JSON object")
	}
	if err != nil {
		return leaseRow{}, err
	}
	if p.space(); p.i != len(p.s) {
		return leaseRow{}, p.errorf("trailing characters after the row")
	}
	return r, nil
}

// rowFields are the names of leaseRow's fields, in the order of the
// reference's struct (and of its array form).
var rowFields = [3]string{"holder", "fence", "until_ms"}

// object reads the object form of a row into r. The parser is at '{'.
func (p *rowParser) object(r *leaseRow) error {
	p.i++
	var seen [3]bool
	for first := true; ; first = false {
		p.space()
		c, ok := p.peek()
		switch {
		case !ok:
			return p.errorf("unterminated object")
		case c == '}':
			p.i++
			return nil
		case !first && c != ',':
			return p.errorf("want ',' or '}' after a field")
		case !first:
			p.i++
			p.space()
			if c, _ = p.peek(); c == '}' {
				return p.errorf("trailing comma in the object")
			}
		}
		if c, _ = p.peek(); c != '"' {
			return p.errorf("want a field name")
		}
		key, err := p.str(true)
		if err != nil {
			return err
		}
		if p.space(); !p.eat(':') {
			return p.errorf("want ':' after a field name")
		}
		field := -1
		for i, name := range rowFields {
			if key == name {
				field = i
			}
		}
		if field < 0 {
			if err := p.skipValue(); err != nil {
				return err
			}
			continue
		}
		if seen[field] {
			return p.errorf("duplicate field %s", rowFields[field])
		}
		seen[field] = true
		if err := p.field(field, r); err != nil {
			return err
		}
	}
}

// array reads the array form of a row into r: up to three elements, the
// fields in order, missing ones zero. The parser is at '['.
func (p *rowParser) array(r *leaseRow) error {
	p.i++
	for field := range rowFields {
		p.space()
		c, ok := p.peek()
		if !ok {
			return p.errorf("unterminated array")
		}
		if c == ']' {
			break
		}
		if field > 0 {
			if c != ',' {
				return p.errorf("want ',' or ']' after an element")
			}
			p.i++
			p.space()
			if c, _ = p.peek(); c == ']' {
				return p.errorf("trailing comma in the array")
			}
		}
		if err := p.field(field, r); err != nil {
			return err
		}
	}
	p.space()
	if !p.eat(']') {
		return p.errorf("want ']' after at most three elements")
	}
	return nil
}

// field reads the value of field number i (of rowFields) into r.
func (p *rowParser) field(i int, r *leaseRow) error {
	p.space()
	c, _ := p.peek()
	switch i {
	case 0:
		if c != '"' {
			return p.errorf("holder: want a string")
		}
		s, err := p.str(true)
		r.Holder = s
		return err
	case 1:
		if c == '-' {
			return p.errorf("fence: want an integer in [0, 2^64-1]")
		}
		v, err := p.integer(rowFields[i])
		r.Fence = v
		return err
	}
	neg := p.eat('-')
	mag, err := p.integer(rowFields[i])
	if err != nil {
		return err
	}
	v, ok := signed(mag, neg)
	if !ok {
		return p.errorf("until_ms: want an integer in [-2^63, 2^63-1] other than -0")
	}
	r.UntilMS = v
	return nil
}

// integer reads the digits of an integer field named name, refusing leading
// zeros, overflow, fractions and exponents (serde_json reads those as
// floats, which no integer field accepts).
func (p *rowParser) integer(name string) (uint64, error) {
	v, n, ok := scanDigits(p.s[p.i:])
	if !ok {
		return 0, p.errorf("%s: want an integer in range", name)
	}
	p.i += n
	if c, _ := p.peek(); c == '.' || c == 'e' || c == 'E' || ('0' <= c && c <= '9') {
		return 0, p.errorf("%s: want an integer, not a float or leading zeros", name)
	}
	return v, nil
}

// rowParser is a cursor over a row being decoded.
type rowParser struct {
	s string
	i int
}

func (p *rowParser) errorf(format string, a ...any) error {
	return fmt.Errorf("offset %d: %s", p.i, fmt.Sprintf(format, a...))
}

// peek returns the byte at the cursor; ok is false at the end.
func (p *rowParser) peek() (c byte, ok bool) {
	if p.i == len(p.s) {
		return 0, false
	}
	return p.s[p.i], true
}

// eat consumes c if it is at the cursor.
func (p *rowParser) eat(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// space skips JSON whitespace.
func (p *rowParser) space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}
