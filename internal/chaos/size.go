package chaos

import (
	"fmt"
	"os"
	"time"
)

// EnvFor overrides how long the chaos tests inject faults, as a Go
// duration such as "40s".
const EnvFor = "RUNLEASE_CHAOS_FOR"

// Fault windows. The CI size keeps both chaos tests, run side by side as
// `go test` runs parallel tests, near a minute of wall time under -race;
// the full size runs with `go test -tags chaos`.
const (
	CIWindow   = 25 * time.Second
	FullWindow = 60 * time.Second
)

// Window returns how long a chaos test injects faults: RUNLEASE_CHAOS_FOR
// when set, else [FullWindow] in a build with the chaos tag and [CIWindow]
// without.
func Window() (time.Duration, error) {
	if v := os.Getenv(EnvFor); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("%s=%q: want a positive duration such as 40s", EnvFor, v)
		}
		return d, nil
	}
	if fullSize {
		return FullWindow, nil
	}
	return CIWindow, nil
}

// Deliberately broken holders, chosen with RUNLEASE_CHAOS_BREAK, to show
// that each check can fail. With one set, the test it targets passes only
// if its check reports violations.
const (
	// BreakIgnoreKeeper: a lease holder that never looks at its keeper and
	// trusts its lease until it chooses to release: the trust-window check
	// must catch it.
	BreakIgnoreKeeper = "ignore-keeper"
	// BreakCkptUnfenced: a lease holder that ignores its keeper and writes
	// checkpoints with a plain read and MetaCAS instead of lease.Write: the
	// checkpoint check must catch it.
	BreakCkptUnfenced = "ckpt-unfenced"
	// BreakDownUnfenced: a lease holder that ignores its keeper and writes
	// downstream without the fence condition: the downstream check must
	// catch it.
	BreakDownUnfenced = "downstream-unfenced"
	// BreakSlotsIgnoreKeeper: a slot holder that believes it holds its slot
	// until it releases, whatever its keeper says: the slot cap check must
	// catch it.
	BreakSlotsIgnoreKeeper = "slots-ignore-keeper"
	// BreakQueueIgnoreKeeper: a queue competitor that, once admitted,
	// believes it holds its slots until it releases, whatever its keeper
	// says: the queue test's cap check must catch it.
	BreakQueueIgnoreKeeper = "queue-ignore-keeper"
)

// BreakMode returns RUNLEASE_CHAOS_BREAK: "" for correct holders.
func BreakMode() string { return os.Getenv(EnvBreak) }
