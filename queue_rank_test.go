package runlease_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestAPlainClaimRanksBehindAWaiterItTiesWith proves that a claim that
// does not wait, of another principal, at the waiter's priority and with
// the same fair-share tag, ranks behind the waiter: it ties on priority and
// tag, and a claim made now has not waited at all. It is refused while the
// waiter's reservation leaves it no room, plain or through a lease, though
// its run id sorts first (the last tie-break, which must never be reached).
func TestAPlainClaimRanksBehindAWaiterItTiesWith(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		gpu := runlease.NamedScope("gpu", 2)
		_, err := runlease.ClaimSlots(ctx, s, "one", []runlease.Scope{gpu})
		require.NoError(t, err)
		// A waiter of team-a needs both units: one is free, and it
		// reserves it.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			_, _ = runlease.ClaimSlotsWait(wctx, s, "waiter-z", []runlease.Scope{gpu.Take(2)},
				runlease.WithFairShare("team-a", 1))
		}()
		awaitQueued(t, s, 1)
		queued, err := runlease.Queues(ctx, s)
		require.NoError(t, err)
		require.Len(t, queued, 1)

		// team-b has nothing waiting and no mark: a claim of its ranks at
		// the virtual time now, the waiter's own tag.
		teamB := runlease.WithFairShare("team-b", 1)
		ex, err := runlease.ExplainSlots(ctx, s, "claim-a", []runlease.Scope{gpu}, teamB)
		require.NoError(t, err)
		require.Equal(t, queued[0].Priority, ex.Scopes[0].Priority)
		require.Equal(t, queued[0].Tag, ex.Scopes[0].Tag, "the claim ties with the waiter on priority and tag")

		want := runlease.ConcurrencyLimitError{Scope: "gpu", Limit: 2, Units: 1, Held: 1, Ahead: 1, Reserved: 2}
		slotsBefore := slotRows(t, s)
		_, err = runlease.ClaimSlots(ctx, s, "claim-a", []runlease.Scope{gpu}, teamB)
		var limit *runlease.ConcurrencyLimitError
		require.ErrorAs(t, err, &limit, "a plain claim took the unit the waiter it ties with reserves")
		assert.Equal(t, want, *limit)

		l, err := runlease.Acquire(ctx, s, "claim-a", "driver")
		require.NoError(t, err)
		_, err = l.ClaimSlots(ctx, []runlease.Scope{gpu}, teamB)
		require.ErrorAs(t, err, &limit, "a lease's claim took the unit the waiter it ties with reserves")
		assert.Equal(t, want, *limit)
		require.NoError(t, l.Release(ctx))
		assert.Equal(t, slotsBefore, slotRows(t, s), "the refusals took no slot")
		assert.Len(t, queueRows(t, s), 1, "nor queued")
	})
}

// slotRows returns the slot rows of every scope.
func slotRows(t *testing.T, s runlease.Store) []runlease.Row {
	t.Helper()
	r, err := s.MetaScan(t.Context(), runlease.SlotPrefix)
	require.NoError(t, err)
	return r
}
