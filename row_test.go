package runlease

import (
	"encoding/json"
	"math"
	"testing"
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
