package runlease_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestLeaseClaimSlotsTakesTheLeasesTerms claims slots through a lease with
// a short TTL and an injected clock: the slots are the run's, stamped by the
// lease's clock with the lease's TTL, so a crashed driver's slots free when
// its lease does, not after the 10-minute default.
func TestLeaseClaimSlotsTakesTheLeasesTerms(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(epoch)
	l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
	require.NoError(t, err)

	slots, err := l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.NoError(t, err)
	assert.Equal(t, "r", slots.RunID())
	assert.Equal(t, runlease.MinTTL, slots.TTL())
	held := slots.Held()
	require.Len(t, held, 1)
	assert.Equal(t, epoch.Add(runlease.MinTTL), held[0].Until, "stamped by the lease's clock, with its TTL")

	// The driver crashes: neither is renewed. Once the lease's TTL has
	// passed, another run gets the slot.
	clk.Advance(runlease.MinTTL)
	other, err := runlease.ClaimSlots(ctx, s, "r2", []runlease.Scope{runlease.MemScope(1)}, runlease.WithClock(clk.Now))
	require.NoError(t, err, "the slot freed with the lease")
	assert.Len(t, other.Held(), 1)
}

// TestLeaseClaimSlotsKeptWithTheLease keeps slots claimed through the lease:
// KeepSlots takes them, and the keeper renews both.
func TestLeaseClaimSlotsKeptWithTheLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(runlease.MinTTL))
	require.NoError(t, err)
	slots, err := l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(2), runlease.PrincipalScope("p", 1)})
	require.NoError(t, err)
	k, err := runlease.Keep(ctx, l, runlease.KeepSlots(slots), runlease.KeepInterval(runlease.MinKeepInterval))
	require.NoError(t, err)
	before := slots.Held()[0].Until
	require.Eventually(t, func() bool { return slots.Held()[0].Until.After(before) }, 10*time.Second, 10*time.Millisecond,
		"the keeper renews the slots")
	require.NoError(t, k.Release(ctx))
	occ, err := runlease.Occupancy(ctx, s)
	require.NoError(t, err)
	assert.Empty(t, occ, "released with the lease")
}

// TestLeaseClaimSlotsRefusedOnceLost claims through a lease that was taken
// over, and one being released: nothing is written.
func TestLeaseClaimSlotsRefusedOnceLost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	a, err := runlease.Acquire(ctx, s, "r", "A", opts...)
	require.NoError(t, err)
	clk.Advance(runlease.MinTTL)
	b, err := runlease.Acquire(ctx, s, "r", "B", opts...)
	require.NoError(t, err)
	require.ErrorIs(t, a.Renew(ctx), runlease.ErrTakenOver)
	before := rows(t, s)

	_, err = a.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.ErrorIs(t, err, runlease.ErrTakenOver)
	require.NoError(t, b.Release(ctx))
	_, err = b.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.ErrorIs(t, err, runlease.ErrReleased)
	occ, err := runlease.Occupancy(ctx, s, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.Empty(t, occ)
	assert.Len(t, rows(t, s), len(before), "no slot row was written")
}

// TestLeaseClaimSlotsOfASupersededLeaseClaimsNothing: a driver whose lease
// expired unnoticed (its Lease has not renewed since its successor took the
// run over) claims through it, in a scope with a slot free beside the
// successor's. An unfenced claim would take that slot for a run the driver
// no longer drives. The claim is fenced by the lease row and fails as a
// loss, writing nothing.
func TestLeaseClaimSlotsOfASupersededLeaseClaimsNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	mem := []runlease.Scope{runlease.MemScope(2)}
	stale, err := runlease.Acquire(ctx, s, "r", "D2", opts...)
	require.NoError(t, err)
	clk.Advance(runlease.MinTTL)
	successor, err := runlease.Acquire(ctx, s, "r", "D1", opts...)
	require.NoError(t, err)
	held, err := successor.ClaimSlots(ctx, mem)
	require.NoError(t, err)
	before := rows(t, s)

	_, err = stale.ClaimSlots(ctx, mem)
	require.ErrorIs(t, err, runlease.ErrTakenOver, "the stale lease learns it is lost")
	assert.Equal(t, before, rows(t, s), "nothing was written")

	require.NoError(t, held.Renew(ctx), "the successor's slot is still its own")
	_, err = runlease.ClaimSlots(ctx, s, "other", mem, runlease.WithClock(clk.Now))
	require.NoError(t, err, "the free slot is still free")
}

// TestLeaseClaimSlotsRenewsTheLease: the fenced claim writes the lease row
// too, in the same batch, so a claim is also a renewal.
func TestLeaseClaimSlotsRenewsTheLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(epoch)
	l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
	require.NoError(t, err)
	clk.Advance(time.Second)
	_, err = l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
	require.NoError(t, err)
	assert.Equal(t, epoch.Add(time.Second+runlease.MinTTL), l.Expiry())
	require.NoError(t, l.Renew(ctx), "the lease goes on from the row the claim wrote")
}

// TestLeaseClaimSlotsRefusesMoreScopesThanItsBatchTakes: the fenced batch
// also writes the lease row, so a claim through a lease takes one scope
// fewer than MaxBatch; more are refused before anything is read.
func TestLeaseClaimSlotsRefusesMoreScopesThanItsBatchTakes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	l, err := runlease.Acquire(ctx, s, "r", "A")
	require.NoError(t, err)
	scopes := make([]runlease.Scope, runlease.MaxBatch)
	for i := range scopes {
		scopes[i] = runlease.NamedScope("s"+strconv.Itoa(i), 1)
	}
	before := rows(t, s)
	_, err = l.ClaimSlots(ctx, scopes)
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	assert.ErrorContains(t, err, "at most 255")
	assert.Equal(t, before, rows(t, s))
	slots, err := l.ClaimSlots(ctx, scopes[:runlease.MaxBatch-1])
	require.NoError(t, err)
	assert.Len(t, slots.Held(), runlease.MaxBatch-1)
}
