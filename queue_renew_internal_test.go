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
	roomStoresInBubble(t, func(t *testing.T, s roomStore) {
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

// slowRenewStore is a built-in store whose MetaCASMany calls (the
// waiters' entry renewals) take delay to reach the store, as on a loaded
// server. A call whose context ends first is, by default, passed on with
// that context, so the store reports the cut as it would; with inFlight,
// it reports what a networked store reports for a statement cut in flight:
// the outcome is unknown (the rows are untouched, as the read-back finds).
type slowRenewStore struct {
	roomStore
	delay    time.Duration
	inFlight bool
}

func (s *slowRenewStore) MetaCASMany(ctx context.Context, writes []CASWrite) ([]bool, error) {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		if s.inFlight {
			return nil, &StorageError{Op: "MetaCASMany", Err: ctx.Err(), Unknown: true}
		}
	}
	return s.roomStore.(MultiCASer).MetaCASMany(ctx, writes)
}

// mixedTTLs runs, for three minutes of a bubble's time, one waiter with a
// TTL of a minute ("long") and four with the least TTL, all of one process
// on one Store value, on a scope held by another run, and returns what the
// SlotsRequeued hook told of the long waiter and how its wait ended.
func mixedTTLs(t *testing.T, s *slowRenewStore, longPoll time.Duration) (longRequeues []string, longErr error) {
	scopes := []Scope{NamedScope("mixed-ttl", 1)}
	held, err := ClaimSlots(t.Context(), s, "holder", scopes, WithTTL(time.Hour))
	require.NoError(t, err)
	defer held.Release(context.Background())

	var mu sync.Mutex
	reasons := map[string][]string{}
	hooks := WithHooks(Hooks{SlotsRequeued: func(e RequeueEvent) {
		mu.Lock()
		reasons[e.RunID] = append(reasons[e.RunID], e.Reason)
		mu.Unlock()
	}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	longDone := make(chan error, 1)
	wg.Go(func() {
		_, err := ClaimSlotsWait(ctx, s, "long", scopes, WithTTL(time.Minute), WithWaitPoll(longPoll), hooks)
		longDone <- err
	})
	for i := range 4 {
		wg.Go(func() {
			// Queued a moment apart, as runs come.
			time.Sleep(time.Duration(i) * 700 * time.Millisecond)
			_, _ = ClaimSlotsWait(ctx, s, fmt.Sprint("short-", i), scopes, WithTTL(MinTTL), WithWaitPoll(time.Hour), hooks)
		})
	}
	// Three minutes: the long waiter renews some nine times, each renewal
	// with some 40 s to land.
	select {
	case longErr = <-longDone:
	case <-time.After(3 * time.Minute):
	}
	synctest.Wait()
	mu.Lock()
	longRequeues = reasons["long"]
	t.Logf("%d short waiters lost their place at least once", len(reasons)-min(1, len(longRequeues)))
	mu.Unlock()
	cancel()
	wg.Wait()
	if longErr == nil {
		longErr = <-longDone
	}
	return longRequeues, longErr
}

// TestAShortTTLWaiterDoesNotCutALongTTLWaitersRenewal: waiters of one
// process on one Store value, one with a TTL of a minute, four with the
// least TTL (5 s). Renewals take 3.5 s to reach the store: longer than the
// short waiters' trust leaves them (they lose their places, as promised),
// but nothing to a waiter with a minute's TTL, whose renewal has some 40 s
// to land. The long waiter must keep its place: it is not paused, its
// store answers well within its TTL, and a call carrying renewals of both
// kinds runs until the latest trust end among them.
func TestAShortTTLWaiterDoesNotCutALongTTLWaitersRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The beats renewals fall on count from a process-wide origin
		// read outside the bubble: pin it to the bubble's start, so that
		// every run of the test sees the same schedule. (Without it the
		// test fails in most processes, not all: it depends on where the
		// waiters' writes fall between beats.)
		origin := entryBeatOrigin
		entryBeatOrigin = time.Now()
		defer func() { entryBeatOrigin = origin }()
		s := &slowRenewStore{roomStore: roomSQLite(t), delay: 3500 * time.Millisecond}
		requeues, err := mixedTTLs(t, s, time.Hour)
		assert.ErrorIs(t, err, context.Canceled, "the long waiter waited until it was cancelled")
		assert.Empty(t, requeues, "the long waiter never lost its place")
	})
}

// TestARenewalIsNotCutAtAnotherRenewalsTrustEnd: two renewals of one Store
// value go in one MetaCASMany call, one whose entries are trusted for
// another second, one whose entries are trusted for another minute. The
// store takes two seconds to answer (honouring its context). The first
// renewal is of no use after its second; the second has 58 s to spare, and
// the call carrying it is not cut at the first one's trust end: it lands.
func TestARenewalIsNotCutAtAnotherRenewalsTrustEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeMulti()
		f.gate = make(chan struct{}) // the call waits for it, or for its context to end...
		f.rows["short"], f.rows["long"] = "old", "old"
		opened := make(chan struct{})
		go func() {
			time.Sleep(2 * time.Second) // ...or after two seconds, when the store answers
			close(f.gate)
			close(opened)
		}()
		type res struct {
			sw  []bool
			err error
		}
		short, long := make(chan res, 1), make(chan res, 1)
		go func() {
			sw, err := renewEntries(t.Context(), f, f, []CASWrite{put("short", "old", "new")}, time.Now().Add(time.Second))
			short <- res{sw, err}
		}()
		go func() {
			sw, err := renewEntries(t.Context(), f, f, []CASWrite{put("long", "old", "new")}, time.Now().Add(time.Minute))
			long <- res{sw, err}
		}()
		<-short
		r := <-long
		<-opened
		synctest.Wait()
		assert.NoError(t, r.err, "the renewal trusted for a minute is not cut at another's trust end")
		assert.Equal(t, []bool{true}, r.sw, "and it lands")
	})
}

// slowWriteStore is a built-in store whose entry writes (MetaBatch, the
// way a waiter takes its place, and MetaCASMany, the way it renews it)
// take latency to reach the store, honouring their context: a loaded
// server, a long network path.
type slowWriteStore struct {
	roomStore
	latency time.Duration
}

func (s *slowWriteStore) wait(ctx context.Context) {
	t := time.NewTimer(s.latency)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (s *slowWriteStore) MetaBatch(ctx context.Context, conds []Cond, ops []Op) (bool, error) {
	s.wait(ctx)
	return s.roomStore.MetaBatch(ctx, conds, ops)
}

func (s *slowWriteStore) MetaCASMany(ctx context.Context, writes []CASWrite) ([]bool, error) {
	s.wait(ctx)
	return s.roomStore.(MultiCASer).MetaCASMany(ctx, writes)
}

// TestWaitersOfOneTTLKeepTheirPlacesOnAStoreThatAnswersInTwoSeconds: three
// waiters of one process, one TTL (5 s), queued half a second apart, on a
// store whose writes take 2 s. Each renewal is sent between 1.25 and
// 1.67 s after the last write and trusted until 4.5 s after it: it has
// 2.8 s or more to land, and a write lands in 2 s, so no waiter loses its
// place (none is paused, the store answers well within their TTL): a
// renewal due while another waiter's call is in flight goes in a call of
// its own rather than wait for that one.
func TestWaitersOfOneTTLKeepTheirPlacesOnAStoreThatAnswersInTwoSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		origin := entryBeatOrigin // see TestAShortTTLWaiterDoesNotCutALongTTLWaitersRenewal
		entryBeatOrigin = time.Now()
		defer func() { entryBeatOrigin = origin }()

		s := &slowWriteStore{roomStore: roomSQLite(t), latency: 2 * time.Second}
		scopes := []Scope{NamedScope("slow-writes", 1)}
		held, err := ClaimSlots(t.Context(), s.roomStore, "holder", scopes, WithTTL(time.Hour))
		require.NoError(t, err)
		defer held.Release(context.Background())

		var mu sync.Mutex
		var reasons []string
		hooks := WithHooks(Hooks{SlotsRequeued: func(e RequeueEvent) {
			mu.Lock()
			reasons = append(reasons, e.RunID+": "+e.Reason)
			mu.Unlock()
		}})
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 500 * time.Millisecond)
				_, err := ClaimSlotsWait(ctx, s, fmt.Sprint("w", i), scopes, WithTTL(MinTTL), WithWaitPoll(time.Hour), hooks)
				assert.ErrorIs(t, err, context.Canceled)
			})
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		got := append([]string(nil), reasons...)
		mu.Unlock()
		cancel()
		wg.Wait()
		assert.Empty(t, got, "no waiter lost its place")
	})
}

// deafRenewStore is a built-in store whose MetaCASMany calls take delay
// to answer whatever their context says, and then apply.
type deafRenewStore struct {
	roomStore
	delay time.Duration
}

func (s *deafRenewStore) MetaCASMany(ctx context.Context, writes []CASWrite) ([]bool, error) {
	time.Sleep(s.delay)
	return s.roomStore.(MultiCASer).MetaCASMany(context.WithoutCancel(ctx), writes)
}

// TestARenewalConfirmedAfterItsTrustEndGivesThePlaceUp: a waiter's renewal
// lands, but is confirmed only after its entries' trust ended (the store
// took 4 s, ignoring the call's deadline). Others may have seen the
// entries expire meanwhile and moved ahead, so the waiter does not keep
// its place: it is told it stalled, and queues again.
func TestARenewalConfirmedAfterItsTrustEndGivesThePlaceUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &deafRenewStore{roomStore: roomSQLite(t), delay: 4 * time.Second}
		scopes := []Scope{NamedScope("late-renewal", 1)}
		held, err := ClaimSlots(t.Context(), s, "holder", scopes, WithTTL(time.Hour))
		require.NoError(t, err)
		defer held.Release(context.Background())
		requeued := make(chan RequeueEvent, 8)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			_, _ = ClaimSlotsWait(ctx, s, "late", scopes, WithTTL(MinTTL), WithWaitPoll(time.Hour),
				WithHooks(Hooks{SlotsRequeued: func(e RequeueEvent) { requeued <- e }}))
		}()
		synctest.Wait()
		// Renewed 1.25–1.67 s after it queued, confirmed 4 s later: after
		// its trust end at 4.5 s.
		time.Sleep(6 * time.Second)
		synctest.Wait()
		require.NotEmpty(t, requeued, "the waiter gave its place up")
		assert.Equal(t, "the waiter stalled past its TTL", (<-requeued).Reason)
		cancel()
		synctest.Wait()
	})
}
