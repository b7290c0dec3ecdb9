// Package systest marks the tests that `go test -short` leaves out of the
// unit loop. It imports nothing of runlease, so that tests of every
// package, the root's internal tests included, can use it.
package systest

import "testing"

// Mark marks t as a system test: one that starts processes or database
// clusters, injects faults for seconds, checks a history for
// linearizability, or sweeps thousands of simulated schedules. Under
// `go test -short` it skips t, so that the loop a developer runs while
// editing covers every unit rule in under a minute; CI and the README's
// test command run without -short, and so run every system test too.
func Mark(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("system test: skipped under -short (run without -short for the whole suite)")
	}
}
