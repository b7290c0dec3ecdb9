//go:build chaos

package runlease_test

// fullFaultSize selects the full sizes of the fault tests of this package:
// `go test -tags chaos` runs them at their full sizes, as RUNLEASE_CHAOS=1
// does.
const fullFaultSize = true
