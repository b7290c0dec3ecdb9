package runlease

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
