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
// scans in byte order, one error class for every refused argument, context
// errors that callers can recognise, and no fault under concurrent load.
//
// Where the [runlease.Store] contract leaves a choice open, the suite accepts
// every answer the contract allows, and says so in the subtest's name: an
// invalid expected value may be refused with [runlease.ErrInvalidArgument] or
// simply never match, and a prefix longer than [runlease.MaxKeyLen] may be
// refused or match nothing.
package storetest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// newStoreFunc is the constructor Run receives.
type newStoreFunc = func(t *testing.T) runlease.Store

// Run runs the conformance suite against the stores newStore makes, each
// rule in a subtest of t whose name states the rule.
//
// newStore must return a fresh, empty Store that no other subtest uses, and
// must register with t.Cleanup whatever releases it (closing a handle,
// dropping a table). It fails t itself, with t.Fatal or require, when it
// cannot make a store. Most subtests call t.Parallel, so newStore is called
// from many goroutines at once and the stores it returns are used at the same
// time; a backend whose stores share a server should give each one its own
// table or schema.
//
// Because the subtests are parallel, Run returns before they run: they start
// once the calling test function returns, and t completes (running its own
// cleanups) only after all of them have finished. The race rounds run 1,000
// times, or 100 times when testing.Short reports true.
func Run(t *testing.T, newStore func(t *testing.T) runlease.Store) {
	t.Helper()
	groups := []struct {
		name string
		run  func(*testing.T, newStoreFunc)
	}{
		{"get_and_cas", testGetAndCAS},
		{"delete", testDelete},
		{"values", testValues},
		{"scan", testScan},
		{"races", testRaces},
		{"bad_input", testBadInput},
		{"cancelled_context", testCancelledContext},
		{"mixed_load", testMixedLoad},
		{"batch", testBatch},
		{"multi_cas", testMultiCAS},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			g.run(t, newStore)
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
