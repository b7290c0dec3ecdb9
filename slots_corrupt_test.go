package runlease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestACorruptSlotRowBlocksOnlyItsSlot: a slot row that does not parse may
// be a live holder's, damaged, so it counts as one slot in use; the other
// slots of the scope are claimed as usual, by every kind of claim, and the
// row is never written over. Occupancy and ExplainSlots show it.
func TestACorruptSlotRowBlocksOnlyItsSlot(t *testing.T) {
	t.Parallel()
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ctx, s := t.Context(), st.open(t)
			gpu := runlease.NamedScope("gpu", 3)
			put(t, s, "runslot:gpu:1", "{oops")

			_, err := runlease.ClaimSlots(ctx, s, "r1", []runlease.Scope{gpu})
			require.NoError(t, err, "a claim of one slot")
			lease, err := runlease.Acquire(ctx, s, "r2", "D")
			require.NoError(t, err)
			_, err = lease.ClaimSlots(ctx, []runlease.Scope{gpu, runlease.MemScope(4)})
			require.NoError(t, err, "a fenced claim of two scopes")
			_, err = runlease.ClaimSlots(ctx, s, "r3", []runlease.Scope{gpu})
			var limit *runlease.ConcurrencyLimitError
			require.ErrorAs(t, err, &limit, "two runs and the corrupt row fill a scope of 3")
			assert.Equal(t, 3, limit.Held)
			assert.Equal(t, "{oops", get(t, s, "runslot:gpu:1"), "the corrupt row is never written over")

			occ, err := runlease.Occupancy(ctx, s)
			require.NoError(t, err)
			var corrupt []string
			for _, o := range occ {
				if o.Corrupt {
					corrupt = append(corrupt, o.Key)
				}
			}
			assert.Equal(t, []string{"runslot:gpu:1"}, corrupt)

			ex, err := runlease.ExplainSlots(ctx, s, "r3", []runlease.Scope{gpu})
			require.NoError(t, err)
			g := ex.Scopes[0]
			assert.Equal(t, 3, g.Used)
			assert.Equal(t, 1, g.Corrupt)
			assert.Equal(t, "capacity", g.BlockedBy)
			require.Len(t, g.Holders, 3)
			assert.Equal(t, runlease.SlotInfo{Scope: "gpu", Slot: 1, Key: "runslot:gpu:1", Corrupt: true}, g.Holders[1])
		})
	}
}

// TestWaitersWaitBesideACorruptSlotRow: with slot 0 of 2 corrupt and slot 1
// held, a waiter queues and waits rather than failing, and is admitted to
// slot 1 when it is released; the corrupt row is never written over.
func TestWaitersWaitBesideACorruptSlotRow(t *testing.T) {
	t.Parallel()
	ctx, s := t.Context(), newSQLite(t)
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 2)}
	put(t, s, "runslot:gpu:0", "{oops")
	holder, err := runlease.ClaimSlots(ctx, s, "r1", gpu)
	require.NoError(t, err)
	require.Equal(t, "runslot:gpu:1", holder.Held()[0].Key)

	res := waitInBackground(ctx, s, "r2", gpu)
	awaitWaiting(t, s, "r2", res)
	require.NoError(t, holder.Release(ctx))
	got := <-res
	require.NoError(t, got.err)
	require.Len(t, got.slots.Held(), 1)
	assert.Equal(t, "runslot:gpu:1", got.slots.Held()[0].Key)
	assert.Equal(t, "{oops", get(t, s, "runslot:gpu:0"))
}

// TestACorruptQueueEntryHoldsNoPlace: a queue entry that does not parse
// ranks nowhere and reserves nothing, even at the head of its line: other
// runs claim and wait as usual, and it is never written over. Its own run
// is not held back by it either (its new place is a row of its own); only
// a place row that does not parse stops its run from queueing in the scope
// (its place would be written over it): that wait fails with RUN-E002
// naming the row. Queues, which lists waiters, fails on the entry the same
// way, so that status surfaces show the row rather than hide it.
func TestACorruptQueueEntryHoldsNoPlace(t *testing.T) {
	t.Parallel()
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ctx, s := t.Context(), st.open(t)
			gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
			// At the head of the line: the smallest rank a key can hold.
			bad := linePrefix("gpu") + "0000000.0000000000000000000.0000000000000001:bad"
			put(t, s, bad, `{"run":`)

			holder, err := runlease.ClaimSlots(ctx, s, "r1", gpu)
			require.NoError(t, err)
			res := waitInBackground(ctx, s, "r2", gpu)
			awaitWaiting(t, s, "r2", res)
			require.NoError(t, holder.Release(ctx))
			got := <-res
			require.NoError(t, got.err, "the corrupt entry held nobody back")
			require.Len(t, got.slots.Held(), 1)
			require.NoError(t, got.slots.Release(ctx))

			sl, err := runlease.ClaimSlotsWait(ctx, s, "bad", gpu)
			require.NoError(t, err, "nor its own run")
			require.NoError(t, sl.Release(ctx))

			const badPlace = "runplace:3:gpu:bad2"
			put(t, s, badPlace, `{"waiter":`)
			_, err = runlease.ClaimSlotsWait(ctx, s, "bad2", gpu)
			var corrupt *runlease.CorruptRowError
			require.ErrorAs(t, err, &corrupt)
			assert.Equal(t, badPlace, corrupt.Key)
			assert.Equal(t, `{"waiter":`, get(t, s, badPlace), "the corrupt place is never written over")
			_, err = runlease.Queues(ctx, s)
			require.ErrorAs(t, err, &corrupt)
			assert.Equal(t, bad, corrupt.Key)
			assert.Equal(t, `{"run":`, get(t, s, bad), "the corrupt entry is never written over")
		})
	}
}

// TestAnEntryAtAKeyThatIsNotItsRankHoldsNoPlace: the line's order is its
// keys' order, so an entry whose key is not where its fields rank it (a
// row written by hand, or damaged) could jump the line: it does not parse,
// and holds no place.
func TestAnEntryAtAKeyThatIsNotItsRankHoldsNoPlace(t *testing.T) {
	t.Parallel()
	ctx, s := t.Context(), newSQLite(t)
	now := time.Now()
	e := plantedEntry{Run: "jumper", Waiter: "w1", Seq: 1, Tag: 5_000_000, EnqMS: now.UnixMilli(),
		UntilMS: now.Add(time.Hour).UnixMilli(), Scopes: []string{"gpu"}}
	moved := e
	moved.Tag = 0 // the key says tag 0, the entry 5,000,000
	put(t, s, moved.key("gpu"), e.json())

	sl, err := runlease.ClaimSlots(ctx, s, "r1", []runlease.Scope{runlease.NamedScope("gpu", 1)})
	require.NoError(t, err, "the misplaced entry reserves nothing")
	require.NoError(t, sl.Release(ctx))
	_, err = runlease.Queues(ctx, s)
	var corrupt *runlease.CorruptRowError
	require.ErrorAs(t, err, &corrupt)
	assert.Equal(t, moved.key("gpu"), corrupt.Key)
	assert.Equal(t, e.json(), get(t, s, moved.key("gpu")), "and is never written over")
}

// TestACorruptFairShareMarkIsLeftAsItIs: a principal's mark that does not
// parse is never written over: its runs are admitted as those of a
// principal without a mark, and the marks of the other scopes move as
// usual.
func TestACorruptFairShareMarkIsLeftAsItIs(t *testing.T) {
	t.Parallel()
	ctx, s := t.Context(), newSQLite(t)
	const bad = "runfair:3:gpu:p"
	put(t, s, bad, "{oops")
	scopes := []runlease.Scope{runlease.NamedScope("gpu", 1), runlease.NamedScope("cpu", 1)}
	sl, err := runlease.ClaimSlotsWait(ctx, s, "r1", scopes, runlease.WithFairShare("p", 1))
	require.NoError(t, err)
	require.Len(t, sl.Held(), 2)
	assert.Equal(t, "{oops", get(t, s, bad), "the corrupt mark is never written over")
	get(t, s, "runfair:3:cpu:p") // the other scope's mark moved
}
