package cli

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/millis"
	"github.com/areev/runlease/statuspage"
)

// Lease states, as status and peek print them and as --json spells them.
const (
	stateLive     = statuspage.StateLive
	stateExpired  = statuspage.StateExpired
	stateReleased = statuspage.StateReleased
	stateCorrupt  = statuspage.StateCorrupt
	stateAbsent   = statuspage.StateAbsent
)

// leaseState names the state of info.
func leaseState(info runlease.LeaseInfo) string { return statuspage.State(info) }

// leaseJSON is one lease in --json output: statuspage's, as the status
// page serves it.
type leaseJSON = statuspage.Lease

func newLeaseJSON(info runlease.LeaseInfo, now time.Time) leaseJSON {
	return statuspage.NewLease(info, now)
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
	switch ms := millis.Until(to, from); {
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
