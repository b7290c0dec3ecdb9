package main

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// Lease states, as status and peek print them and as --json spells them.
const (
	stateLive     = "live"     // held: Acquire by another holder is refused until it expires
	stateExpired  = "expired"  // its holder stopped renewing: anyone may take over
	stateReleased = "released" // given up: anyone may take over, continuing the fence
	stateCorrupt  = "corrupt"  // the row does not parse: nobody takes over until a person looks
	stateAbsent   = "absent"   // no row (peek only)
)

// leaseState names the state of info.
func leaseState(info runlease.LeaseInfo) string {
	switch {
	case !info.Found:
		return stateAbsent
	case info.Corrupt:
		return stateCorrupt
	case info.Released:
		return stateReleased
	case info.Live:
		return stateLive
	}
	return stateExpired
}

// leaseJSON is one lease in --json output. The field names are stable.
type leaseJSON struct {
	RunID  string `json:"run_id"`
	State  string `json:"state"`  // live, expired, released, corrupt; peek also absent
	Holder string `json:"holder"` // "" when released, corrupt or absent
	Fence  uint64 `json:"fence"`  // 0 when corrupt or absent
	// Until is when the lease expires (expired, released: ended); null when
	// corrupt or absent, and when RFC 3339 cannot write it (outside the
	// years 0 to 9999; UntilMS still has it).
	Until *time.Time `json:"until"`
	// UntilMS is the row's until_ms, milliseconds since the Unix epoch;
	// null when corrupt or absent.
	UntilMS *int64 `json:"until_ms"`
	// ExpiresInMS is until_ms minus now in milliseconds, clamped to the
	// int64 range: negative once expired.
	ExpiresInMS *int64 `json:"expires_in_ms"`
	// TakeoverPossible tells whether another holder may acquire the run now:
	// true for an absent run, false for a corrupt row.
	TakeoverPossible bool `json:"takeover_possible"`
	// TakeoverAt is when takeover becomes possible (in the past when it
	// already is); null for a corrupt row, which nobody takes over, and for
	// an absent run, which has no lease to take over.
	TakeoverAt *time.Time `json:"takeover_at"`
	Row        string     `json:"row"` // the stored row, byte for byte
}

func newLeaseJSON(info runlease.LeaseInfo, now time.Time) leaseJSON {
	j := leaseJSON{RunID: info.RunID, State: leaseState(info), Holder: info.Holder, Fence: info.Fence, Row: info.Row}
	switch j.State {
	case stateAbsent:
		j.TakeoverPossible = true // no lease: the first acquirer gets the run
		return j
	case stateCorrupt:
		return j
	}
	untilMS, in := info.Until.UnixMilli(), millisUntil(info.Until, now)
	takeover := info.Until
	if !info.Live && info.Until.After(now) { // released ahead of this clock
		takeover = now
	}
	j.Until, j.UntilMS, j.ExpiresInMS, j.TakeoverAt = jsonTime(info.Until), &untilMS, &in, jsonTime(takeover)
	j.TakeoverPossible = !info.Live
	return j
}

// jsonTime returns t in UTC for a JSON field, or nil when RFC 3339 cannot
// write it: a row may hold any int64 of milliseconds, some 292 million
// years either way, and encoding/json refuses years outside 0 to 9999.
func jsonTime(t time.Time) *time.Time {
	t = t.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		return nil
	}
	return &t
}

// millisUntil returns until minus now in milliseconds, clamped to the int64
// range (time.Time.Sub clamps to about 292 years instead).
func millisUntil(until, now time.Time) int64 {
	u, n := until.UnixMilli(), now.UnixMilli()
	d := u - n
	if (u >= 0) != (n >= 0) && (d >= 0) != (u >= 0) { // overflowed
		if u >= 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return d
}

// expiresText says when a lease expires, or since when it has been free.
func expiresText(info runlease.LeaseInfo, now time.Time) string {
	switch leaseState(info) {
	case stateLive:
		return "in " + spanText(info.Until, now)
	case stateExpired:
		return spanText(now, info.Until) + " ago"
	case stateReleased:
		return "released " + spanText(now, info.Until) + " ago"
	}
	return "-"
}

// spanText formats the time from from to to for people, as shortDuration
// does, and spans too long for a time.Duration in years.
func spanText(to, from time.Time) string {
	switch ms := millisUntil(to, from); {
	case ms <= 0:
		return shortDuration(0)
	case ms > math.MaxInt64/int64(time.Millisecond):
		return strconv.FormatInt(ms/(365.25*24*3600*1000), 10) + " years"
	default:
		return shortDuration(time.Duration(ms) * time.Millisecond)
	}
}

// takeoverText says, with instants formatted by at, when another driver may take the run over.
func takeoverText(info runlease.LeaseInfo, at func(time.Time) string) string {
	switch leaseState(info) {
	case stateLive:
		return "at " + at(info.Until)
	case stateCorrupt:
		return "never: inspect the row"
	case stateAbsent:
		return "now: no lease"
	}
	return "possible now"
}

// timestamp formats t for people: UTC, to the second.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// shortDuration formats d for people: whole seconds once it is a second or
// more, without zero units ("2h", not "2h0m0s"); a negative d counts as 0.
func shortDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	s := d.Round(time.Second).String()
	s = strings.Replace(s, "m0s", "m", 1)
	return strings.Replace(s, "h0m", "h", 1)
}

// orDash returns s, or "-" when it is empty, for table cells.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
