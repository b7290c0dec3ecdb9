// Package storetest is the conformance suite for [runlease.Store]
// implementations. The embedded SQLite store and the shared Postgres store
// run it, and a third-party Store proves it honours the contract the same
// way, with one line in its own tests:
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) runlease.Store {
//			s, err := mystore.Open(t.Context(), dsnForTest(t))
//			require.NoError(t, err)
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// The suite checks what the policy layer of runlease relies on: conditional
// writes that succeed exactly when their condition holds, a lost race that is
// false rather than an error, values returned byte for byte, literal prefix
// scans in byte order that return every row and read one snapshot, batches
// isolated from every other call (no write skew), one error class for every
// refused argument, context errors that are storage faults callers can
// recognise, and no fault under concurrent load.
//
// [RunWith] takes a [Harness] that can do more, and turns on two groups
// that Run skips: with Reopen, a second handle on the same storage, the
// suite checks that each handle sees the other's writes at once and that
// their races have one winner; with Faulty, a store whose writes can be
// made to fail, it checks that each fault is labelled truthfully (a write
// reported as not applied changed nothing, one that applied is reported as
// an unknown outcome):
//
//	storetest.RunWith(t, storetest.Harness{
//		New:    newMyStore,
//		Reopen: reopenMyStore, // func(t *testing.T, s runlease.Store) runlease.Store
//		Faulty: newFaultyMyStore,
//	})
//
// The suite is itself tested: internal/brokenstore holds stores broken in
// the ways a store goes wrong, and a test of this package requires the
// suite to fail each of them, naming the rule it breaks.
//
// Where the [runlease.Store] contract leaves a choice open, the suite accepts
// every answer the contract allows, and says so in the subtest's name: an
// invalid expected value may be refused with [runlease.ErrInvalidArgument] or
// simply never match, and a prefix longer than [runlease.MaxKeyLen] may be
// refused or match nothing.
package storetest

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// newStoreFunc is the constructor the groups receive: Harness.New.
type newStoreFunc = func(t *testing.T) runlease.Store

// Harness describes a Store to the suite. Only New is required; Reopen and
// Faulty turn on the groups that need them, which otherwise skip with a
// message saying what to set. The zero value is not usable: RunWith fails t
// when New is nil.
type Harness struct {
	// New returns a fresh, empty Store that no other subtest uses, and
	// registers with t.Cleanup whatever releases it (closing a handle,
	// dropping a table). It fails t itself, with t.Fatal or require, when it
	// cannot make a store. Most subtests call t.Parallel, so New is called
	// from many goroutines at once and the stores it returns are used at the
	// same time; a backend whose stores share a server should give each one
	// its own table or schema.
	New func(t *testing.T) runlease.Store

	// Reopen, when set, opens a second handle on the storage behind s, a
	// store New returned, the way a second process or node would (its own
	// connections, its own caches), and registers its release with
	// t.Cleanup. The suite then checks that a write through either handle
	// is seen at once by reads and conditional writes through the other,
	// and that racing writes through the two have one winner.
	Reopen func(t *testing.T, s runlease.Store) runlease.Store

	// ReopenReadOnly says that the handles Reopen returns can only read (an
	// embedded store with one writer per file opens its second handle read
	// only). The suite then writes through the first handle only.
	ReopenReadOnly bool

	// Faulty, when set, returns a fresh, empty store whose writes the suite
	// can make fail, as New does, with the function that arms a fault for
	// the next write. The suite then checks that every fault is labelled
	// truthfully: a write reported as not applied changed nothing, and one
	// that was applied is reported as applied or as an unknown outcome.
	Faulty func(t *testing.T) FaultyStore
}

// Run runs the conformance suite against the stores newStore makes, each
// rule in a subtest of t whose name states the rule. It is RunWith with a
// Harness of New alone, so the groups that need a second handle or fault
// injection skip; see [Harness] for what newStore must do.
//
// Because the subtests are parallel, Run returns before they run: they start
// once the calling test function returns, and t completes (running its own
// cleanups) only after all of them have finished. The race rounds run 1,000
// times, or 100 times when testing.Short reports true, and the other
// repeated checks shrink likewise.
func Run(t *testing.T, newStore func(t *testing.T) runlease.Store) {
	t.Helper()
	RunWith(t, Harness{New: newStore})
}

// RunWith runs the conformance suite against the stores h describes, each
// rule in a subtest of t whose name states the rule, as [Run] does, plus
// the groups that h's optional fields turn on. It fails t at once when h is
// unusable (New nil, or ReopenReadOnly without Reopen).
func RunWith(t *testing.T, h Harness) {
	t.Helper()
	switch {
	case h.New == nil:
		t.Fatal("storetest: Harness.New is nil")
	case h.ReopenReadOnly && h.Reopen == nil:
		t.Fatal("storetest: Harness.ReopenReadOnly is set but Harness.Reopen is nil")
	}
	plain := func(fn func(*testing.T, newStoreFunc)) func(*testing.T, Harness) {
		return func(t *testing.T, h Harness) { fn(t, h.New) }
	}
	groups := []struct {
		name string
		run  func(*testing.T, Harness)
	}{
		{"get_and_cas", plain(testGetAndCAS)},
		{"delete", plain(testDelete)},
		{"values", plain(testValues)},
		{"scan", plain(testScan)},
		{"atomic_scan", plain(testAtomicScan)},
		{"races", plain(testRaces)},
		{"bad_input", plain(testBadInput)},
		{"cancelled_context", plain(testCancelledContext)},
		{"mixed_load", plain(testMixedLoad)},
		{"batch", plain(testBatch)},
		{"multi_cas", plain(testMultiCAS)},
		{"scan_many", plain(testScanMany)},
		{"ranges", plain(testRanges)},
		{"delete_read", plain(testDeleteRead)},
		{"two_handles", testTwoHandles},
		{"fault_labels", testFaultLabels},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			g.run(t, h)
		})
	}
}

// parallel returns a subtest body that runs fn in parallel with its
// siblings, on a store of its own.
func parallel(newStore newStoreFunc, fn func(t *testing.T, s runlease.Store)) func(*testing.T) {
	return func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		require.NotNil(t, s, "newStore returned a nil Store")
		fn(t, s)
	}
}

// withCapability returns a maker of subtest bodies that run in parallel,
// each on a store of its own, and hand fn the store as its optional
// capability C (runlease.Batcher, say); on a store without C they skip.
func withCapability[C any](newStore newStoreFunc) func(fn func(t *testing.T, s runlease.Store, c C)) func(*testing.T) {
	return func(fn func(t *testing.T, s runlease.Store, c C)) func(*testing.T) {
		return parallel(newStore, func(t *testing.T, s runlease.Store) {
			c, ok := s.(C)
			if !ok {
				t.Skipf("the store does not implement %v", reflect.TypeFor[C]())
			}
			fn(t, s, c)
		})
	}
}

// ptr returns a pointer to a copy of s, for MetaCAS's expected argument.
func ptr(s string) *string { return &s }

// get reads key and fails t on an error.
func get(t *testing.T, s runlease.Store, key string) (string, bool) {
	t.Helper()
	v, found, err := s.MetaGet(t.Context(), key)
	require.NoError(t, err, "MetaGet(%q)", key)
	return v, found
}

// requireValue fails t unless key holds exactly want.
func requireValue(t *testing.T, s runlease.Store, key, want string) {
	t.Helper()
	v, found := get(t, s, key)
	require.True(t, found, "MetaGet(%q): key is absent, want %q", key, want)
	require.Equal(t, want, v, "MetaGet(%q)", key)
}

// requireAbsent fails t unless key is absent.
func requireAbsent(t *testing.T, s runlease.Store, key string) {
	t.Helper()
	v, found := get(t, s, key)
	require.False(t, found, "MetaGet(%q): want absent, found %q", key, v)
}

// cas calls MetaCAS and fails t on an error.
func cas(t *testing.T, s runlease.Store, key string, expected *string, value string) bool {
	t.Helper()
	ok, err := s.MetaCAS(t.Context(), key, expected, value)
	require.NoError(t, err, "MetaCAS(%q)", key)
	return ok
}

// create stores value at the absent key, and fails t if it cannot.
func create(t *testing.T, s runlease.Store, key, value string) {
	t.Helper()
	require.True(t, cas(t, s, key, nil, value), "MetaCAS(%q, nil, …) on an absent key must create it", key)
}

// scan calls MetaScan and fails t on an error. It never returns nil, so an
// empty result compares equal to an empty slice.
func scan(t *testing.T, s runlease.Store, prefix string) []runlease.Row {
	t.Helper()
	rows, err := s.MetaScan(t.Context(), prefix)
	require.NoError(t, err, "MetaScan(%q)", prefix)
	if rows == nil {
		rows = []runlease.Row{}
	}
	return rows
}
