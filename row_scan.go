package runlease

import (
	"unicode/utf8"
)

// str reads the JSON string at the cursor (which is at its opening quote)
// and returns its text, decoded. Without escapes the text is a substring of
// the row, so nothing is allocated. Raw control characters are refused.
// When strict, a \u escape of a UTF-16 surrogate must be the first half of
// a pair whose second half is the next escape, as serde_json requires of a
// String and of a key. Otherwise any four hex digits pass, as in the values
// serde_json skips, and the text of a string with escapes is not decoded:
// str returns "" for it.
func (p *rowParser) str(strict bool) (string, error) {
	p.i++
	start := p.i
	var buf []byte // the decoded text, once an escape is met
	escaped := false
	for {
		for p.i < len(p.s) && p.s[p.i] != '"' && p.s[p.i] != '\\' && p.s[p.i] >= 0x20 {
			p.i++
		}
		c, ok := p.peek()
		switch {
		case !ok:
			return "", p.errorf("unterminated string")
		case c == '"':
			p.i++
			switch {
			case !escaped:
				return p.s[start : p.i-1], nil
			case !strict:
				return "", nil
			}
			return string(append(buf, p.s[start:p.i-1]...)), nil
		case c < 0x20:
			return "", p.errorf("control character %#02x in a string", c)
		}
		escaped = true
		p.i++ // the backslash
		if !strict {
			if err := p.skipEscape(); err != nil {
				return "", err
			}
			continue
		}
		buf = append(buf, p.s[start:p.i-1]...)
		var err error
		if buf, err = p.escape(buf); err != nil {
			return "", err
		}
		start = p.i
	}
}

// skipEscape skips the escape after a backslash, checking only its syntax.
func (p *rowParser) skipEscape() error {
	c, ok := p.peek()
	if !ok {
		return p.errorf("unterminated string")
	}
	p.i++
	switch c {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return nil
	case 'u':
		_, err := p.hex4()
		return err
	}
	return p.errorf("invalid escape \\%c", c)
}

// escape decodes the escape after a backslash onto buf, requiring a \u
// escape of a UTF-16 surrogate to be half of a pair.
func (p *rowParser) escape(buf []byte) ([]byte, error) {
	c, ok := p.peek()
	if !ok {
		return buf, p.errorf("unterminated string")
	}
	p.i++
	switch c {
	case '"', '\\', '/':
		return append(buf, c), nil
	case 'b':
		return append(buf, '\b'), nil
	case 'f':
		return append(buf, '\f'), nil
	case 'n':
		return append(buf, '\n'), nil
	case 'r':
		return append(buf, '\r'), nil
	case 't':
		return append(buf, '\t'), nil
	case 'u':
	default:
		return buf, p.errorf("invalid escape \\%c", c)
	}
	u, err := p.hex4()
	if err != nil {
		return buf, err
	}
	switch {
	case 0xdc00 <= u && u <= 0xdfff:
		return buf, p.errorf("lone low surrogate \\u%04x", u)
	case u < 0xd800 || u > 0xdbff:
		return utf8.AppendRune(buf, rune(u)), nil
	}
	if !p.eat('\\') || !p.eat('u') {
		return buf, p.errorf("high surrogate \\u%04x not followed by a \\u escape", u)
	}
	lo, err := p.hex4()
	if err != nil {
		return buf, err
	}
	if lo < 0xdc00 || lo > 0xdfff {
		return buf, p.errorf("high surrogate \\u%04x followed by \\u%04x", u, lo)
	}
	return utf8.AppendRune(buf, 0x10000+(rune(u)-0xd800)<<10+(rune(lo)-0xdc00)), nil
}

// hex4 reads the four hex digits of a \u escape.
func (p *rowParser) hex4() (uint16, error) {
	if len(p.s)-p.i < 4 {
		p.i = len(p.s)
		return 0, p.errorf("unterminated \\u escape")
	}
	var u uint16
	for _, c := range []byte(p.s[p.i : p.i+4]) {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, p.errorf("invalid \\u escape")
		}
		u = u<<4 | uint16(d)
	}
	p.i += 4
	return u, nil
}

// skipValue skips one JSON value of any depth, checking its syntax as
// serde_json does for the value of a field it ignores: strings are checked
// for control characters and escapes but not for surrogate pairs, numbers
// for their grammar but not their range. It uses a stack of its own rather
// than recursion, so that no nesting exhausts the goroutine's stack.
func (p *rowParser) skipValue() error {
	var open []byte // the containers entered and not yet closed
	for {
		if err := p.skipScalarOrOpen(&open); err != nil {
			return err
		}
		// After a value (or an empty container): close what ends here,
		// then either a ',' leads to the next value or the value was the
		// field's whole value.
		for {
			if len(open) == 0 {
				return nil
			}
			p.space()
			top := open[len(open)-1]
			c, ok := p.peek()
			if !ok {
				return p.errorf("unterminated array or object")
			}
			if c == closer(top) {
				p.i++
				open = open[:len(open)-1]
				continue
			}
			if c != ',' {
				return p.errorf("want ',' or %q", closer(top))
			}
			p.i++
			if top == '{' {
				if err := p.skipKey(); err != nil {
					return err
				}
			}
			break
		}
	}
}

// skipScalarOrOpen skips one scalar, or enters an array or object: it
// pushes it onto open, or skips it whole when it is empty, and reads the
// first key of an object.
func (p *rowParser) skipScalarOrOpen(open *[]byte) error {
	for {
		p.space()
		c, ok := p.peek()
		if !ok {
			return p.errorf("want a value")
		}
		switch c {
		case '[', '{':
			p.i++
			p.space()
			if p.eat(closer(c)) {
				return nil
			}
			*open = append(*open, c)
			if c == '{' {
				if err := p.skipKey(); err != nil {
					return err
				}
			}
			continue // the container's first value
		case '"':
			_, err := p.str(false)
			return err
		case 'n':
			return p.literal("null")
		case 't':
			return p.literal("true")
		case 'f':
			return p.literal("false")
		}
		return p.skipNumber()
	}
}

// skipKey skips an object's key and the ':' after it.
func (p *rowParser) skipKey() error {
	p.space()
	if c, _ := p.peek(); c != '"' {
		return p.errorf("want a string as key")
	}
	if _, err := p.str(false); err != nil {
		return err
	}
	if p.space(); !p.eat(':') {
		return p.errorf("want ':' after a key")
	}
	return nil
}

func closer(open byte) byte {
	if open == '[' {
		return ']'
	}
	return '}'
}

// literal skips word, which must be at the cursor.
func (p *rowParser) literal(word string) error {
	if len(p.s)-p.i < len(word) || p.s[p.i:p.i+len(word)] != word {
		return p.errorf("want %s", word)
	}
	p.i += len(word)
	return nil
}

// skipNumber skips a number of any size, checking JSON's grammar: an
// optional '-', "0" or digits without a leading zero, an optional fraction
// with at least one digit, an optional exponent with at least one digit.
func (p *rowParser) skipNumber() error {
	p.eat('-')
	switch c, _ := p.peek(); {
	case c == '0':
		p.i++
		if c, _ = p.peek(); '0' <= c && c <= '9' {
			return p.errorf("leading zero in a number")
		}
	case '1' <= c && c <= '9':
		p.digits()
	default:
		return p.errorf("want a value")
	}
	if p.eat('.') && p.digits() == 0 {
		return p.errorf("want a digit after the decimal point")
	}
	if p.eat('e') || p.eat('E') {
		if !p.eat('+') {
			p.eat('-')
		}
		if p.digits() == 0 {
			return p.errorf("want a digit in the exponent")
		}
	}
	return nil
}

// digits skips decimal digits and says how many.
func (p *rowParser) digits() int {
	start := p.i
	for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
		p.i++
	}
	return p.i - start
}
