package runlease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestSlotsTwinRowIsNeverTakenForOwnRenewal: two Slots values of run r1
// hold the same slot (S2, a second claim by the run, re-used the run's own
// slot). S1 renews a millisecond later; its write is not applied and its
// reply is lost, and it reads back S2's row. Were the two stamped apart
// only by their own writes, S1 would send S2's very bytes, confirm a write
// that never landed, and its Release would delete S2's row: run r2 would
// then claim the only slot while S2 still holds it.
func TestSlotsTwinRowIsNeverTakenForOwnRenewal(t *testing.T) {
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now), runlease.WithTTL(runlease.MinTTL)}
	scope := []runlease.Scope{runlease.NamedScope("gpu", 1)}

	s1, err := runlease.ClaimSlots(ctx, f, "r1", scope, opts...)
	require.NoError(t, err)
	s2, err := runlease.ClaimSlots(ctx, f, "r1", scope, opts...) // re-uses r1's own slot
	require.NoError(t, err)
	s2Row := get(t, f, "runslot:gpu:0")

	clk.Advance(time.Millisecond)
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	_ = s1.Renew(ctx) // its slot is S2's now: dropped, whatever it reports
	require.Equal(t, s2Row, get(t, f, "runslot:gpu:0"), "S1's renewal wrote nothing")
	require.Empty(t, s1.Held(), "S1 took S2's row for a renewal of its own")
	require.NoError(t, s1.Release(ctx))
	require.Equal(t, s2Row, get(t, f, "runslot:gpu:0"), "S1's release left S2's slot alone")
	_, err = runlease.ClaimSlots(ctx, f, "r2", scope, opts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "limit 1: the slot is S2's")
	require.Len(t, s2.Held(), 1)
	require.NoError(t, s2.Renew(ctx))
}
