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

// TestSlotRowsBelongToOneClaim: a slot row is the row of the one claim
// that wrote it, as a lease's row is its Lease's. A second claim of the
// same run (a driver that abandoned its claim, or a later driver while an
// earlier one's keeper still runs) takes rows of its own, or is refused
// when the scope has no room beside the first claim's: it never re-uses
// the first's row, so its Release can never free a slot the first still
// trusts and let another run past the limit.
func TestSlotRowsBelongToOneClaim(t *testing.T) {
	t.Parallel()
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()

			t.Run("a_second_claim_takes_a_row_of_its_own", func(t *testing.T) {
				t.Parallel()
				ctx, s := t.Context(), st.open(t)
				mem := []runlease.Scope{runlease.MemScope(3)}
				_, err := runlease.ClaimSlots(ctx, s, "other", mem)
				require.NoError(t, err)
				first, err := runlease.ClaimSlots(ctx, s, "r1", mem)
				require.NoError(t, err)
				firstRow := get(t, s, first.Held()[0].Key)
				second, err := runlease.ClaimSlots(ctx, s, "r1", mem)
				require.NoError(t, err)
				require.Len(t, second.Held(), 1)
				assert.NotEqual(t, first.Held()[0].Key, second.Held()[0].Key, "the second claim took the first's row")
				assert.Equal(t, firstRow, get(t, s, first.Held()[0].Key), "the second claim wrote over the first's row")

				require.NoError(t, second.Release(ctx))
				assert.Equal(t, firstRow, get(t, s, first.Held()[0].Key), "the second's release freed the first's slot")
				require.NoError(t, first.Renew(ctx))
				require.Len(t, first.Held(), 1)
				_, err = runlease.ClaimSlots(ctx, s, "r2", mem)
				require.NoError(t, err, "the second claim's slot is free again")
				_, err = runlease.ClaimSlots(ctx, s, "r3", mem)
				require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "other, r1's first claim and r2 fill the scope")
			})

			t.Run("a_second_claim_in_a_full_scope_is_refused", func(t *testing.T) {
				t.Parallel()
				ctx, s := t.Context(), st.open(t)
				gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
				first, err := runlease.ClaimSlots(ctx, s, "r1", gpu)
				require.NoError(t, err)
				before := rows(t, s)
				second, err := runlease.ClaimSlots(ctx, s, "r1", gpu)
				if err == nil {
					// Shared with the first: its release frees the row the
					// first still trusts, and r2 takes the slot.
					require.NoError(t, second.Release(ctx))
					_, err2 := runlease.ClaimSlots(ctx, s, "r2", gpu)
					t.Fatalf("the second claim shared the first's row (r2's claim after its release: %v)", err2)
				}
				var limit *runlease.ConcurrencyLimitError
				require.ErrorAs(t, err, &limit)
				assert.Equal(t, 1, limit.Held, "the first claim's row is in use")
				assert.Equal(t, before, rows(t, s), "a refusal writes nothing")

				require.NoError(t, first.Release(ctx))
				_, err = runlease.ClaimSlots(ctx, s, "r1", gpu)
				require.NoError(t, err, "released, the slot is free for the run again")
			})

			t.Run("an_explanation_counts_the_runs_own_rows_as_used", func(t *testing.T) {
				t.Parallel()
				ctx, s := t.Context(), st.open(t)
				gpu := []runlease.Scope{runlease.NamedScope("gpu", 2)}
				_, err := runlease.ClaimSlots(ctx, s, "r1", gpu)
				require.NoError(t, err)
				_, err = runlease.ClaimSlots(ctx, s, "other", gpu)
				require.NoError(t, err)
				ex, err := runlease.ExplainSlots(ctx, s, "r1", gpu)
				require.NoError(t, err)
				g := ex.Scopes[0]
				assert.Equal(t, 2, g.Used)
				assert.Equal(t, 1, g.Own)
				assert.Equal(t, "capacity", g.BlockedBy, "a new claim of r1 needs a slot of its own")
				assert.False(t, ex.Admissible)
			})
		})
	}
}

// TestSlotRowsOfAnEarlierDriverStayItsOwn: the driver of run r claims the
// only slot of a scope and keeps it with KeepSlotsStrict. The same holder
// re-enters the run (a restarted driver, while the first still runs) and
// claims through its new lease: the slot is the first claim's, so the
// claim is refused rather than written over it. Had it re-used the row,
// its release would free the slot the first keeper still trusts, and a
// second run would hold a scope of limit 1 beside it.
func TestSlotRowsOfAnEarlierDriverStayItsOwn(t *testing.T) {
	t.Parallel()
	for _, st := range slotStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ctx, s := t.Context(), st.open(t)
			mem := []runlease.Scope{runlease.MemScope(1)}
			first, err := runlease.Acquire(ctx, s, "r", "D1")
			require.NoError(t, err)
			slots, err := first.ClaimSlots(ctx, mem)
			require.NoError(t, err)
			k, err := runlease.Keep(ctx, first, runlease.KeepSlotsStrict(slots))
			require.NoError(t, err)
			t.Cleanup(k.Stop)
			row := get(t, s, slots.Held()[0].Key)

			again, err := runlease.Acquire(ctx, s, "r", "D1") // re-entry: a higher fence
			require.NoError(t, err)
			second, err := again.ClaimSlots(ctx, mem)
			if err == nil {
				require.NoError(t, second.Release(ctx))
				_, err2 := runlease.ClaimSlots(ctx, s, "other", mem)
				t.Fatalf("the later driver's claim shared the kept slot (another run's claim after its release: %v)", err2)
			}
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
			assert.Equal(t, row, get(t, s, slots.Held()[0].Key), "the kept slot's row is untouched")
			_, err = runlease.ClaimSlots(ctx, s, "other", mem)
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the kept claim still fills the scope")
		})
	}
}

// TestSlotRowsOfAnAbandonedClaimFreeAtTheirExpiry: a claim that is dropped
// without a release (its driver died) leaves its row live: the run's next
// claim is refused while the scope has no room beside it, for at most the
// row's TTL, and then takes the slot as any free one.
func TestSlotRowsOfAnAbandonedClaimFreeAtTheirExpiry(t *testing.T) {
	t.Parallel()
	ctx, s, clk := t.Context(), newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	_, err := runlease.ClaimSlots(ctx, s, "r", gpu, opts...)
	require.NoError(t, err)
	clk.Advance(runlease.MinTTL - time.Millisecond)
	_, err = runlease.ClaimSlots(ctx, s, "r", gpu, opts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the abandoned claim's row may still be trusted")
	clk.Advance(time.Millisecond)
	again, err := runlease.ClaimSlots(ctx, s, "r", gpu, opts...)
	require.NoError(t, err, "expired, the row is a free slot")
	require.Len(t, again.Held(), 1)
}

// TestSlotRowsOfAnEarlierClaimMakeAWaitOfTheRunWait: ClaimSlotsWait of a run
// whose earlier claim holds the only slot queues, rather than taking that
// claim's row, and is admitted once the earlier claim releases it.
func TestSlotRowsOfAnEarlierClaimMakeAWaitOfTheRunWait(t *testing.T) {
	t.Parallel()
	ctx, s := t.Context(), newSQLite(t)
	gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	first, err := runlease.ClaimSlots(ctx, s, "r", gpu)
	require.NoError(t, err)
	res := waitInBackground(ctx, s, "r", gpu)
	awaitWaiting(t, s, "r", res)
	require.Len(t, first.Held(), 1, "the earlier claim still holds its slot")

	require.NoError(t, first.Release(ctx))
	got := <-res
	require.NoError(t, got.err)
	require.Len(t, got.slots.Held(), 1)
	require.NoError(t, got.slots.Release(ctx))
	left, err := s.MetaScan(ctx, runlease.SlotPrefix)
	require.NoError(t, err)
	assert.Empty(t, left, "released, the wait's slot is freed")
}

// TestSlotRenewalInDoubtNeverTakesAnotherProcesssRow: a Slots here holds
// run r's only slot, 30 s TTL, and renews it 10 s in; its write is not
// applied and its reply is lost. Meanwhile run r is claimed from another
// process whose clock runs 30 s ahead, with a 10 s TTL: the row here has
// expired by that clock, and the new row's until_ms is the one the
// renewal here sent. Rows of two processes are stamped apart by nothing
// but their claim ids, so the Slots here must not read that row back as
// its renewal landed (confirmed), nor, on its next renewal, as its write in
// doubt that landed after all (adopted and written over); and its Release
// must leave the row alone.
func TestSlotRenewalInDoubtNeverTakesAnotherProcesssRow(t *testing.T) {
	t.Parallel()
	const key = "runslot:gpu:0"
	paths := []struct {
		name string
		// renew renews mine while another writer takes its row; it
		// returns the renewal's error.
		renew func(t *testing.T, f *testkit.Faulty, mine *runlease.Slots, take func()) error
	}{
		{"read_back_at_once", func(t *testing.T, f *testkit.Faulty, mine *runlease.Slots, take func()) error {
			f.Next(testkit.Fault{Err: testkit.Unknown("MetaCAS"), Then: take})
			return mine.Renew(t.Context())
		}},
		{"read_back_on_the_next_renewal", func(t *testing.T, f *testkit.Faulty, mine *runlease.Slots, take func()) error {
			f.Next(testkit.Fault{Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
			require.True(t, runlease.IsOutcomeUnknown(mine.Renew(t.Context())), "the renewal's outcome is unknown")
			require.Len(t, mine.Held(), 1, "a renewal in doubt keeps its slot")
			take()
			return mine.Renew(t.Context())
		}},
	}
	for _, w := range slotWriters {
		for _, p := range paths {
			t.Run(w.name+"/"+p.name, func(t *testing.T) {
				t.Parallel()
				ctx, f := t.Context(), &testkit.Faulty{Store: newSQLite(t)}
				clk := testkit.NewClock(epoch)
				here := process{f, 1}
				gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
				mine, err := runlease.ClaimSlots(ctx, here, "r", gpu, runlease.WithClock(clk.Now), runlease.WithTTL(30*time.Second))
				require.NoError(t, err)

				clk.Advance(10 * time.Second)
				var theirs string
				take := func() {
					w.write(t, f, key, epoch.Add(30*time.Second), 10*time.Second)
					theirs = get(t, f, key)
				}
				_ = p.renew(t, f, mine, take) // its slot is the other process's: dropped, whatever it reports
				require.NotEmpty(t, theirs)
				assert.Equal(t, theirs, get(t, f, key), "the renewal here wrote over the other process's row")
				require.Empty(t, mine.Held(), "the Slots here took the other process's row for its own")
				require.NoError(t, mine.Release(ctx))
				assert.Equal(t, theirs, get(t, f, key), "the release here deleted the other process's row")
				_, err = runlease.ClaimSlots(ctx, f, "other", gpu, runlease.WithClock(clk.Now))
				require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "limit 1: the slot is the other process's")
			})
		}
	}
}

// TestSlotRowsOfAnyFenceAreRead: slot rows carry a claim id in their fence
// field; the reference writes 0 there. Rows of either kind, and of any
// fence, are live slots of their run to Occupancy and ExplainSlots (and so
// to the CLI and the status page), are counted as slots in use by every
// claim, the run's own included, and are never written over or deleted by
// a claim or a Release of the run that did not write them.
func TestSlotRowsOfAnyFenceAreRead(t *testing.T) {
	t.Parallel()
	ctx, s := t.Context(), newSQLite(t)
	until := epoch.Add(time.Minute)
	ms := strconv.FormatInt(until.UnixMilli(), 10)
	fences := []string{"0", "1", "9223372036854775807", "18446744073709551615"}
	for i, fence := range fences {
		put(t, s, "runslot:gpu:"+strconv.Itoa(i), `{"holder":"r","fence":`+fence+`,"until_ms":`+ms+`}`)
	}
	before := rows(t, s)
	opts := []runlease.Option{runlease.WithClock(func() time.Time { return epoch })}
	gpu := []runlease.Scope{runlease.NamedScope("gpu", len(fences))}

	occ, err := runlease.Occupancy(ctx, s, opts...)
	require.NoError(t, err)
	require.Len(t, occ, len(fences))
	for i, o := range occ {
		assert.Equal(t, runlease.SlotInfo{Scope: "gpu", Slot: i, RunID: "r", Until: until, Key: "runslot:gpu:" + strconv.Itoa(i)}, o)
	}
	ex, err := runlease.ExplainSlots(ctx, s, "r", gpu, opts...)
	require.NoError(t, err)
	require.Len(t, ex.Scopes, 1)
	assert.Equal(t, len(fences), ex.Scopes[0].Used)
	assert.Equal(t, len(fences), ex.Scopes[0].Own)
	assert.Zero(t, ex.Scopes[0].Corrupt)
	assert.Equal(t, occ, ex.Scopes[0].Holders)
	assert.False(t, ex.Admissible)

	_, err = runlease.ClaimSlots(ctx, s, "r", gpu, opts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the run's rows of other claims are in use")
	_, err = runlease.ClaimSlots(ctx, s, "other", gpu, opts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
	cpu, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{runlease.MemScope(1)}, opts...)
	require.NoError(t, err)
	require.NoError(t, cpu.Release(ctx))
	assert.Equal(t, before, rows(t, s), "a claim or a release of the run touched rows it did not write")
}

// TestSlotsTwinRowIsNeverTakenForOwnRenewal: two Slots values of run r1
// hold the same slot: S2, a second claim by the run whose clock runs a TTL
// ahead of S1's, found S1's row expired and took the slot. S1, 30 s TTL,
// renews 10 s after its claim; S2, 10 s TTL, claimed at S1's expiry by its
// own clock, so both aim at the same until_ms. S1's write is not applied
// and its reply is lost, and it reads back S2's row. Were the two stamped
// apart only by their own writes, S1 would send S2's very bytes, confirm a
// write that never landed, and its Release would delete S2's row: run r2
// would then claim the only slot while S2 still holds it.
func TestSlotsTwinRowIsNeverTakenForOwnRenewal(t *testing.T) {
	ctx := t.Context()
	f, clk1, clk2 := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch), testkit.NewClock(epoch.Add(30*time.Second))
	opts := []runlease.Option{runlease.WithClock(clk1.Now), runlease.WithTTL(30 * time.Second)}
	opts2 := []runlease.Option{runlease.WithClock(clk2.Now), runlease.WithTTL(10 * time.Second)}
	scope := []runlease.Scope{runlease.NamedScope("gpu", 1)}

	s1, err := runlease.ClaimSlots(ctx, f, "r1", scope, opts...)
	require.NoError(t, err)
	s2, err := runlease.ClaimSlots(ctx, f, "r1", scope, opts2...) // S1's row is expired by S2's clock
	require.NoError(t, err)
	s2Row := get(t, f, "runslot:gpu:0")

	clk1.Advance(10 * time.Second)
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	_ = s1.Renew(ctx) // its slot is S2's now: dropped, whatever it reports
	require.Equal(t, s2Row, get(t, f, "runslot:gpu:0"), "S1's renewal wrote nothing")
	require.Empty(t, s1.Held(), "S1 took S2's row for a renewal of its own")
	require.NoError(t, s1.Release(ctx))
	require.Equal(t, s2Row, get(t, f, "runslot:gpu:0"), "S1's release left S2's slot alone")
	_, err = runlease.ClaimSlots(ctx, f, "r2", scope, opts2...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "limit 1: the slot is S2's")
	require.Len(t, s2.Held(), 1)
	require.NoError(t, s2.Renew(ctx))
}

// TestSlotsRowOfAnotherClaimOfTheRunIsNotAdopted: S2, a second claim by
// run r1 whose clock runs a TTL ahead, found S1's row expired and took the
// slot, so the row names r1 but is S2's. S1's renewal is refused and reads
// S2's row back: a row of its run that none of its own writes in doubt
// could have stored. S1 gives the slot up rather than adopt it, and its
// Release leaves S2's slot alone.
func TestSlotsRowOfAnotherClaimOfTheRunIsNotAdopted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	scope := []runlease.Scope{runlease.NamedScope("gpu", 1)}
	clk, ahead := testkit.NewClock(epoch), testkit.NewClock(epoch.Add(runlease.MinTTL))
	s1, err := runlease.ClaimSlots(ctx, s, "r1", scope, runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
	require.NoError(t, err)
	s2, err := runlease.ClaimSlots(ctx, s, "r1", scope, runlease.WithTTL(runlease.MinTTL), runlease.WithClock(ahead.Now))
	require.NoError(t, err)
	s2Row := get(t, s, "runslot:gpu:0")

	_ = s1.Renew(ctx) // its slot is S2's now: dropped, whatever it reports
	require.Empty(t, s1.Held(), "S1 adopted S2's row")
	require.Equal(t, s2Row, get(t, s, "runslot:gpu:0"), "S1's renewal wrote nothing")
	require.NoError(t, s1.Release(ctx))
	require.Equal(t, s2Row, get(t, s, "runslot:gpu:0"), "S1's release left S2's slot alone")
	require.Len(t, s2.Held(), 1)
	require.NoError(t, s2.Renew(ctx))
}

// TestSlotsOfOneRunThroughAWrapperAreStampedApart: a run's successor
// driver, whose clock runs ahead, claims the run's slot through a
// decorator of the store its predecessor used, once the predecessor's row
// is expired by its clock, aiming at the until_ms of the predecessor's
// renewal whose outcome is unknown (30 s TTL, renewed at 10 s; 10 s TTL,
// claimed at 30 s). The predecessor's release must not take the
// successor's row for its own renewal and delete it while the successor
// holds it: the successor's row carries a claim id of its own, so it never
// equals a row the predecessor sent, whichever Store value each used. (The
// lineages' looking through Unwrap is what
// TestLineageLeasesThroughAWrapperAndItsStoreAreStampedApart checks.)
func TestSlotsOfOneRunThroughAWrapperAreStampedApart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := &testkit.Faulty{Store: newSQLite(t)}
	clk, ahead := testkit.NewClock(epoch), testkit.NewClock(epoch.Add(30*time.Second))
	opts := []runlease.Option{runlease.WithClock(clk.Now), runlease.WithTTL(30 * time.Second)}
	aheadOpts := []runlease.Option{runlease.WithClock(ahead.Now), runlease.WithTTL(10 * time.Second)}
	mem := []runlease.Scope{runlease.MemScope(1)}
	before, err := runlease.ClaimSlots(ctx, f, "r", mem, opts...)
	require.NoError(t, err)
	clk.Advance(10 * time.Second)
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	require.Error(t, before.Renew(ctx), "the renewal's outcome is unknown")

	after, err := runlease.ClaimSlots(ctx, wrapped{f}, "r", mem, aheadOpts...)
	require.NoError(t, err)
	row := get(t, f, "runslot:mem:0")
	require.NoError(t, before.Release(ctx))
	assert.Equal(t, row, get(t, f, "runslot:mem:0"), "the successor's row is not the predecessor's to delete")
	require.NoError(t, after.Renew(ctx))
	_, err = runlease.ClaimSlots(ctx, f, "other", mem, aheadOpts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the run still holds the slot")
}

// TestSlotRefusedRenewalIsNotConfirmedByAnEqualRow: a refused slot
// renewal whose read-back equals the row it sent is not confirmed. A second
// Slots of the same run, whose clock runs ahead so that the first's row is
// expired to it, takes the run's slot while the first Slots' renewal is on
// its way, aiming at the very until_ms that renewal sends (30 s TTL renewed
// at 10 s; 10 s TTL claimed at 30 s); the renewal is refused and read back.
// Were it confirmed, the first Slots would believe it wrote the second's
// row, and its Release would delete it: the second Slots would still hold
// its slot, another run would claim the freed one, and two runs would hold
// a scope of limit 1.
func TestSlotRefusedRenewalIsNotConfirmedByAnEqualRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
	ahead := testkit.NewClock(epoch.Add(30 * time.Second))
	opts := []runlease.Option{runlease.WithClock(clk.Now), runlease.WithTTL(30 * time.Second)}
	aheadOpts := []runlease.Option{runlease.WithClock(ahead.Now), runlease.WithTTL(10 * time.Second)}
	scopes := []runlease.Scope{runlease.MemScope(1)}
	s1, err := runlease.ClaimSlots(ctx, f, "R", scopes, opts...)
	require.NoError(t, err)

	clk.Advance(10 * time.Second)
	var s2 *runlease.Slots
	f.Next(testkit.Fault{Apply: false, Then: func() {
		var err error
		s2, err = runlease.ClaimSlots(ctx, f, "R", scopes, aheadOpts...)
		require.NoError(t, err)
	}})
	_ = s1.Renew(ctx)
	require.NotNil(t, s2)
	require.Len(t, s2.Held(), 1)
	s2Row := get(t, f, "runslot:mem:0")

	require.NoError(t, s1.Release(ctx))
	_, found, err := f.MetaGet(ctx, "runslot:mem:0")
	require.NoError(t, err)
	require.True(t, found, "s1's Release deleted s2's slot row %s", s2Row)

	_, err = runlease.ClaimSlots(ctx, f, "R2", scopes, aheadOpts...)
	require.ErrorIs(t, err, runlease.ErrConcurrencyLimit,
		"R2 claimed the slot that R still holds through s2: two runs in a scope of limit 1")
}
