package runlease_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

func TestClaimSlotsWaitIsWokenByARelease(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		scopes := []runlease.Scope{runlease.MemScope(1)}
		held, err := runlease.ClaimSlots(ctx, s, "holder", scopes)
		require.NoError(t, err)

		// A poll of an hour: only the release's wake-up can admit it in
		// the test's lifetime.
		done := make(chan error, 1)
		go func() {
			sl, err := runlease.ClaimSlotsWait(ctx, s, "waiter", scopes, runlease.WithWaitPoll(time.Hour))
			if err == nil {
				assert.Equal(t, "waiter", sl.Held()[0].RunID)
			}
			done <- err
		}()
		awaitQueued(t, s, 1)
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(queueRows(t, s)[0].Value), &entry))
		assert.Equal(t, "waiter", entry["run"])
		// Its entry is in the scope's line, and its place row says so.
		assert.Equal(t, lineRowOf(t, s, "mem", "waiter").Key, queueRows(t, s)[0].Key)
		assert.Contains(t, get(t, s, placeKeyOf("mem", "waiter")), `"key":"`+queueRows(t, s)[0].Key+`"`)

		require.NoError(t, held.Release(ctx))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("the waiter was not woken by the release")
		}
		assert.Empty(t, queueRows(t, s), "an admitted waiter leaves the queue")
		_, found, err := s.MetaGet(ctx, placeKeyOf("mem", "waiter"))
		require.NoError(t, err)
		assert.False(t, found, "and its place row")
		occ, err := runlease.Occupancy(ctx, s)
		require.NoError(t, err)
		require.Len(t, occ, 1)
		assert.Equal(t, "waiter", occ[0].RunID)
	})
}

func TestClaimSlotsWaitAdmitsAtOnceWithoutQueueing(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	cb := testkit.NewCountingBatcher(s)
	sl, err := runlease.ClaimSlotsWait(t.Context(), cb, "r", []runlease.Scope{runlease.MemScope(2), runlease.NamedScope("gpu", 8).Take(3)})
	require.NoError(t, err)
	assert.Len(t, sl.Held(), 4, "one mem slot and three gpu slots")
	// The store reads ranges (RangeReader): both scopes' slot rows, the
	// heads of their lines, their clocks and the run's own rows travel in
	// one call.
	assert.Equal(t, int64(1), cb.Scans.Load(), "one read for both scopes")
	assert.Equal(t, int64(1), cb.Batches.Load(), "every slot in one batch")
	assert.Zero(t, cb.CASes.Load(), "no queue entry written for a run admitted at once")
	assert.Empty(t, queueRows(t, s))
	for _, r := range libRows(t, s) {
		assert.False(t, strings.HasPrefix(r.Key, runlease.PlacePrefix), "no place row: %s", r.Key)
	}
}

func TestQueueBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx := t.Context()
	mem := runlease.MemScope(4)
	for name, call := range map[string]func() error{
		"zero units": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem.Take(0)})
			return err
		},
		"units over": func() error { _, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{mem.Take(5)}); return err },
		"weight 0": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem}, runlease.WithFairShare("p", 0))
			return err
		},
		"weight too big": func() error {
			_, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{mem}, runlease.WithFairShare("p", runlease.MaxWeight+1))
			return err
		},
		"principal NUL": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem}, runlease.WithFairShare("a\x00", 1))
			return err
		},
		"priority": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem}, runlease.WithPriority(runlease.MaxPriority+1))
			return err
		},
		"poll": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, "r", []runlease.Scope{mem}, runlease.WithWaitPoll(time.Nanosecond))
			return err
		},
		"empty run": func() error { _, err := runlease.ClaimSlotsWait(ctx, s, "", []runlease.Scope{mem}); return err },
		"run too long": func() error {
			_, err := runlease.ClaimSlotsWait(ctx, s, strings.Repeat("r", 1020), []runlease.Scope{mem})
			return err
		},
		"poll on a claim": func() error {
			_, err := runlease.ClaimSlots(ctx, s, "r", []runlease.Scope{mem}, runlease.WithWaitPoll(time.Second))
			return err
		},
	} {
		err := call()
		assert.ErrorIs(t, err, runlease.ErrInvalidArgument, name)
	}
	assert.Empty(t, libRows(t, s))

	// A place row that does not parse is never written over: its run
	// cannot wait in the scope (its place would be written there), and
	// the wait says which row it is.
	put(t, s, placeKeyOf("mem", "bad"), `{"waiter":`)
	_, err := runlease.ClaimSlotsWait(ctx, s, "bad", []runlease.Scope{mem})
	var corrupt *runlease.CorruptRowError
	require.ErrorAs(t, err, &corrupt)
	assert.Equal(t, placeKeyOf("mem", "bad"), corrupt.Key)
	assert.Equal(t, []runlease.Row{{Key: placeKeyOf("mem", "bad"), Value: `{"waiter":`}}, libRows(t, s))
}

func TestQueueKeysOfColonNamesDoNotCollide(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// "principal:a" with run "b:x" and "principal:a:b" with run "x" would
	// share a key without the length of the scope's name in it.
	sa, sb := runlease.PrincipalScope("a", 1), runlease.PrincipalScope("a:b", 1)
	_, err := runlease.ClaimSlots(ctx, s, "h1", []runlease.Scope{sa})
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(ctx, s, "h2", []runlease.Scope{sb})
	require.NoError(t, err)
	go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "b:x", []runlease.Scope{sa}) }()
	go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "x", []runlease.Scope{sb}) }()
	awaitQueued(t, s, 2)
	var got []string
	for _, r := range queueRows(t, s) {
		scope, run, ok := parseLine(r.Key)
		require.True(t, ok, r.Key)
		got = append(got, scope+" "+run)
	}
	assert.ElementsMatch(t, []string{"principal:a b:x", "principal:a:b x"}, got, "each entry parses back to its own scope and run")
	// The place rows hold no rank between scope and run: without the
	// length of the scope's name both would be runplace:principal:a:b:x.
	assert.Contains(t, get(t, s, "runplace:11:principal:a:b:x"), `"key":"runline:11:principal:a:`)
	assert.Contains(t, get(t, s, "runplace:13:principal:a:b:x"), `"key":"runline:13:principal:a:b:`)
}

func TestLeaseClaimSlotsWaitIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		clk := testkit.NewClock(time.Now().UTC())
		opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
		scopes := []runlease.Scope{runlease.MemScope(1)}
		held, err := runlease.ClaimSlots(ctx, s, "x", scopes, runlease.WithTTL(time.Hour), runlease.WithClock(clk.Now))
		require.NoError(t, err)
		old, err := runlease.Acquire(ctx, s, "r", "A", opts...)
		require.NoError(t, err)

		done := make(chan error, 1)
		go func() {
			_, err := old.ClaimSlotsWait(ctx, scopes, runlease.WithWaitPoll(runlease.MinWaitPoll))
			done <- err
		}()
		awaitQueued(t, s, 1)
		// The lease expires and another driver takes the run over; the
		// old driver's waiter must be admitted nowhere.
		clk.Advance(runlease.MinTTL + time.Second)
		newer, err := runlease.Acquire(ctx, s, "r", "B", opts...)
		require.NoError(t, err)
		require.NoError(t, held.Release(ctx))
		err = <-done
		require.ErrorIs(t, err, runlease.ErrLeaseLost)
		occ, err := runlease.Occupancy(ctx, s)
		require.NoError(t, err)
		assert.Empty(t, occ, "no slot taken by the superseded driver")
		assert.Empty(t, queueRows(t, s), "and its place is gone")

		sl, err := newer.ClaimSlotsWait(ctx, scopes)
		require.NoError(t, err)
		assert.Len(t, sl.Held(), 1)
	})
}

func TestLeaseClaimSlotsOptions(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	l, err := runlease.Acquire(t.Context(), s, "r", "A")
	require.NoError(t, err)
	_, err = l.ClaimSlots(t.Context(), []runlease.Scope{runlease.MemScope(1)}, runlease.WithTTL(time.Minute))
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, "the TTL is the lease's")
	_, err = l.ClaimSlotsWait(t.Context(), []runlease.Scope{runlease.MemScope(1)}, runlease.WithClock(time.Now))
	require.ErrorIs(t, err, runlease.ErrInvalidArgument, "so is the clock")
	sl, err := l.ClaimSlots(t.Context(), []runlease.Scope{runlease.MemScope(1)}, runlease.WithPriority(3), runlease.WithFairShare("p", 2))
	require.NoError(t, err)
	assert.Len(t, sl.Held(), 1)
	if errors.Is(err, runlease.ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestExplainSlotsSaysWhyARunWaits(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		gpu, mem := runlease.NamedScope("gpu", 4), runlease.MemScope(8)
		holder, err := runlease.ClaimSlots(ctx, s, "holder", []runlease.Scope{gpu.Take(3)})
		require.NoError(t, err)
		go func() {
			_, _ = runlease.ClaimSlotsWait(ctx, s, "heavy", []runlease.Scope{gpu.Take(2)},
				runlease.WithFairShare("team-a", 2), runlease.WithPriority(1))
		}()
		awaitQueued(t, s, 1)
		go func() { _, _ = runlease.ClaimSlotsWait(ctx, s, "mine", []runlease.Scope{mem, gpu}) }()
		awaitQueued(t, s, 3) // mine waits in both scopes, as one claim
		before := libRows(t, s)

		ex, err := runlease.ExplainSlots(t.Context(), s, "mine", []runlease.Scope{mem, gpu})
		require.NoError(t, err)
		assert.False(t, ex.Admissible)
		require.Len(t, ex.Scopes, 2)
		m, g := ex.Scopes[0], ex.Scopes[1]
		assert.Equal(t, "mem", m.Scope)
		assert.True(t, m.Queued)
		assert.Equal(t, "", m.BlockedBy, "mem has room: it waits for gpu only")
		assert.Equal(t, 0, m.Position)

		assert.Equal(t, "gpu", g.Scope)
		assert.Equal(t, 4, g.Limit)
		assert.Equal(t, 3, g.Used)
		assert.Equal(t, 2, g.QueueLen)
		assert.True(t, g.Queued)
		assert.Equal(t, 1, g.Position)
		assert.Equal(t, 2, g.Reserved)
		assert.Equal(t, "order", g.BlockedBy, "one unit is free, but the heavy run ahead reserves it")
		require.Len(t, g.Ahead, 1)
		assert.Equal(t, "heavy", g.Ahead[0].RunID)
		assert.Equal(t, "team-a", g.Ahead[0].Principal)
		assert.Equal(t, 1, g.Ahead[0].Priority)
		assert.Equal(t, 2, g.Ahead[0].Units)
		require.Len(t, g.Holders, 3)
		assert.Equal(t, "holder", g.Holders[0].RunID)

		// The heavy run itself is held back by capacity alone.
		ex, err = runlease.ExplainSlots(t.Context(), s, "heavy", []runlease.Scope{gpu.Take(2)})
		require.NoError(t, err)
		assert.Equal(t, "capacity", ex.Scopes[0].BlockedBy)
		assert.Equal(t, 0, ex.Scopes[0].Position)

		// A run that is not queued is told where a claim would rank.
		ex, err = runlease.ExplainSlots(t.Context(), s, "newcomer", []runlease.Scope{gpu})
		require.NoError(t, err)
		assert.False(t, ex.Scopes[0].Queued)
		assert.Equal(t, 2, ex.Scopes[0].Position)
		ex, err = runlease.ExplainSlots(t.Context(), s, "urgent", []runlease.Scope{gpu}, runlease.WithPriority(2))
		require.NoError(t, err)
		assert.True(t, ex.Admissible, "a higher priority ranks ahead of both")

		ws, err := runlease.Queues(t.Context(), s)
		require.NoError(t, err)
		var got []string
		for _, w := range ws {
			got = append(got, w.Scope+"/"+w.RunID+"/"+strconv.Itoa(w.Position))
		}
		assert.Equal(t, []string{"gpu/heavy/0", "gpu/mine/1", "mem/mine/0"}, got)

		assert.Equal(t, before, libRows(t, s), "explaining writes nothing")
		require.NoError(t, holder.Release(t.Context()))
	})
}

// ExplainSlots says "Admissible: a claim made now would be admitted in
// every scope", explaining the claim "as for ClaimSlots". It ranks the run
// at the enqueue time now, where ClaimSlots ranks it behind every waiter
// it ties with (claimRank: enq_ms MaxInt64): a waiter whose tag the claim
// ties (a new principal's claim starts at the head's tag) and whose
// enqueue time is now, or later by another host's clock, is ahead of the
// claim for ClaimSlots, and must be ahead of it for the explanation too.
func TestExplainSlotsAgreesWithClaimSlots(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, s runlease.Store) {
		ctx := t.Context()
		now := time.Now().Truncate(time.Millisecond)
		clock := runlease.WithClock(func() time.Time { return now })
		plant(t, s, plantedEntry{Run: "z", Waiter: "wz", Seq: 1, Principal: "pz", EnqMS: now.UnixMilli(),
			UntilMS: now.Add(time.Hour).UnixMilli(), Scopes: []string{"mem"}})
		mem := []runlease.Scope{runlease.MemScope(1)}

		ex, err := runlease.ExplainSlots(ctx, s, "a", mem, clock)
		require.NoError(t, err)
		_, claimErr := runlease.ClaimSlots(ctx, s, "a", mem, clock)
		assert.Equal(t, ex.Admissible, claimErr == nil,
			"ExplainSlots says admissible=%v (position %d, blocked by %q); ClaimSlots made at the same instant: %v",
			ex.Admissible, ex.Scopes[0].Position, ex.Scopes[0].BlockedBy, claimErr)
	})
}
