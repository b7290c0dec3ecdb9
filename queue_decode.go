package runlease

import (
	"math"
	"strings"
	"unicode/utf8"
)

// decodeCanonicalEntry reads a queue entry as [queueEntry.encode] writes it
// when no string needs an escape: the fields in the struct's order, no
// spaces, every integer in range. A waiter reads every entry of a scope
// each time it looks, so this path reads one without reflection, and its
// strings are substrings of value. ok is false for any other input, which
// encoding/json then decides; every entry this accepts, encoding/json
// reads the same way (FuzzQueueEntryDecode checks both directions).
func decodeCanonicalEntry(value string) (e queueEntry, ok bool) {
	p := canonicalParser{s: value}
	ok = p.lit(`{"run":`) && p.str(&e.Run) &&
		p.lit(`,"waiter":`) && p.str(&e.Waiter) &&
		p.lit(`,"fence":`) && p.u64(&e.Fence) &&
		p.lit(`,"seq":`) && p.u64(&e.Seq) &&
		p.lit(`,"principal":`) && p.str(&e.Principal) &&
		p.lit(`,"weight":`) && p.i(&e.Weight) &&
		p.lit(`,"priority":`) && p.i(&e.Priority) &&
		p.lit(`,"units":`) && p.i(&e.Units) &&
		p.lit(`,"tag":`) && p.i64(&e.Tag) &&
		p.lit(`,"enq_ms":`) && p.i64(&e.EnqMS) &&
		p.lit(`,"until_ms":`) && p.i64(&e.UntilMS) &&
		p.lit(`,"scopes":`) && p.strs(&e.Scopes) &&
		p.lit(`}`) && p.s == ""
	return e, ok
}

// canonicalParser consumes s from the front; each method reports whether
// what it expected was there.
type canonicalParser struct{ s string }

func (p *canonicalParser) lit(want string) bool {
	var found bool
	p.s, found = strings.CutPrefix(p.s, want)
	return found
}

// str reads a JSON string without escapes. encoding/json writes an escape
// for '"', '\\', control characters, '<', '>', '&', U+2028 and U+2029, so
// their absence is what a canonical string looks like; invalid UTF-8 is
// left to encoding/json, which reads it as U+FFFD.
func (p *canonicalParser) str(dst *string) bool {
	if !strings.HasPrefix(p.s, `"`) {
		return false
	}
	end := strings.IndexByte(p.s[1:], '"')
	if end < 0 {
		return false
	}
	v := p.s[1 : 1+end]
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' || v[i] < 0x20 {
			return false
		}
	}
	if !utf8.ValidString(v) {
		return false
	}
	*dst, p.s = v, p.s[2+end:]
	return true
}

// strs reads an array of canonical strings; null and [] are left to
// encoding/json.
func (p *canonicalParser) strs(dst *[]string) bool {
	if !p.lit(`[`) {
		return false
	}
	n := 1 + strings.Count(p.s[:max(strings.IndexByte(p.s, ']'), 0)], ",")
	out := make([]string, 0, n)
	for {
		var v string
		if !p.str(&v) {
			return false
		}
		out = append(out, v)
		if p.lit(`]`) {
			*dst = out
			return true
		}
		if !p.lit(`,`) {
			return false
		}
	}
}

func (p *canonicalParser) u64(dst *uint64) bool {
	v, n, ok := scanDigits(p.s)
	if !ok {
		return false
	}
	*dst, p.s = v, p.s[n:]
	return true
}

// i64 reads a signed integer as encoding/json writes one: an optional
// '-' (never before 0), then digits.
func (p *canonicalParser) i64(dst *int64) bool {
	neg := strings.HasPrefix(p.s, "-")
	rest := p.s
	if neg {
		rest = rest[1:]
	}
	mag, n, ok := scanDigits(rest)
	if !ok {
		return false
	}
	v, ok := signed(mag, neg)
	if !ok {
		return false
	}
	*dst, p.s = v, rest[n:]
	return true
}

// i is i64 for an int.
func (p *canonicalParser) i(dst *int) bool {
	var v int64
	if !p.i64(&v) || v < math.MinInt || v > math.MaxInt {
		return false
	}
	*dst = int(v)
	return true
}
