package cli

import (
	"encoding/json"
	"math"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// extremeDB returns a store whose rows expire at the ends of int64
// milliseconds and just past the year 9999, beside an ordinary lease.
func extremeDB(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs.db")
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	row := func(holder string, until int64) string {
		return `{"holder":"` + holder + `","fence":1,"until_ms":` + strconv.FormatInt(until, 10) + `}`
	}
	for key, value := range map[string]string{
		runlease.LeasePrefix + "forever":      row("a#n", math.MaxInt64),
		runlease.LeasePrefix + "y10000":       row("b#n", 253402300800000), // 10000-01-01T00:00:00Z
		runlease.LeasePrefix + "long-ago":     row("c#n", math.MinInt64),
		runlease.LeasePrefix + "ordinary":     row("d#n", time.Now().Add(time.Hour).UnixMilli()),
		runlease.SlotPrefix + "mem:0":         row("forever", math.MaxInt64),
		runlease.SlotPrefix + "mem:1":         row("ordinary", time.Now().Add(time.Hour).UnixMilli()),
		runlease.SlotPrefix + "principal:x:0": row("long-ago", math.MinInt64),
	} {
		ok, err := s.MetaCAS(t.Context(), key, nil, value)
		require.NoError(t, err)
		require.True(t, ok)
	}
	require.NoError(t, s.Close())
	return path
}

func TestStatusShowsRowsBeyondWhatRFC3339Writes(t *testing.T) {
	t.Parallel()
	path := extremeDB(t)

	r := runCLI(t, "status", "--json", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	doc := decodeStatus(t, r.stdout)
	require.Len(t, doc.Leases, 4, "every lease is listed")
	nowMS := doc.Now.UnixMilli()

	forever := doc.lease(t, "forever")
	assert.Equal(t, stateLive, forever.State)
	assert.Nil(t, forever.Until, "RFC 3339 has no year 292278994")
	assert.Nil(t, forever.TakeoverAt)
	require.NotNil(t, forever.UntilMS)
	assert.Equal(t, int64(math.MaxInt64), *forever.UntilMS)
	assert.Equal(t, int64(math.MaxInt64)-nowMS, *forever.ExpiresInMS)

	y10000 := doc.lease(t, "y10000")
	assert.Nil(t, y10000.Until)
	assert.Equal(t, int64(253402300800000), *y10000.UntilMS)

	longAgo := doc.lease(t, "long-ago")
	assert.Equal(t, stateExpired, longAgo.State)
	assert.True(t, longAgo.TakeoverPossible)
	assert.Nil(t, longAgo.Until)
	assert.Equal(t, int64(math.MinInt64), *longAgo.UntilMS)
	assert.Equal(t, int64(math.MinInt64), *longAgo.ExpiresInMS, "until - now clamps rather than wraps")

	ordinary := doc.lease(t, "ordinary")
	require.NotNil(t, ordinary.Until)
	assert.Equal(t, ordinary.Until.UnixMilli(), *ordinary.UntilMS)

	mem := doc.scope(t, "mem")
	require.Len(t, mem.Slots, 2)
	assert.Nil(t, mem.Slots[0].Until)
	assert.Equal(t, int64(math.MaxInt64), *mem.Slots[0].UntilMS)
	assert.NotNil(t, mem.Slots[1].Until)

	r = runCLI(t, "status", "--db", path)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, `(?m)^forever\s+a#n\s+1\s+live\s+in 292\d+ years\s+at 292278994-08-17T07:12:55Z$`, r.stdout)
	assert.Regexp(t, `(?m)^long-ago\s+c#n\s+1\s+expired\s+292\d+ years ago\s+possible now$`, r.stdout)
	assert.Regexp(t, `(?m)^y10000\s+b#n\s+1\s+live\s+in \d+ years\s+at 10000-01-01T00:00:00Z$`, r.stdout)
	assert.Regexp(t, `(?m)^mem\s+2\s+forever \(slot 0, in 292\d+ years\), ordinary \(slot 1, in (1h|59m\d+s)\)$`, r.stdout)
}

func TestPeekShowsRowsBeyondWhatRFC3339Writes(t *testing.T) {
	t.Parallel()
	path := extremeDB(t)
	for _, tc := range []struct {
		run  string
		code int
		ms   int64
	}{
		{"forever", exitHeld, math.MaxInt64},
		{"long-ago", exitFree, math.MinInt64},
		{"y10000", exitHeld, 253402300800000},
	} {
		t.Run(tc.run, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, "peek", tc.run, "--json", "--db", path)
			require.Equal(t, tc.code, r.code, r.stderr)
			var doc peekJSON
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
			assert.Nil(t, doc.Until)
			assert.Equal(t, tc.ms, *doc.UntilMS)

			r = runCLI(t, "peek", tc.run, "--db", path)
			assert.Equal(t, tc.code, r.code, r.stderr)
			assert.Contains(t, r.stdout, `"until_ms":`+strconv.FormatInt(tc.ms, 10))
		})
	}
}
