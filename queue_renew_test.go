package runlease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// renewCounter passes every call through to a built-in store and counts
// the entry writes: batches (a waiter taking its place) and many-write
// calls (renewals).
type renewCounter struct {
	roomStore
	batches, multis, multiWrites, reads atomic.Int64
}

func (c *renewCounter) MetaScan(ctx context.Context, prefix string) ([]Row, error) {
	c.reads.Add(1)
	return c.roomStore.MetaScan(ctx, prefix)
}

func (c *renewCounter) MetaScanMany(ctx context.Context, prefixes []string) ([][]Row, error) {
	c.reads.Add(1)
	return c.roomStore.(MultiScanner).MetaScanMany(ctx, prefixes)
}

// MetaRanges reads as the built-in stores do, counted as one read.
func (c *renewCounter) MetaRanges(ctx context.Context, ranges []Range) ([][]Row, error) {
	c.reads.Add(1)
	return c.roomStore.(RangeReader).MetaRanges(ctx, ranges)
}

func (c *renewCounter) MetaBatch(ctx context.Context, conds []Cond, ops []Op) (bool, error) {
	c.batches.Add(1)
	return c.roomStore.MetaBatch(ctx, conds, ops)
}

func (c *renewCounter) MetaCASMany(ctx context.Context, writes []CASWrite) ([]bool, error) {
	c.multis.Add(1)
	c.multiWrites.Add(int64(len(writes)))
	return c.roomStore.(MultiCASer).MetaCASMany(ctx, writes)
}

// TestAProcesssWaitersRenewTheirEntriesTogether: 30 waiters of one process
// wait on two full scopes for longer than a TTL. Their entries are renewed
// in a few shared calls, not one batch per waiter per renewal, and without
// reading the scopes (a renewal brings no news of them); every renewal
// lands, so no waiter loses its place; and a waiter that leaves takes its
// entries out.
func TestAProcesssWaitersRenewTheirEntriesTogether(t *testing.T) {
	t.Parallel()
	const n = 30
	roomStores(t, func(t *testing.T, s roomStore) {
		t.Parallel()
		c := &renewCounter{roomStore: s}
		scopes := []Scope{NamedScope("renew-a", 1), NamedScope("renew-b", 2)}
		held, err := ClaimSlots(t.Context(), c, "holder", scopes[:1], WithTTL(time.Minute))
		require.NoError(t, err)
		defer held.Release(context.Background())

		var requeued atomic.Int64
		hooks := WithHooks(Hooks{SlotsRequeued: func(e RequeueEvent) {
			requeued.Add(1)
			t.Logf("%s requeued after %v: %s", e.RunID, e.Waited, e.Reason)
		}})
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				_, err := ClaimSlotsWait(ctx, c, "renewing-"+strconv.Itoa(i), scopes, WithTTL(MinTTL), WithWaitPoll(time.Hour), hooks)
				errs <- err
			})
		}
		require.Eventually(t, func() bool {
			q, err := s.MetaScan(t.Context(), lineScopePrefix("renew-b"))
			return err == nil && len(q) == n
		}, 30*time.Second, time.Millisecond)
		placed := c.batches.Load()
		// Reads in flight when the last entry landed end within moments.
		time.Sleep(100 * time.Millisecond)
		reads := c.reads.Load()

		// Long enough for every entry to be renewed at least twice:
		// renewals come at most a third of the TTL apart.
		time.Sleep(MinTTL)
		calls, writes := c.multis.Load(), c.multiWrites.Load()
		reads = c.reads.Load() - reads
		q, err := s.MetaScan(t.Context(), lineScopePrefix("renew-a"))
		require.NoError(t, err)
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			require.ErrorIs(t, err, context.Canceled)
		}

		t.Logf("%d renewal calls carried %d entry writes; %d batches placed the waiters, %d more while they waited; %d reads",
			calls, writes, placed, c.batches.Load()-placed, reads)
		// The waiters still look when an entry ahead of them would have
		// expired had it not been renewed: one read per scope they share,
		// about once a TTL, where reading before each renewal made one
		// per waiter and scope every third of it (180 here).
		assert.LessOrEqual(t, reads, int64(3*len(scopes)), "renewing reads nothing")
		assert.Len(t, q, n, "every waiter is still queued after a TTL")
		assert.Zero(t, requeued.Load(), "no waiter lost its place")
		assert.Equal(t, placed, c.batches.Load(), "no entry was renewed alone")
		assert.GreaterOrEqual(t, writes, int64(2*2*n), "each waiter renewed its two entries at least twice")
		assert.LessOrEqual(t, calls*6, writes, "renewals are sent together: three waiters a call at least, on average")

		for _, sc := range scopes {
			left, err := s.MetaScan(t.Context(), lineScopePrefix(sc.name))
			require.NoError(t, err)
			assert.Empty(t, left, "the waiters took their entries out of %s", sc.name)
		}
	})
}

// fakeMulti is a MultiCASer over a map, whose calls can be held at a gate,
// recording the keys of every call.
type fakeMulti struct {
	Store // nil: only the calls below are made

	mu    sync.Mutex
	rows  map[string]string
	calls [][]string
	fail  error // returned by the next call, after it applied its writes
	cut   int   // calls that returned because their context ended

	gate chan struct{} // when not nil, a call waits for it
	in   chan struct{} // when not nil, a call says it arrived
}

func newFakeMulti() *fakeMulti { return &fakeMulti{rows: map[string]string{}} }

func (f *fakeMulti) MetaCASMany(ctx context.Context, writes []CASWrite) ([]bool, error) {
	if f.in != nil {
		f.in <- struct{}{}
	}
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			f.mu.Lock()
			f.cut++
			f.mu.Unlock()
			return nil, &StorageError{Op: "MetaCASMany", Err: ctx.Err(), Unknown: true}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, len(writes))
	swapped := make([]bool, len(writes))
	for i, w := range writes {
		keys[i] = w.Key
		cur, found := f.rows[w.Key]
		if (w.Expected == nil && !found) || (w.Expected != nil && found && cur == *w.Expected) {
			f.rows[w.Key] = w.Value
			swapped[i] = true
		}
	}
	f.calls = append(f.calls, keys)
	if err := f.fail; err != nil {
		f.fail = nil
		return nil, err
	}
	return swapped, nil
}

func (f *fakeMulti) MetaGet(ctx context.Context, key string) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.rows[key]
	return v, ok, nil
}

func (f *fakeMulti) sent() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]string(nil), f.calls...)
}

func put(key, expected, value string) CASWrite {
	return CASWrite{Key: key, Expected: &expected, Value: value}
}

// renewAsync starts renewEntries and returns its outcome on a channel.
type renewResult struct {
	swapped []bool
	err     error
}

func renewAsync(ctx context.Context, f *fakeMulti, writes ...CASWrite) chan renewResult {
	out := make(chan renewResult, 1)
	go func() {
		sw, err := renewEntries(ctx, f, f, writes, time.Now().Add(time.Minute))
		out <- renewResult{sw, err}
	}()
	return out
}

// TestRenewalsThatArriveDuringACallGoTogetherWithoutWaitingForIt: a call
// hangs; ten renewals that arrive meanwhile go together, in one call sent
// while the first is still in flight, and each gets its own outcome.
func TestRenewalsThatArriveDuringACallGoTogetherWithoutWaitingForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeMulti()
		f.gate, f.in = make(chan struct{}), make(chan struct{}, 16)
		for i := range 11 {
			f.rows[fmt.Sprint("k", i)] = "old"
		}
		first := renewAsync(t.Context(), f, put("k0", "old", "new"))
		<-f.in // the first call is in flight, alone
		var rest []chan renewResult
		for i := 1; i <= 10; i++ {
			// The last renewal expects a row it does not hold.
			exp := "old"
			if i == 10 {
				exp = "other"
			}
			rest = append(rest, renewAsync(t.Context(), f, put(fmt.Sprint("k", i), exp, "new")))
		}
		<-f.in // the second call went, the first still hanging
		synctest.Wait()
		assert.Len(t, f.in, 0, "two calls, not more")
		close(f.gate)

		r := <-first
		require.NoError(t, r.err)
		assert.Equal(t, []bool{true}, r.swapped)
		for i, ch := range rest {
			r := <-ch
			require.NoError(t, r.err)
			assert.Equal(t, []bool{i != 9}, r.swapped, "renewal %d gets its own outcome", i+1)
		}
		calls := f.sent()
		require.Len(t, calls, 2)
		for _, c := range calls {
			slices.Sort(c)
		}
		assert.ElementsMatch(t, [][]string{{"k0"}, {"k1", "k10", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"}}, calls)
		synctest.Wait()
		entryBatches.mu.Lock()
		defer entryBatches.mu.Unlock()
		assert.Nil(t, entryBatches.m[f], "no batch is left open")
	})
}

func TestTwoRenewalsOfOneKeyGoInSeparateCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeMulti()
		f.rows["k"] = "old"
		a := renewAsync(t.Context(), f, put("k", "old", "a"))
		b := renewAsync(t.Context(), f, put("k", "old", "b"))
		ra, rb := <-a, <-b
		require.NoError(t, ra.err)
		require.NoError(t, rb.err)
		assert.Len(t, f.sent(), 2, "one key, two calls")
		assert.ElementsMatch(t, []bool{true, false}, []bool{ra.swapped[0], rb.swapped[0]},
			"one lands, the other finds the row it wrote")
	})
}

func TestARenewalWithdrawnBeforeItIsSentIsNeverSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeMulti()
		f.rows["a"], f.rows["k"] = "old", "old"
		opener := renewAsync(t.Context(), f, put("a", "old", "new"))
		ctx, cancel := context.WithCancel(t.Context())
		gone := renewAsync(ctx, f, put("k", "old", "new"))
		synctest.Wait() // both wait: the opener for the others to join
		cancel()
		r := <-gone
		require.ErrorIs(t, r.err, context.Canceled)
		require.NoError(t, (<-opener).err)
		assert.Equal(t, [][]string{{"a"}}, f.sent())
		v, _, _ := f.MetaGet(t.Context(), "k")
		assert.Equal(t, "old", v)

		// The renewal that opened a batch and gives up while it waits
		// for the others is not sent either; the others are.
		ctx, cancel = context.WithCancel(t.Context())
		gone = renewAsync(ctx, f, put("k", "old", "new"))
		synctest.Wait()
		other := renewAsync(t.Context(), f, put("a", "new", "newer"))
		synctest.Wait()
		cancel()
		require.ErrorIs(t, (<-gone).err, context.Canceled)
		require.NoError(t, (<-other).err)
		assert.Equal(t, [][]string{{"a"}, {"a"}}, f.sent())
	})
}

func TestACallWhoseWaitersAllGaveUpIsCutShort(t *testing.T) {
	synctest.Test(t, testACallWhoseWaitersAllGaveUpIsCutShort)
}

func testACallWhoseWaitersAllGaveUpIsCutShort(t *testing.T) {
	f := newFakeMulti()
	f.gate, f.in = make(chan struct{}), make(chan struct{}, 16)
	f.rows["a"], f.rows["b"] = "old", "old"
	ctxA, cancelA := context.WithCancel(t.Context())
	ctxB, cancelB := context.WithCancel(t.Context())
	a := renewAsync(ctxA, f, put("a", "old", "new"))
	b := renewAsync(ctxB, f, put("b", "old", "new"))
	<-f.in // one call carries both (the first waited for the second)
	cancelA()
	require.ErrorIs(t, (<-a).err, context.Canceled)
	f.mu.Lock()
	assert.Zero(t, f.cut, "the call still has a waiter")
	f.mu.Unlock()
	cancelB()
	require.ErrorIs(t, (<-b).err, context.Canceled)
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.cut == 1
	}, 10*time.Second, time.Millisecond, "the call is cut once no waiter is left")
	require.Eventually(t, func() bool {
		entryBatches.mu.Lock()
		defer entryBatches.mu.Unlock()
		return entryBatches.m[f] == nil
	}, 10*time.Second, time.Millisecond, "and the flusher leaves")
}

func TestARenewalWhoseTrustEndedIsNotSent(t *testing.T) {
	f := newFakeMulti()
	f.rows["k"] = "old"
	sw, err := renewEntries(t.Context(), f, f, []CASWrite{put("k", "old", "new")}, time.Now().Add(-time.Millisecond))
	require.NoError(t, err)
	assert.Equal(t, []bool{false}, sw, "reported as not applied: the waiter queues again")
	assert.Empty(t, f.sent())
}

func TestARenewalWhoseCallFailedInDoubtIsReadBack(t *testing.T) {
	f := newFakeMulti()
	f.rows["a"], f.rows["b"] = "old", "else"
	f.fail = &StorageError{Op: "MetaCASMany", Err: errors.New("connection reset"), Unknown: true}
	sw, err := renewEntries(t.Context(), f, f, []CASWrite{put("a", "old", "new"), put("b", "old", "new")}, time.Now().Add(time.Minute))
	require.NoError(t, err, "every write resolved by its row")
	assert.Equal(t, []bool{true, false}, sw, "a holds what was sent; b holds neither")

	f.rows["c"] = "old"
	f.fail = &StorageError{Op: "MetaCASMany", Err: errors.New("connection reset"), Unknown: true}
	sw, err = renewEntries(t.Context(), f, f, []CASWrite{put("c", "older", "new")}, time.Now().Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, []bool{false}, sw, "c holds another row: not applied")
}

func TestARenewalBadBeforeItIsSentFailsAlone(t *testing.T) {
	f := newFakeMulti()
	_, err := renewEntries(t.Context(), f, f, []CASWrite{put("k", "a", "x"), put("k", "a", "y")}, time.Now().Add(time.Minute))
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Empty(t, f.sent())
}

func TestEntryRenewalsFallOnSharedBeats(t *testing.T) {
	ttl := MinTTL
	beat := ttl / 12
	for _, wrote := range []time.Time{
		entryBeatOrigin, entryBeatOrigin.Add(time.Millisecond), entryBeatOrigin.Add(beat - time.Nanosecond),
		entryBeatOrigin.Add(beat), entryBeatOrigin.Add(7*beat + 123*time.Microsecond), time.Now(),
	} {
		due := entryRenewalDue(wrote, ttl)
		after := due.Sub(wrote)
		assert.GreaterOrEqual(t, after, ttl/4, "due no sooner than a quarter of the TTL")
		assert.LessOrEqual(t, after, ttl/3, "due no later than a third of the TTL")
		assert.Zero(t, due.Sub(entryBeatOrigin)%beat, "due on a beat")
	}
	// Waiters that wrote within one beat renew together; a renewal sent on
	// a beat is due a third of the TTL later.
	assert.True(t, entryRenewalDue(entryBeatOrigin.Add(time.Millisecond), ttl).
		Equal(entryRenewalDue(entryBeatOrigin.Add(beat-time.Millisecond), ttl)))
	on := entryBeatOrigin.Add(40 * beat)
	assert.True(t, on.Add(4*beat).Equal(entryRenewalDue(on.Add(50*time.Microsecond), ttl)))
}

// TestARenewalDoesNotPutTheNextLookOff: a waiter whose entries are renewed
// before its poll is due still looks at the scope when the poll is due,
// not a poll interval after the renewal.
func TestARenewalDoesNotPutTheNextLookOff(t *testing.T) {
	least := func(int64) int64 { return 0 } // every jitter at its least: 3/4 of the interval
	jitterDraw.Store(&least)
	defer jitterDraw.Store(nil)
	synctest.Test(t, func(t *testing.T) {
		c := &renewCounter{roomStore: roomSQLite(t)}
		scopes := []Scope{NamedScope("looking", 1)}
		_, err := ClaimSlots(t.Context(), c, "holder", scopes, WithTTL(time.Hour))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		// Renewed between 1.25 and 1.67 s after it queued; polled at
		// 1.8 s (3/4 of 2.4 s).
		go func() {
			_, _ = ClaimSlotsWait(ctx, c, "waiter", scopes, WithTTL(MinTTL), WithWaitPoll(2400*time.Millisecond))
		}()
		synctest.Wait()
		reads, renewals := c.reads.Load(), c.multis.Load()
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, int64(1), c.multis.Load()-renewals, "renewed once")
		assert.Equal(t, int64(1), c.reads.Load()-reads, "looked once, at the poll")
		cancel()
		synctest.Wait()
	})
}
