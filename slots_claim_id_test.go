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

// TestSlotLeftoverIsNeverAnotherProcesssRow: a claim of run r here sends
// its row and the outcome is unknown; it did not land. The process
// remembers the row as its leftover, trusted by no Slots. Then run r is
// claimed from another process (a second driver, or the reference) in the
// same millisecond with the same TTL: the very row this process sent,
// but for the claim id. The other process's row is in use: the run's next
// claim here does not take it as a free slot, and a Release of the run
// here does not delete it, so a third run is not admitted past the limit.
func TestSlotLeftoverIsNeverAnotherProcesssRow(t *testing.T) {
	t.Parallel()
	const key = "runslot:gpu:0"
	ttl := runlease.DefaultTTL
	steps := []struct {
		name string
		do   func(t *testing.T, here runlease.Store, opts []runlease.Option)
	}{
		{"a_claim_here_does_not_take_it", func(t *testing.T, here runlease.Store, opts []runlease.Option) {
			_, err := runlease.ClaimSlots(t.Context(), here, "r", []runlease.Scope{runlease.NamedScope("gpu", 1)}, opts...)
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "a claim here took the other process's row for its leftover")
		}},
		{"a_release_here_does_not_delete_it", func(t *testing.T, here runlease.Store, opts []runlease.Option) {
			cpu, err := runlease.ClaimSlots(t.Context(), here, "r", []runlease.Scope{runlease.NamedScope("cpu", 1)}, opts...)
			require.NoError(t, err)
			require.NoError(t, cpu.Release(t.Context()))
		}},
	}
	for _, w := range slotWriters {
		for _, step := range steps {
			t.Run(w.name+"/"+step.name, func(t *testing.T) {
				t.Parallel()
				ctx, f := t.Context(), &testkit.Faulty{Store: newSQLite(t)}
				here := process{f, 1}
				opts := []runlease.Option{runlease.WithClock(func() time.Time { return epoch }), runlease.WithTTL(ttl)}
				gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}

				f.Next(testkit.Fault{Err: testkit.Unknown("MetaCAS")}) // sent; it never lands
				_, err := runlease.ClaimSlots(ctx, here, "r", gpu, opts...)
				require.True(t, runlease.IsOutcomeUnknown(err), "the claim's outcome is unknown: %v", err)
				require.Empty(t, rows(t, f), "the claim's write did not land")

				w.write(t, f, key, epoch, ttl)
				theirs := get(t, f, key)

				step.do(t, here, opts)
				assert.Equal(t, theirs, get(t, f, key), "the other process's row was written over or deleted")
				_, err = runlease.ClaimSlots(ctx, f, "other", gpu, opts...)
				require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "limit 1: the slot is the other process's")
			})
		}
	}
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

// TestSlotRowOfAnotherProcessPutBackIsNoLeftover: on a store without
// batches, a claim here of scopes gpu and cpu writes over run r's expired
// row in gpu, a row another process wrote, and then loses cpu to another
// run: it puts gpu's row back as it was. That row is not one this process
// sent, so it is nobody's leftover here: a Release of the run here leaves
// it (its writer's clock may not have let it expire yet).
func TestSlotRowOfAnotherProcessPutBackIsNoLeftover(t *testing.T) {
	t.Parallel()
	const key = "runslot:gpu:0"
	for _, w := range slotWriters {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			ctx, f := t.Context(), &testkit.Faulty{Store: newSQLite(t)}
			here := &testkit.PlainStore{Store: process{f, 1}}
			opts := []runlease.Option{runlease.WithClock(func() time.Time { return epoch })}
			gpu, cpu := runlease.NamedScope("gpu", 1), runlease.NamedScope("cpu", 1)
			w.write(t, f, key, epoch.Add(-time.Minute), 30*time.Second) // expired by the clock here
			theirs := get(t, f, key)

			f.Next(
				testkit.Fault{Apply: true}, // gpu: over the expired row
				testkit.Fault{Then: func() { // cpu: another run takes it first
					_, err := runlease.ClaimSlots(ctx, f, "other", []runlease.Scope{cpu}, opts...)
					require.NoError(t, err)
				}},
			)
			_, err := runlease.ClaimSlots(ctx, here, "r", []runlease.Scope{gpu, cpu}, opts...)
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit)
			require.Equal(t, theirs, get(t, f, key), "the rollback put the row back")

			mem, err := runlease.ClaimSlots(ctx, here, "r", []runlease.Scope{runlease.MemScope(1)}, opts...)
			require.NoError(t, err)
			require.NoError(t, mem.Release(ctx))
			assert.Equal(t, theirs, get(t, f, key), "a release here deleted the other process's row put back")
		})
	}
}
