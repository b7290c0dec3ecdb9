package runlease

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sampleEntry is an entry as a waiter of a busy engine writes it.
func sampleEntry() queueEntry {
	return queueEntry{Run: "billing-run-4121", Waiter: "9f86d081884c7d65a1b2c3d4", Fence: 7, Seq: 12,
		Principal: "team-a", Weight: 2, Priority: -3, Units: 2, Tag: 4_000_000, EnqMS: 1796424797000,
		UntilMS: 1796425397000, Scopes: []string{"gpu", "principal:team-a"}}
}

func sampleRaw() string {
	e := sampleEntry()
	return e.encode()
}

// entrySeeds are entries the fast path must read, and near misses it must
// leave to encoding/json: escapes, spaces, another field order, duplicate
// and differently cased keys, numbers out of range or not canonical,
// invalid UTF-8, null and empty arrays, trailing bytes.
var entrySeeds = []string{
	sampleRaw(),
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"run":"r","waiter":"w","fence":18446744073709551615,"seq":1,"principal":"p","weight":1,"priority":-9223372036854775808,"units":1,"tag":9223372036854775807,"enq_ms":1,"until_ms":2,"scopes":["a","b,c","]"]}`,
	`{"run":"r","waiter":"w","fence":18446744073709551616,"seq":1,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"run":"r\u003c","waiter":"w","fence":0,"seq":0,"principal":"p\"","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a\\"]}`,
	`{"run":"r<>&","waiter":"w","fence":0,"seq":0,"principal":"é€中😀","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["\u2028"]}`,
	`{"run":"r\xff","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":-0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":01,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1e0,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"run":"r","waiter":"w","fence":-1,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":null}`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":[]}`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]} `,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}x`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"],"run":"s"}`,
	`{"Run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"waiter":"w","run":"r","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{ "run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"`,
	`{"run":"r","waiter":"w"`,
	`{"run":"r","waiter":"w","fence":0,"seq":0,"principal":"p","weight":9223372036854775808,"priority":0,"units":1,"tag":0,"enq_ms":1,"until_ms":2,"scopes":["a"]}`,
	``,
	`null`,
	`[]`,
}

// FuzzQueueEntryDecode checks the fast path against encoding/json: an input
// the fast path accepts, encoding/json reads without error and to the same
// entry; and decodeEntry as a whole agrees with encoding/json plus the
// entry's checks.
func FuzzQueueEntryDecode(f *testing.F) {
	for _, s := range entrySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var want queueEntry
		werr := json.Unmarshal([]byte(raw), &want)
		if fast, ok := decodeCanonicalEntry(raw); ok {
			if werr != nil || !reflect.DeepEqual(fast, want) {
				t.Fatalf("fast path reads %q as %#v; encoding/json as %#v, %v", raw, fast, want, werr)
			}
		}
		got, err := decodeEntry(raw)
		if werr != nil {
			if err == nil {
				t.Fatalf("decodeEntry(%q) = %#v; encoding/json refuses it: %v", raw, got, werr)
			}
			return
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeEntry(%q) = %#v; encoding/json reads %#v", raw, got, want)
		}
	})
}

// TestTheFastPathReadsEveryEntryTheEncoderWritesWithoutEscapes: the fast
// path is taken for what waiters write (else it saves nothing), and left
// for strings that encoding/json escapes.
func TestTheFastPathReadsEveryEntryTheEncoderWritesWithoutEscapes(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", "-", ":", "#", "/", ".", "é", "中", "😀", " ", ",", "]", "[", "{", "}"}
	escaped := []string{`"`, `\`, "\n", "\x00", "<", ">", "&", "\u2028", "\u2029", "\xff"}
	word := func(escapes bool) string {
		var b strings.Builder
		for range rnd.IntN(12) {
			b.WriteString(alphabet[rnd.IntN(len(alphabet))])
		}
		if escapes {
			b.WriteString(escaped[rnd.IntN(len(escaped))])
		}
		return b.String()
	}
	int64s := []int64{0, 1, -1, math.MaxInt64, math.MinInt64, 1796424797000}
	for i := range 5000 {
		escapes := i%2 == 1
		e := queueEntry{Run: word(false), Waiter: word(false), Fence: rnd.Uint64(), Seq: rnd.Uint64N(1000),
			Principal: word(escapes), Weight: rnd.IntN(1001), Priority: rnd.IntN(2001) - 1000, Units: rnd.IntN(65),
			Tag: int64s[rnd.IntN(len(int64s))], EnqMS: rnd.Int64(), UntilMS: int64s[rnd.IntN(len(int64s))]}
		for range 1 + rnd.IntN(3) {
			e.Scopes = append(e.Scopes, word(false))
		}
		raw := e.encode()
		fast, ok := decodeCanonicalEntry(raw)
		if escapes {
			require.False(t, ok, "fast path took %q, whose principal is escaped", raw)
			continue
		}
		require.True(t, ok, "fast path refused %q", raw)
		require.Equal(t, e, fast)
	}
}

func TestDecodeEntryStillChecksWhatItReads(t *testing.T) {
	t.Parallel()
	for _, mod := range []func(*queueEntry){
		func(e *queueEntry) { e.Run = "" },
		func(e *queueEntry) { e.Waiter = "" },
		func(e *queueEntry) { e.Weight = 0 },
		func(e *queueEntry) { e.Units = MaxUnits + 1 },
		func(e *queueEntry) { e.Priority = MaxPriority + 1 },
		func(e *queueEntry) { e.Tag = -1 },
		func(e *queueEntry) { e.UntilMS = 0 },
	} {
		e := sampleEntry()
		mod(&e)
		raw := e.encode()
		_, ok := decodeCanonicalEntry(raw)
		require.True(t, ok, "the fast path reads %q; the checks refuse it", raw)
		_, err := decodeEntry(raw)
		assert.ErrorIs(t, err, errBadEntry, "%q", raw)
	}
}

// BenchmarkDecodeEntry measures reading one queue entry, as a waiter does
// for every entry of a scope each time it looks: the canonical form (the
// fast path) and the same entry through encoding/json.
func BenchmarkDecodeEntry(b *testing.B) {
	raw := sampleRaw()
	b.Run("canonical", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeEntry(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var e queueEntry
			if err := json.Unmarshal([]byte(raw), &e); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestQueueKeysRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ scope, run string }{
		{"mem", "r"}, {"principal:a:b", "x"}, {"principal:a", "b:x"}, {"gpu/1.a", "run:with:colons"}, {"m", "0000001.x"},
	} {
		e := queueEntry{Run: tc.run, Priority: -3, Tag: 42, EnqMS: 1796424797000}
		scope, run, ok := parseLineKey(lineKey(tc.scope, &e))
		require.True(t, ok)
		assert.Equal(t, tc, struct{ scope, run string }{scope, run})
		scope, run, ok = parseLegacyQueueKey(legacyQueueKey(tc.scope, tc.run))
		require.True(t, ok)
		assert.Equal(t, tc, struct{ scope, run string }{scope, run})
	}
	for _, bad := range []string{"runqueue:", "runqueue:3:mem:", "runqueue:03:mem:r", "runqueue:4:mem:r", "runqueue:x:mem:r", "runslot:mem:0"} {
		_, _, ok := parseLegacyQueueKey(bad)
		assert.False(t, ok, bad)
	}
	for _, bad := range []string{"runline:", "runline:3:mem:", "runline:3:mem:0000001.x", "runline:3:mem:1000000.0000000000000000042.0001796424797000x", "runqueue:3:mem:r"} {
		_, _, ok := parseLineKey(bad)
		assert.False(t, ok, bad)
	}
}

// TestLineKeysSortInRankOrder checks what the head read rests on: the byte
// order of line keys is the order in which queueEntry.before ranks their
// entries, over random priorities, tags, enqueue times and run ids.
func TestLineKeysSortInRankOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	runs := []string{"a", "b", "ab", "a:b", "~", "0", "é", "a\u00ff", "zz"}
	pick := func() queueEntry {
		return queueEntry{Run: runs[rng.IntN(len(runs))], Priority: []int{-MaxPriority, -1, 0, 1, 7, MaxPriority}[rng.IntN(6)],
			Tag: []int64{0, 1, 999_999, 1_000_000, maxTag}[rng.IntN(5)], EnqMS: []int64{1, 9, 10, 1796424797000, 9999999999999999}[rng.IntN(5)]}
	}
	for range 20000 {
		e, f := pick(), pick()
		ke, kf := lineKey("s", &e), lineKey("s", &f)
		switch {
		case e.before(&f):
			assert.Less(t, ke, kf, "%+v before %+v", e, f)
		case f.before(&e):
			assert.Less(t, kf, ke, "%+v before %+v", f, e)
		default:
			assert.Equal(t, ke, kf)
		}
	}
}
