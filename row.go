package runlease

import (
	"strconv"
	"time"
)

// leaseRow is the stored form of a lease or a slot, wire-compatible with
// areev-run 1.13.2: {"holder":"…","fence":N,"until_ms":N}, in that order,
// until_ms in milliseconds since the Unix epoch. A slot row has its run id
// as holder and, as fence, the claim id of the Slots that wrote it
// (newClaimID; the reference writes 0 and reads nothing from it); a
// released lease has no holder and keeps its fence.
type leaseRow struct {
	Holder  string
	Fence   uint64
	UntilMS int64
}

// live reports whether the row is held at nowMS. A row whose until_ms equals
// nowMS has expired.
func (r leaseRow) live(nowMS int64) bool { return r.Holder != "" && r.UntilMS > nowMS }

func (r leaseRow) until() time.Time { return time.UnixMilli(r.UntilMS).UTC() }

// encode writes the row exactly as serde_json writes the reference's struct:
// fields in declaration order, no spaces, non-ASCII text as raw UTF-8, and
// only '"', '\' and control characters escaped. (encoding/json would also
// escape <, >, & and U+2028/9, which would make rows differ byte for byte.)
func (r leaseRow) encode() string {
	b := make([]byte, 0, len(r.Holder)+56)
	b = append(b, `{"holder":`...)
	b = appendJSONString(b, r.Holder)
	b = append(b, `,"fence":`...)
	b = strconv.AppendUint(b, r.Fence, 10)
	b = append(b, `,"until_ms":`...)
	b = strconv.AppendInt(b, r.UntilMS, 10)
	b = append(b, '}')
	return string(b)
}

const hexDigits = "0123456789abcdef"

func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20:
			b = append(b, c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
	}
	return append(b, '"')
}
