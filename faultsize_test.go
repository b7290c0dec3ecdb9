//go:build !chaos

package runlease_test

// fullFaultSize selects the full sizes of the fault tests of this package
// (linearizability under faults, kills at random points of a write loop);
// see faultsize_chaos_test.go. Without the chaos build tag they run their
// CI sizes, unless RUNLEASE_CHAOS=1.
const fullFaultSize = false
