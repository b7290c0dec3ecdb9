package storetest

import "testing"

// SetAtomicScans makes each moving-token test of the suites that t runs
// make n scans, and restores the usual count once t and its subtests end.
func SetAtomicScans(t *testing.T, n int) {
	old := atomicScansOverride
	atomicScansOverride = n
	t.Cleanup(func() { atomicScansOverride = old })
}
