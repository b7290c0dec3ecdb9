package runlease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

func TestSlotFaultsAreNeverLosses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	mem := []runlease.Scope{runlease.MemScope(1)}

	t.Run("a_slot_renewal_whose_reply_was_lost_is_not_a_loss", func(t *testing.T) {
		t.Parallel()
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		sl, err := runlease.ClaimSlots(ctx, f, "a", mem, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(time.Second)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		err = sl.Renew(ctx)
		require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
		require.NotErrorIs(t, err, runlease.ErrSlotLost)
		clk.Advance(time.Second)
		require.NoError(t, sl.Renew(ctx), "the row that landed is the run's own")
		require.Len(t, sl.Held(), 1)
		require.NoError(t, sl.Release(ctx))
		assert.Empty(t, rows(t, f), "and Release deletes it")
	})

	t.Run("a_runs_own_expired_slot_does_not_bypass_the_limit", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		ttl := runlease.WithTTL(5 * time.Second)
		// A host with limit 2: run a's slot 0 expires, run b's slot 1 lives.
		_, err := runlease.ClaimSlots(ctx, s, "a", []runlease.Scope{runlease.MemScope(2)}, ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(4 * time.Second)
		_, err = runlease.ClaimSlots(ctx, s, "b", []runlease.Scope{runlease.MemScope(2)}, ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(2 * time.Second)
		// A host with limit 1 sees one live holder: no run may join it.
		for _, run := range []string{"c", "a"} {
			_, err = runlease.ClaimSlots(ctx, s, run, mem, ttl, runlease.WithClock(clk.Now))
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "run %s", run)
		}
	})

	t.Run("a_retryable_fault_of_a_batched_claim_is_retried", func(t *testing.T) {
		t.Parallel()
		f := &testkit.Faulty{Store: newSQLite(t)}
		retryable := &runlease.StorageError{Op: "MetaBatch", Retryable: true, Err: assert.AnError}
		for range 3 {
			f.Next(testkit.Fault{Err: retryable})
		}
		sl, err := runlease.ClaimSlots(ctx, f, "a", mem)
		require.NoError(t, err, "on a store that works a claim is won or refused")
		require.Len(t, sl.Held(), 1)
	})

	t.Run("without_batches_a_claim_refused_in_a_later_scope_puts_the_first_back", func(t *testing.T) {
		t.Parallel()
		inner := newSQLite(t)
		f := &testkit.Faulty{Store: inner}
		scopes := []runlease.Scope{runlease.MemScope(1), runlease.PrincipalScope("p", 1)}
		f.Next(testkit.Fault{Apply: true}, testkit.Fault{Apply: false, Then: func() {
			// another run takes the principal's only slot between the
			// scan and the write
			_, err := runlease.ClaimSlots(ctx, inner, "other", scopes[1:])
			require.NoError(t, err)
		}})
		_, err := runlease.ClaimSlots(ctx, testkit.PlainStore{Store: f}, "a", scopes)
		require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
		occ, err := runlease.Occupancy(ctx, inner)
		require.NoError(t, err)
		for _, o := range occ {
			assert.NotEqual(t, "a", o.RunID, "a refused claim holds no slot afterwards: %+v", o)
		}
		_, err = runlease.ClaimSlots(ctx, inner, "c", scopes[:1])
		require.NoError(t, err, "the first scope's slot is free at once, not after a TTL")
	})
}

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
