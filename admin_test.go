package runlease_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

func TestLeasesListsEveryRun(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(clk.Now)}
	_, err := runlease.Acquire(t.Context(), s, "b", "B", opts...)
	require.NoError(t, err)
	a, err := runlease.Acquire(t.Context(), s, "a", "A", opts...)
	require.NoError(t, err)
	require.NoError(t, a.Release(t.Context()))
	put(t, s, "runlease:c", "garbage")

	all, err := runlease.Leases(t.Context(), s, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	require.Len(t, all, 3)
	assert.Equal(t, []string{"a", "b", "c"}, []string{all[0].RunID, all[1].RunID, all[2].RunID})
	assert.True(t, all[0].Released)
	assert.True(t, all[1].Live)
	assert.Equal(t, "B", all[1].Holder)
	assert.True(t, all[2].Corrupt)
	assert.Equal(t, "garbage", all[2].Row)
}

func TestForceRelease(t *testing.T) {
	t.Parallel()

	t.Run("keeps_the_fence_and_tells_the_holder", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		info, err := runlease.Peek(t.Context(), s, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.NoError(t, runlease.ForceRelease(t.Context(), s, info, runlease.WithClock(clk.Now)))

		require.ErrorIs(t, l.Renew(t.Context()), runlease.ErrReleased, "the stuck holder learns it")
		next, err := runlease.Acquire(t.Context(), s, "r1", "B", runlease.WithClock(clk.Now))
		require.NoError(t, err, "free at once")
		assert.Equal(t, l.Fence()+1, next.Fence(), "the next holder continues above the fence")
	})

	t.Run("is_conditional_on_the_row_read", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		info, err := runlease.Peek(t.Context(), s, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(time.Second)
		require.NoError(t, l.Renew(t.Context()), "the holder was alive after all")
		before := get(t, s, "runlease:r1")
		err = runlease.ForceRelease(t.Context(), s, info, runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrRowChanged)
		assert.Equal(t, before, get(t, s, "runlease:r1"))
		require.NoError(t, l.Renew(t.Context()))
	})

	t.Run("a_lease_its_holder_released_meanwhile_is_released_without_error", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		info, err := runlease.Peek(t.Context(), s, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(time.Second)
		require.NoError(t, l.Release(t.Context()), "the holder finished after all")
		tomb := get(t, s, "runlease:r1")

		wrote, err := runlease.ForceReleaseOutcome(t.Context(), s, info, runlease.WithClock(clk.Now))
		require.NoError(t, err, "releasing a released lease succeeds")
		assert.False(t, wrote, "the holder's tombstone was there first")
		assert.Equal(t, tomb, get(t, s, "runlease:r1"), "nothing written")
		require.NoError(t, runlease.ForceRelease(t.Context(), s, info, runlease.WithClock(clk.Now)))
	})

	t.Run("a_lease_taken_over_and_released_meanwhile_is_released_without_error", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		opts := []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(clk.Now)}
		_, err := runlease.Acquire(t.Context(), s, "r1", "A", opts...)
		require.NoError(t, err)
		info, err := runlease.Peek(t.Context(), s, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(2 * time.Minute)
		b, err := runlease.Acquire(t.Context(), s, "r1", "B", opts...)
		require.NoError(t, err)
		require.NoError(t, b.Release(t.Context()))

		wrote, err := runlease.ForceReleaseOutcome(t.Context(), s, info, runlease.WithClock(clk.Now))
		require.NoError(t, err, "a tombstone above the fence read")
		assert.False(t, wrote)
	})

	t.Run("a_lease_taken_over_meanwhile_is_refused", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		opts := []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(clk.Now)}
		_, err := runlease.Acquire(t.Context(), s, "r1", "A", opts...)
		require.NoError(t, err)
		info, err := runlease.Peek(t.Context(), s, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(2 * time.Minute)
		_, err = runlease.Acquire(t.Context(), s, "r1", "B", opts...)
		require.NoError(t, err)
		before := get(t, s, "runlease:r1")

		wrote, err := runlease.ForceReleaseOutcome(t.Context(), s, info, runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrTakenOver)
		assert.False(t, wrote)
		var lost *runlease.LeaseLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, "B", lost.Holder)
		assert.Equal(t, uint64(2), lost.Fence)
		assert.Equal(t, before, get(t, s, "runlease:r1"), "nothing written")
	})

	t.Run("an_already_released_lease_succeeds_and_writes_nothing", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.NoError(t, l.Release(t.Context()))
		info, err := runlease.Peek(t.Context(), s, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.True(t, info.Released)
		before := get(t, s, "runlease:r1")

		wrote, err := runlease.ForceReleaseOutcome(t.Context(), s, info, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.False(t, wrote)
		assert.Equal(t, before, get(t, s, "runlease:r1"))
	})

	t.Run("a_release_that_writes_says_so", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		_, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		info, err := runlease.Peek(t.Context(), s, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		wrote, err := runlease.ForceReleaseOutcome(t.Context(), s, info, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.True(t, wrote)
	})

	t.Run("a_lost_reply_over_the_holders_identical_release_is_not_claimed", func(t *testing.T) {
		t.Parallel()
		// The holder releases in the operator's millisecond, writing the
		// very tombstone the operator sends; the operator's write does not
		// apply and its reply is lost. Reading back its own bytes, it
		// cannot say it wrote them.
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		l, err := runlease.Acquire(t.Context(), f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		info, err := runlease.Peek(t.Context(), f, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS"), Then: func() {
			require.NoError(t, l.Release(t.Context()))
		}})
		wrote, err := runlease.ForceReleaseOutcome(t.Context(), f, info, runlease.WithClock(clk.Now))
		assert.False(t, wrote, "the tombstone is the holder's")
		require.ErrorIs(t, err, runlease.ErrOutcomeUnknown, "and no one can tell it from this call's")
		after, err := runlease.Peek(t.Context(), f, "r1", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.True(t, after.Released)

		// ForceRelease, which reports only that the lease is released,
		// succeeds in the same case.
		g, clk2 := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		l2, err := runlease.Acquire(t.Context(), g, "r1", "A", runlease.WithClock(clk2.Now))
		require.NoError(t, err)
		info3, err := runlease.Peek(t.Context(), g, "r1", runlease.WithClock(clk2.Now))
		require.NoError(t, err)
		g.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS"), Then: func() {
			require.NoError(t, l2.Release(t.Context()))
		}})
		require.NoError(t, runlease.ForceRelease(t.Context(), g, info3, runlease.WithClock(clk2.Now)))
	})

	t.Run("refuses_rows_it_must_not_touch", func(t *testing.T) {
		t.Parallel()
		s := newSQLite(t)
		put(t, s, "runlease:bad", "{")
		info, err := runlease.Peek(t.Context(), s, "bad")
		require.ErrorIs(t, err, runlease.ErrCorruptRow)
		require.ErrorIs(t, runlease.ForceRelease(t.Context(), s, info), runlease.ErrInvalidArgument)
		assert.Equal(t, "{", get(t, s, "runlease:bad"))

		absent, err := runlease.Peek(t.Context(), s, "none")
		require.NoError(t, err)
		require.ErrorIs(t, runlease.ForceRelease(t.Context(), s, absent), runlease.ErrInvalidArgument)
		assert.Len(t, rows(t, s), 1)
	})
}

func TestPruneRemovesOnlyOldFreeRows(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(clk.Now)}
	released, err := runlease.Acquire(t.Context(), s, "released", "A", opts...)
	require.NoError(t, err)
	require.NoError(t, released.Release(t.Context()))
	_, err = runlease.Acquire(t.Context(), s, "expired", "A", opts...)
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(t.Context(), s, "expired", []runlease.Scope{runlease.MemScope(2)}, opts...)
	require.NoError(t, err)
	put(t, s, "runlease:corrupt", "nope")
	clk.Advance(2 * time.Hour)
	_, err = runlease.Acquire(t.Context(), s, "live", "A", opts...)
	require.NoError(t, err)
	_, err = runlease.Acquire(t.Context(), s, "recent", "A", opts...)
	require.NoError(t, err)
	clk.Advance(5 * time.Minute) // "recent" expired 4 minutes ago

	_, err = runlease.Prune(t.Context(), s, -time.Second, runlease.WithClock(clk.Now))
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)

	p, err := runlease.Prune(t.Context(), s, time.Hour, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"released", "expired"}, p.Leases)
	assert.Equal(t, []string{"runslot:mem:0"}, p.Slots)
	left, err := runlease.Leases(t.Context(), s, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	var ids []string
	for _, l := range left {
		ids = append(ids, l.RunID)
	}
	assert.Equal(t, []string{"corrupt", "live", "recent"}, ids, "live, recent and corrupt rows stay")
}

func TestPruneCandidatesListWhatPruneRemovesAndRemoveNothing(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(clk.Now)}
	released, err := runlease.Acquire(t.Context(), s, "released", "A", opts...)
	require.NoError(t, err)
	require.NoError(t, released.Release(t.Context()))
	_, err = runlease.ClaimSlots(t.Context(), s, "released", []runlease.Scope{runlease.MemScope(2)}, opts...)
	require.NoError(t, err)
	clk.Advance(2 * time.Hour)
	_, err = runlease.Acquire(t.Context(), s, "live", "A", opts...)
	require.NoError(t, err)
	before := rows(t, s)

	_, err = runlease.PruneCandidates(t.Context(), s, -time.Second, runlease.WithClock(clk.Now))
	require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	want, err := runlease.PruneCandidates(t.Context(), s, time.Hour, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.Equal(t, []string{"released"}, want.Leases)
	assert.Equal(t, []string{"runslot:mem:0"}, want.Slots)
	assert.Equal(t, before, rows(t, s), "nothing removed")

	got, err := runlease.Prune(t.Context(), s, time.Hour, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

func TestPruneRemovesQueueRowsOfGoneWaiters(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(time.Minute), runlease.WithClock(clk.Now)}
	scope := []runlease.Scope{runlease.MemScope(1)}
	// A real wait leaves its principal's fair-share mark behind.
	held, err := runlease.ClaimSlots(t.Context(), s, "x", scope, opts...)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		slots, err := runlease.ClaimSlotsWait(t.Context(), s, "w", scope,
			append(opts, runlease.WithFairShare("team", 1), runlease.WithWaitPoll(runlease.MinWaitPoll))...)
		if err == nil {
			err = slots.Release(t.Context())
		}
		done <- err
	}()
	awaitQueued(t, s, 1)
	require.NoError(t, held.Release(t.Context()))
	require.NoError(t, <-done)
	marks, err := s.MetaScan(t.Context(), runlease.FairPrefix)
	require.NoError(t, err)
	require.Len(t, marks, 1)

	clocks, err := s.MetaScan(t.Context(), runlease.ClockPrefix)
	require.NoError(t, err)
	require.Len(t, clocks, 1, "the admission moved the scope's clock")

	entry := func(run string, tag int64, until time.Time) (string, string) {
		return pruneLineKey("mem", run, tag), `{"run":"` + run + `","waiter":"w-` + run + `","fence":0,"seq":1,"principal":"","weight":1,"priority":0,"units":1,"tag":` +
			strconv.FormatInt(tag, 10) + `,"enq_ms":` + strconv.FormatInt(epoch.UnixMilli(), 10) + `,"until_ms":` + strconv.FormatInt(until.UnixMilli(), 10) + `,"scopes":["mem"]}`
	}
	place := func(run, key string) string {
		return `{"waiter":"w-` + run + `","fence":0,"key":"` + key + `","until_ms":` + strconv.FormatInt(epoch.Add(time.Minute).UnixMilli(), 10) + `}`
	}
	deadKey, dead := entry("dead", 0, epoch.Add(time.Minute))
	put(t, s, deadKey, dead)
	put(t, s, "runplace:3:mem:dead", place("dead", deadKey))
	_, legacy := entry("old", 0, epoch.Add(time.Minute))
	put(t, s, "runqueue:3:mem:old", legacy)
	put(t, s, pruneLineKey("mem", "corrupt", 0), `{"run":"corrupt"`)
	put(t, s, "runfair:3:mem:bad", `{"finish":-1,"until_ms":1}`)
	// A principal whose mark is ahead of a live tag may have runs waiting:
	// its mark stays however old.
	put(t, s, "runfair:3:mem:ahead", `{"finish":9000000,"until_ms":`+strconv.FormatInt(epoch.Add(time.Minute).UnixMilli(), 10)+`}`)
	clk.Advance(2 * time.Hour)
	recentKey, recent := entry("recent", 0, clk.Now().Add(-time.Minute))
	put(t, s, recentKey, recent)
	liveKey, live := entry("live", 5_000_000, clk.Now().Add(time.Minute))
	put(t, s, liveKey, live)
	put(t, s, "runplace:3:mem:live", place("live", liveKey)) // old, but its entry is live
	before := rows(t, s)

	want, err := runlease.PruneCandidates(t.Context(), s, time.Hour, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.Equal(t, []string{deadKey, "runqueue:3:mem:old", "runplace:3:mem:dead", marks[0].Key}, want.Queue)
	assert.Equal(t, before, rows(t, s), "candidates remove nothing")

	got, err := runlease.Prune(t.Context(), s, time.Hour, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.Equal(t, want.Queue, got.Queue)
	var keys []string
	for _, prefix := range []string{runlease.QueuePrefix, runlease.LegacyQueuePrefix, runlease.PlacePrefix, runlease.FairPrefix, runlease.ClockPrefix} {
		left, err := s.MetaScan(t.Context(), prefix)
		require.NoError(t, err)
		for _, r := range left {
			keys = append(keys, r.Key)
		}
	}
	assert.Equal(t, []string{pruneLineKey("mem", "corrupt", 0), recentKey, liveKey, "runplace:3:mem:live",
		"runfair:3:mem:ahead", "runfair:3:mem:bad", clocks[0].Key}, keys,
		"live, recent and corrupt entries stay, with the place of a live one, a mark ahead of a live tag and the clock of a scope where a run waits")
	assert.Equal(t, `{"finish":-1,"until_ms":1}`, get(t, s, "runfair:3:mem:bad"), "a corrupt mark stays")
}

// pruneLineKey is the line key of an entry of run at priority 0 with tag,
// enqueued at epoch, in scope.
func pruneLineKey(scope, run string, tag int64) string {
	return fmt.Sprintf("%s%d:%s:%07d.%019d.%016d:%s", runlease.QueuePrefix, len(scope), scope, runlease.MaxPriority, tag, epoch.UnixMilli(), run)
}

func TestPruneLeavesAQueueEntryItsWaiterRenewed(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	key := pruneLineKey("mem", "r", 0)
	old := `{"run":"r","waiter":"w","fence":0,"seq":1,"principal":"","weight":1,"priority":0,"units":1,"tag":0,"enq_ms":` +
		strconv.FormatInt(epoch.UnixMilli(), 10) + `,"until_ms":` + strconv.FormatInt(epoch.UnixMilli()+1, 10) + `,"scopes":["mem"]}`
	put(t, s, key, old)
	clk.Advance(2 * time.Hour)
	want, err := runlease.PruneCandidates(t.Context(), s, time.Hour, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	require.Equal(t, []string{key}, want.Queue)
	// The waiter renews between the listing and the delete: the delete is
	// conditional on the row listed, so the renewed entry stays.
	renewed := strings.Replace(strings.Replace(old, `"seq":1`, `"seq":2`, 1),
		`"until_ms":`+strconv.FormatInt(epoch.UnixMilli()+1, 10), `"until_ms":`+strconv.FormatInt(clk.Now().Add(time.Minute).UnixMilli(), 10), 1)
	s2 := &renewBeforeDelete{Store: s, key: key, row: renewed}
	got, err := runlease.Prune(t.Context(), s2, time.Hour, runlease.WithClock(clk.Now))
	require.NoError(t, err)
	assert.Empty(t, got.Queue)
	assert.Equal(t, renewed, get(t, s, key))
}

// renewBeforeDelete writes row at key just before the first delete of key,
// as a waiter renewing its entry at that moment would.
type renewBeforeDelete struct {
	runlease.Store
	key, row string
	done     bool
}

func (r *renewBeforeDelete) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if key == r.key && !r.done {
		r.done = true
		if _, err := r.Store.MetaCAS(ctx, key, &expected, r.row); err != nil {
			return false, err
		}
	}
	return r.Store.MetaDelete(ctx, key, expected)
}
