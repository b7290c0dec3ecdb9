package runlease_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// These tests pin promises that the planted bugs of internal/mutate showed
// no other test checked.

// TestAClaimOfUnknownOutcomeIsAFaultNotARefusal checks, on a store without
// batches, that a claim whose write has an unknown outcome and did not land
// is reported as the fault it is: not as a full scope, and not as held.
func TestAClaimOfUnknownOutcomeIsAFaultNotARefusal(t *testing.T) {
	t.Parallel()
	f := &testkit.Faulty{Store: newSQLite(t)}
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	_, err := runlease.ClaimSlots(t.Context(), testkit.PlainStore{Store: f}, "a", []runlease.Scope{runlease.MemScope(1)})
	require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
	require.NotErrorIs(t, err, runlease.ErrConcurrencyLimit, "the scope is empty: a retry may win it")
	assert.Empty(t, rows(t, f), "nothing landed")
}
