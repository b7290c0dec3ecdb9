package main

import (
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
	// corrupt or absent.
	Until *time.Time `json:"until"`
	// ExpiresInMS is Until minus now in milliseconds: negative once expired.
	ExpiresInMS *int64 `json:"expires_in_ms"`
	// TakeoverPossible tells whether another holder may acquire the run now.
	TakeoverPossible bool `json:"takeover_possible"`
	// TakeoverAt is when takeover becomes possible (in the past when it
	// already is); null for a corrupt row, which nobody takes over.
	TakeoverAt *time.Time `json:"takeover_at"`
	Row        string     `json:"row"` // the stored row, byte for byte
}

func newLeaseJSON(info runlease.LeaseInfo, now time.Time) leaseJSON {
	j := leaseJSON{RunID: info.RunID, State: leaseState(info), Holder: info.Holder, Fence: info.Fence, Row: info.Row}
	if j.State == stateCorrupt || j.State == stateAbsent {
		return j
	}
	until := info.Until.UTC()
	in := until.Sub(now).Milliseconds()
	takeover := until
	if !info.Live && until.After(now) { // released ahead of this clock
		takeover = now.UTC()
	}
	j.Until, j.ExpiresInMS, j.TakeoverAt = &until, &in, &takeover
	j.TakeoverPossible = !info.Live
	return j
}

// expiresText says when a lease expires, or since when it has been free.
func expiresText(info runlease.LeaseInfo, now time.Time) string {
	switch leaseState(info) {
	case stateLive:
		return "in " + shortDuration(info.Until.Sub(now))
	case stateExpired:
		return shortDuration(now.Sub(info.Until)) + " ago"
	case stateReleased:
		return "released " + shortDuration(now.Sub(info.Until)) + " ago"
	}
	return "-"
}

// takeoverText says when another driver may take the run over.
func takeoverText(info runlease.LeaseInfo) string {
	switch leaseState(info) {
	case stateLive:
		return "at " + timestamp(info.Until)
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
