package runlease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/wakeup"
)

// roomStore is what a built-in store offers a waiter.
type roomStore interface {
	Store
	Batcher
	DeleteNotifier
}

// scanCounter passes every call through to a built-in store and counts the
// reads of slot rows (one per read of a scope, whether a MetaRanges, a
// MetaScanMany or one MetaScan per prefix) and the admission batches the
// store refused. It hides RangeReader and MultiScanner; multiScanCounter
// adds MultiScanner back, rangeScanCounter both.
type scanCounter struct {
	roomStore
	reads, refused atomic.Int64
}

func (c *scanCounter) MetaScan(ctx context.Context, prefix string) ([]Row, error) {
	if strings.HasPrefix(prefix, SlotPrefix) {
		c.reads.Add(1)
	}
	return c.roomStore.MetaScan(ctx, prefix)
}

func (c *scanCounter) MetaBatch(ctx context.Context, conds []Cond, ops []Op) (bool, error) {
	ok, err := c.roomStore.MetaBatch(ctx, conds, ops)
	if err == nil && !ok {
		c.refused.Add(1)
	}
	return ok, err
}

type multiScanCounter struct{ *scanCounter }

func (c multiScanCounter) MetaScanMany(ctx context.Context, prefixes []string) ([][]Row, error) {
	c.reads.Add(1)
	return c.roomStore.(MultiScanner).MetaScanMany(ctx, prefixes)
}

// rangeScanCounter adds RangeReader back, as the built-in stores offer it:
// a call that reads slot rows counts as one read of the scopes.
type rangeScanCounter struct{ multiScanCounter }

func (c rangeScanCounter) MetaRanges(ctx context.Context, ranges []Range) ([][]Row, error) {
	for _, r := range ranges {
		if strings.HasPrefix(r.Prefix, SlotPrefix) {
			c.reads.Add(1)
			break
		}
	}
	return c.roomStore.(RangeReader).MetaRanges(ctx, ranges)
}

// countedStore wraps c as a store that reads by ranges ("ranges", as the
// built-in stores do), by many scans in one call ("multiscan"), or by one
// scan per prefix ("scan").
func countedStore(c *scanCounter, mode string) Store {
	switch mode {
	case "ranges":
		return rangeScanCounter{multiScanCounter{c}}
	case "multiscan":
		return multiScanCounter{c}
	default:
		return c
	}
}

// readModes are the ways a store may read a scope (countedStore).
var readModes = []string{"ranges", "multiscan", "scan"}

// roomStores runs fn on a SQLite store in t.TempDir() and, when the
// Postgres tests are enabled, on a fresh table of the test server.
func roomStores(t *testing.T, fn func(t *testing.T, s roomStore)) {
	t.Run("sqlite", func(t *testing.T) {
		fn(t, roomSQLite(t))
	})
	t.Run("postgres", func(t *testing.T) {
		pool := pgtest.Pool(t)
		s, err := NewPostgres(t.Context(), pool, WithTable(pgtest.NewTable(t, pool)))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		fn(t, s)
	})
}

// roomStoresInBubble runs fn, in parallel, on a SQLite store in a
// synctest bubble, where the waits a rule needs (a TTL, a quiet spell)
// pass in fake time, and, when the Postgres tests are enabled and -short
// is not given, on a fresh table of the test server, in real time. It is
// for rules of the queue, which the SQLite run proves; fn must not call
// t.Parallel.
func roomStoresInBubble(t *testing.T, fn func(t *testing.T, s roomStore)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			fn(t, roomSQLite(t))
		})
	})
	t.Run("postgres", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a rule of the queue: the SQLite run proves it under -short")
		}
		t.Parallel()
		pool := pgtest.Pool(t)
		s, err := NewPostgres(t.Context(), pool, WithTable(pgtest.NewTable(t, pool)))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		fn(t, s)
	})
}

func roomSQLite(t *testing.T) *SQLiteStore {
	t.Helper()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// roomOf returns the room of store and scope, nil when there is none.
func roomOf(store Store, scope string) *room {
	rooms.mu.Lock()
	defer rooms.mu.Unlock()
	return rooms.m[roomKey{store: store, scope: scope}]
}

// roomRings returns how many rings the room of store and scope fanned out.
func roomRings(store Store, scope string) int64 {
	r := roomOf(store, scope)
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(r.rings)
}

// settle waits until the waiters have gone back to sleep: no read or ring
// for 300 ms.
func settle(t *testing.T, c *scanCounter, store Store, scope string) {
	t.Helper()
	reads, rings := int64(-1), int64(-1)
	require.Eventually(t, func() bool {
		r, g := c.reads.Load(), roomRings(store, scope)
		quiet := r == reads && g == rings
		reads, rings = r, g
		return quiet
	}, 30*time.Second, 300*time.Millisecond)
}

// TestAProcesssWaitersShareOneReadPerRing: 20 waiters of one process wait
// on a full scope; one slot is released. From the release until every
// waiter is asleep again, the scope is read at most once per ring the room
// fanned out, plus once per admission the store refused (its waiter reads
// again, after the refusal). Each waiter reading for itself made 20 reads
// of the ring.
func TestAProcesssWaitersShareOneReadPerRing(t *testing.T) {
	t.Parallel()
	const n = 20
	for _, mode := range readModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			roomStoresInBubble(t, func(t *testing.T, s roomStore) {
				c := &scanCounter{roomStore: s}
				store := countedStore(c, mode)
				name := "shared-" + mode
				scopes := []Scope{NamedScope(name, 1)}
				held, err := ClaimSlots(t.Context(), store, "holder", scopes)
				require.NoError(t, err)

				ctx, cancel := context.WithCancel(t.Context())
				admitted := make(chan *Slots, n)
				var wg sync.WaitGroup
				defer func() { cancel(); wg.Wait() }()
				for i := range n {
					wg.Go(func() {
						sl, err := ClaimSlotsWait(ctx, store, "waiter-"+strconv.Itoa(i), scopes, WithWaitPoll(time.Hour))
						if err == nil {
							admitted <- sl
						}
					})
				}
				require.Eventually(t, func() bool {
					q, err := s.MetaScan(t.Context(), lineScopePrefix(name))
					return err == nil && len(q) == n
				}, 30*time.Second, time.Millisecond)
				settle(t, c, store, name)

				reads, rings, refused := c.reads.Load(), roomRings(store, name), c.refused.Load()
				require.NoError(t, held.Release(t.Context()))
				var sl *Slots
				select {
				case sl = <-admitted:
				case <-time.After(30 * time.Second):
					t.Fatal("no waiter was admitted after the release")
				}
				settle(t, c, store, name)
				reads, rings, refused = c.reads.Load()-reads, roomRings(store, name)-rings, c.refused.Load()-refused
				t.Logf("%d reads, %d rings, %d refused admissions", reads, rings, refused)
				assert.GreaterOrEqual(t, rings, int64(1), "the release rang")
				assert.GreaterOrEqual(t, reads, int64(1), "the woken waiters read the scope")
				assert.LessOrEqual(t, reads, rings+refused, "one read per ring, whatever the number of waiters")
				require.NoError(t, sl.Release(t.Context()))
			})
		})
	}
}

// gatedScans is a store whose first scans wait for a gate to open, or for
// their context to end; later ones pass at once.
type gatedScans struct {
	roomStore
	gate  chan struct{}
	gated int64 // how many of the first scans wait
	scans atomic.Int64
}

func (g *gatedScans) MetaScanMany(ctx context.Context, prefixes []string) ([][]Row, error) {
	if g.scans.Add(1) > g.gated {
		return g.roomStore.(MultiScanner).MetaScanMany(ctx, prefixes)
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, &StorageError{Op: "MetaScanMany", Err: ctx.Err()}
	}
	return g.roomStore.(MultiScanner).MetaScanMany(ctx, prefixes)
}

func TestAWaiterWhoseScanPartnerIsCancelledStillGetsItsRead(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := roomSQLite(t)
		g := &gatedScans{roomStore: s, gate: make(chan struct{}), gated: 2}
		sc := NamedScope("gated", 2)
		_, err := ClaimSlots(t.Context(), s, "holder", []Scope{sc})
		require.NoError(t, err)

		wakeA, wakeB := make(chan struct{}, 1), make(chan struct{}, 1)
		var roomsA []*room
		joinRooms(g, []Scope{sc}, wakeA, &roomsA)
		var roomsB []*room
		joinRooms(g, []Scope{sc}, wakeB, &roomsB)
		defer leaveRooms(roomsB, wakeB)
		defer leaveRooms(roomsA, wakeA)
		require.Same(t, roomsA[0], roomsB[0], "one room for the scope")

		// Both need a read after the same moment, as two waiters woken by
		// one ring do.
		need := roomTick()
		ctxA, cancelA := context.WithCancel(t.Context())
		errA := make(chan error, 1)
		go func() {
			_, err := roomsA[0].rows(ctxA, need, 0, joinPatience)
			errA <- err
		}()
		synctest.Wait()
		type result struct {
			raw scopeRows
			err error
		}
		resB := make(chan result, 1)
		go func() {
			raw, err := roomsB[0].rows(t.Context(), need, 0, joinPatience)
			resB <- result{raw, err}
		}()
		synctest.Wait()
		require.Equal(t, int64(1), g.scans.Load(), "B joined A's scan rather than sending its own")

		cancelA()
		synctest.Wait()
		require.ErrorIs(t, <-errA, context.Canceled, "A returns its own context's error")
		require.Empty(t, resB, "B does not share A's context error")
		assert.Equal(t, int64(2), g.scans.Load(), "B sent a scan of its own")

		close(g.gate)
		synctest.Wait()
		b := <-resB
		require.NoError(t, b.err)
		require.Len(t, b.raw.slots, 1)
		assert.Equal(t, SlotPrefix+"gated:0", b.raw.slots[0].Key)
	})
}

// TestAWaiterDoesNotWaitLongForAStuckScan: a scan that does not return (a
// connection that stopped answering) holds up its joiners for joinPatience,
// after which each reads on its own.
func TestAWaiterDoesNotWaitLongForAStuckScan(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := roomSQLite(t)
		g := &gatedScans{roomStore: s, gate: make(chan struct{}), gated: 1}
		sc := NamedScope("stuck", 1)
		_, err := ClaimSlots(t.Context(), s, "holder", []Scope{sc})
		require.NoError(t, err)
		wakeA, wakeB := make(chan struct{}, 1), make(chan struct{}, 1)
		var roomsA []*room
		joinRooms(g, []Scope{sc}, wakeA, &roomsA)
		var roomsB []*room
		joinRooms(g, []Scope{sc}, wakeB, &roomsB)
		defer leaveRooms(roomsB, wakeB)
		defer leaveRooms(roomsA, wakeA)

		need := roomTick()
		ctxA, cancelA := context.WithCancel(t.Context())
		errA := make(chan error, 1)
		go func() {
			_, err := roomsA[0].rows(ctxA, need, 0, joinPatience)
			errA <- err
		}()
		synctest.Wait()
		start := time.Now()
		resB := make(chan error, 1)
		go func() {
			raw, err := roomsB[0].rows(t.Context(), need, 0, joinPatience)
			if err == nil && len(raw.slots) != 1 {
				err = errors.New("B read no slot row")
			}
			resB <- err
		}()
		synctest.Wait()
		require.Equal(t, int64(1), g.scans.Load(), "B joined A's scan")
		require.Empty(t, resB)

		time.Sleep(joinPatience)
		synctest.Wait()
		require.NoError(t, <-resB)
		assert.Equal(t, joinPatience, time.Since(start), "B gave up on A's scan after joinPatience")
		assert.Equal(t, int64(2), g.scans.Load(), "and sent its own")
		require.Empty(t, errA, "A still waits for its own scan")
		cancelA()
		require.ErrorIs(t, <-errA, context.Canceled)
	})
}

// TestNoSubscriptionOrGoroutineOutlivesARoomsLastWaiter: waiters of one
// process share one subscription per scope, and when the last waiter of a
// room leaves, the room, its subscription and its goroutine are gone. It
// does not call t.Parallel, so that no other test starts goroutines
// meanwhile.
func TestNoSubscriptionOrGoroutineOutlivesARoomsLastWaiter(t *testing.T) {
	roomStores(t, func(t *testing.T, s roomStore) {
		before := goleak.IgnoreCurrent()
		var subs *wakeup.Set
		switch s := s.(type) {
		case *SQLiteStore:
			subs = &s.subs
		case *PostgresStore:
			subs = &s.listen.subs
		}
		perKey := func(scope string) int {
			return subs.CountKey(queueBell(scope))
		}
		full := []Scope{NamedScope("a", 1), NamedScope("b", 1)}
		_, err := ClaimSlots(t.Context(), s, "holder", full)
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for i, scopes := range [][]Scope{full, full[:1], full[1:], full} {
			wg.Go(func() {
				_, err := ClaimSlotsWait(ctx, s, "waiter-"+strconv.Itoa(i), scopes, WithWaitPoll(time.Hour))
				assert.ErrorIs(t, err, context.Canceled)
			})
		}
		require.Eventually(t, func() bool {
			q, err := s.MetaScan(t.Context(), QueuePrefix)
			return err == nil && len(q) == 6
		}, 30*time.Second, time.Millisecond)
		assert.Equal(t, 1, perKey("a"), "three waiters of scope a, one subscription")
		assert.Equal(t, 1, perKey("b"), "three waiters of scope b, one subscription")

		cancel()
		wg.Wait()
		assert.Nil(t, roomOf(s, "a"), "the room is gone with its last waiter")
		assert.Nil(t, roomOf(s, "b"))
		assert.Zero(t, perKey("a"), "and its subscription")
		assert.Zero(t, perKey("b"))
		require.NoError(t, s.(interface{ Close() error }).Close())
		goleak.VerifyNone(t, before)
	})
}

// TestAProcesssWaitersShareOneReadPerExpiry: 20 waiters of one process wait
// on a full scope of limit 8, one of whose holders died (its slot is not
// renewed). A ring or an expiry wakes the waiters nearest the head only:
// the first 9 (the limit plus one) by line key. When the slot expires,
// those 9 wake for it, and they share the read that follows: from the
// expiry until every waiter is asleep again, at most one read of the scope
// for the expiry, plus one per ring the room fanned out and one per
// admission the store refused. Each woken waiter reading for itself made
// up to 9 for the expiry.
func TestAProcesssWaitersShareOneReadPerExpiry(t *testing.T) {
	t.Parallel()
	const n, limit = 20, 8
	roomStoresInBubble(t, func(t *testing.T, s roomStore) {
		c := &scanCounter{roomStore: s}
		store := countedStore(c, "ranges")
		scopes := []Scope{NamedScope("expiring", limit)}
		for i := range limit - 1 {
			// Held for the whole test: no other slot row expires.
			_, err := ClaimSlots(t.Context(), store, "holder-"+strconv.Itoa(i), scopes, WithTTL(time.Minute))
			require.NoError(t, err)
		}
		_, err := ClaimSlots(t.Context(), store, "dead-holder", scopes, WithTTL(MinTTL))
		require.NoError(t, err)
		claimed := time.Now()

		ctx, cancel := context.WithCancel(t.Context())
		admitted := make(chan *Slots, n)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		for i := range n {
			wg.Go(func() {
				// A long TTL: no entry ahead of a waiter expires meanwhile.
				sl, err := ClaimSlotsWait(ctx, store, "waiter-"+strconv.Itoa(i), scopes,
					WithWaitPoll(time.Hour), WithTTL(time.Minute))
				if err == nil {
					admitted <- sl
				}
			})
		}
		require.Eventually(t, func() bool {
			q, err := s.MetaScan(t.Context(), lineScopePrefix("expiring"))
			return err == nil && len(q) == n
		}, 30*time.Second, time.Millisecond)
		settle(t, c, store, "expiring")
		require.Less(t, time.Since(claimed), MinTTL-time.Second, "the waiters settled before the slot expired")

		reads, rings, refused := c.reads.Load(), roomRings(store, "expiring"), c.refused.Load()
		var sl *Slots
		select {
		case sl = <-admitted:
		case <-time.After(30 * time.Second):
			t.Fatal("no waiter was admitted after the slot expired")
		}
		settle(t, c, store, "expiring")
		reads, rings, refused = c.reads.Load()-reads, roomRings(store, "expiring")-rings, c.refused.Load()-refused
		t.Logf("%d reads, %d rings, %d refused admissions", reads, rings, refused)
		assert.GreaterOrEqual(t, reads, int64(1), "the waiters read the scope once the slot expired")
		assert.LessOrEqual(t, reads, 1+rings+refused, "one read for the expiry, whatever the number of waiters it woke")
		require.NoError(t, sl.Release(t.Context()))
	})
}

// TestMemberOrderKeepsKeyOrder drives a room's member order with random
// inserts, moves and removals, against a sorted model: first must always
// give the members with the smallest keys, in order.
func TestMemberOrderKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	var o memberOrder
	model := map[chan struct{}]string{}
	var chans []chan struct{}
	for range 2000 {
		chans = append(chans, make(chan struct{}))
	}
	for step := range 30000 {
		c := chans[rng.IntN(len(chans))]
		if old, ok := model[c]; ok {
			o.remove(old, c)
			delete(model, c)
		}
		if rng.IntN(4) > 0 {
			key := "k" + strconv.Itoa(rng.IntN([]int{5000, 20}[step%2]))
			o.insert(key, c)
			model[c] = key
		}
		if step%500 != 0 {
			continue
		}
		require.Equal(t, len(model), o.n)
		var want []string
		for _, k := range model {
			want = append(want, k)
		}
		slices.Sort(want)
		var got []string
		o.first(len(model)+1, func(w chan struct{}) { got = append(got, model[w]) })
		require.Equal(t, want, got, "step %d", step)
		for _, ch := range o.chunks {
			require.NotEmpty(t, ch)
			require.LessOrEqual(t, len(ch), orderChunk)
		}
	}
}

// TestARingWakesTheMembersNearTheHead checks that a ring of a room of many
// placed waiters wakes those without a place and only the first depth of
// those with one, in key order, and that a member that moves to the front
// is woken by the next ring.
func TestARingWakesTheMembersNearTheHead(t *testing.T) {
	t.Parallel()
	r := &room{unplaced: map[chan struct{}]struct{}{}, placed: map[chan struct{}]string{}, depth: 3}
	var placed []chan struct{}
	for i := range 1000 {
		c := make(chan struct{}, 1)
		r.unplaced[c] = struct{}{}
		r.place(c, "k"+strconv.Itoa(100000+i))
		placed = append(placed, c)
	}
	unplaced := make(chan struct{}, 1)
	r.unplaced[unplaced] = struct{}{}
	// A ring looks at the members without a place and at the first depth
	// of the line, never at the members far back: those are not kept
	// among the unplaced.
	require.Len(t, r.unplaced, 1, "placed members are kept apart from the unplaced")
	woken := func() []int {
		var out []int
		for i, c := range placed {
			select {
			case <-c:
				out = append(out, i)
			default:
			}
		}
		return out
	}
	r.ring()
	require.Equal(t, []int{0, 1, 2}, woken())
	require.Len(t, unplaced, 1, "a member without a place is woken by every ring")
	<-unplaced
	require.True(t, r.near(placed[2]))
	require.False(t, r.near(placed[3]))
	// A member far back leaves: nobody's place among the first changes.
	delete(r.unplaced, placed[700])
	r.unplaceLocked(placed[700])
	require.Empty(t, woken())
	// The first leaves the room, which lets the fourth in: it is woken,
	// since far members do not poll.
	delete(r.unplaced, placed[0])
	r.unplaceLocked(placed[0])
	require.Equal(t, []int{3}, woken())
	// The 500th moves ahead of everyone (its old place was far back).
	r.place(placed[500], "k0")
	require.Empty(t, woken())
	r.ring()
	require.Equal(t, []int{1, 2, 500}, woken())
	// The 600th gives its place up, and every ring wakes it from then on.
	r.place(placed[600], "")
	r.ring()
	require.Equal(t, []int{1, 2, 500, 600}, woken())
	require.Len(t, r.unplaced, 2)
}

// BenchmarkRoomRing is one ring of a room whose line holds n members of
// the process: it wakes the first few, whatever n.
func BenchmarkRoomRing(b *testing.B) {
	for _, n := range []int{10, 100_000} {
		b.Run("members="+strconv.Itoa(n), func(b *testing.B) {
			r := &room{unplaced: map[chan struct{}]struct{}{}, placed: map[chan struct{}]string{}, depth: 5}
			for i := range n {
				c := make(chan struct{}, 1)
				r.unplaced[c] = struct{}{}
				r.place(c, "k"+strconv.Itoa(1_000_000+i))
			}
			for b.Loop() {
				r.ring()
			}
		})
	}
}

// panickySubscribe is a SQLite store whose subscriptions panic for the
// bell of scope "b" (a store bug, or a decorator that panics): the library
// already guards a shared scan against a store that panics (errScanAborted),
// and a Subscribe is just as much a store call.
type panickySubscribe struct {
	*SQLiteStore
}

func (s *panickySubscribe) Subscribe(key string) (<-chan struct{}, func()) {
	if key == queueBell("b") {
		panic("subscribe failed")
	}
	return s.SQLiteStore.Subscribe(key)
}

// SubscribeTags panics as Subscribe does: the room subscribes with it on a
// store that hands reads over (a DeleteReadNotifier).
func (s *panickySubscribe) SubscribeTags(key string) (<-chan string, func()) {
	if key == queueBell("b") {
		panic("subscribe failed")
	}
	return s.SQLiteStore.SubscribeTags(key)
}

// TestAStorePanickingInSubscribeLeavesNoRoomBehind: ClaimSlotsWait
// joins the rooms of its scopes one by one (joinRooms) and only then defers
// leaveRooms. A panic in the second room's Subscribe leaves the first room,
// its subscription and its fanOut goroutine in place for good (refs never
// drops to 0), and the second room in the map with a member that never
// leaves: the promise "no goroutine or subscription outlives the last
// waiter of a room" breaks, and every later waiter of scope "b" waits in a
// room with no subscription at all (no bell: poll only).
func TestAStorePanickingInSubscribeLeavesNoRoomBehind(t *testing.T) {
	s := &panickySubscribe{SQLiteStore: roomSQLite(t)}
	_, err := ClaimSlots(t.Context(), s.SQLiteStore, "holder", []Scope{NamedScope("a", 1)})
	require.NoError(t, err)
	func() {
		defer func() { _ = recover() }()
		_, err := ClaimSlotsWait(t.Context(), s, "w", []Scope{NamedScope("a", 1), NamedScope("b", 1)})
		panic(fmt.Sprint("no panic: ", err))
	}()
	defer func() { // let other tests run clean whatever happens
		for _, sc := range []string{"a", "b"} {
			if r := roomOf(s, sc); r != nil {
				rooms.mu.Lock()
				delete(rooms.m, roomKey{store: s, scope: sc})
				rooms.mu.Unlock()
				if r.stop != nil {
					close(r.stop)
					<-r.exited
				}
				if r.cancel != nil {
					r.cancel()
				}
			}
		}
	}()
	subsA := s.SQLiteStore.subs.CountKey(queueBell("a"))
	assert.Nil(t, roomOf(s, "a"), "the call that made room a has returned (panicked): the room must be gone")
	assert.Zero(t, subsA, "and the subscription of scope a's bell with it")
	assert.Nil(t, roomOf(s, "b"), "room b has no waiter left")
}

// TestFarWaitersAreAllAdmittedSoon: one process's waiters, on a store
// without notifications, with mixed priorities, units, scope sets (a waiter
// in two rooms), cancellations of waiters ahead, a second Store value on
// the same database, and requeues: every waiter that is not cancelled must
// be admitted well before a renewal of its entries (TTL 10 minutes), since
// each one admitted releases at once. Under -short it runs the first 4 of
// its 16 schedules.
func TestFarWaitersAreAllAdmittedSoon(t *testing.T) {
	t.Parallel()
	seeds := uint64(16)
	if testing.Short() {
		seeds = 4
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				raw, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
				require.NoError(t, err)
				t.Cleanup(func() { raw.Close() })
				type quiet struct {
					Store
					Batcher
					RangeReader
				}
				stores := []Store{quiet{raw, raw, raw}, struct {
					Store
					Batcher
				}{raw, raw}}
				rng := rand.New(rand.NewPCG(seed, 7))
				ctx := t.Context()
				gpu, cpu := NamedScope("gpu", 2), NamedScope("cpu", 1)
				h1, err := ClaimSlots(ctx, stores[0], "holder1", []Scope{gpu.Take(2)})
				require.NoError(t, err)
				h2, err := ClaimSlots(ctx, stores[0], "holder2", []Scope{cpu})
				require.NoError(t, err)
				const n = 30
				var admitted atomic.Int32
				runs := n - rng.IntN(6)
				errs := make(chan error, n)
				cancels := make([]context.CancelFunc, n)
				cancelled := 0
				for i := range n {
					var scopes []Scope
					switch rng.IntN(5) {
					case 0:
						scopes = []Scope{gpu, cpu}
					case 1:
						scopes = []Scope{gpu.Take(2)}
					case 2:
						scopes = []Scope{cpu}
					case 3:
						scopes = []Scope{NamedScope("gpu", 3)}
					default:
						scopes = []Scope{gpu}
					}
					st := stores[0]
					if rng.IntN(5) == 0 {
						st = stores[1]
					}
					opts := []Option{WithWaitPoll(MinWaitPoll), WithTTL(10 * time.Minute)}
					if rng.IntN(3) == 0 {
						opts = append(opts, WithPriority(rng.IntN(3)))
					}
					wctx, cancel := context.WithCancel(ctx)
					cancels[i] = cancel
					go func() {
						sl, err := ClaimSlotsWait(wctx, st, fmt.Sprintf("w%d", i%runs), scopes, opts...)
						if err == nil {
							admitted.Add(1)
							err = sl.Release(ctx)
						}
						errs <- err
					}()
					if rng.IntN(3) == 0 {
						synctest.Wait()
					}
				}
				time.Sleep(time.Second)
				synctest.Wait()
				for i := range n {
					if rng.IntN(5) == 0 {
						cancels[i]()
						cancelled++
						synctest.Wait()
					}
				}
				require.NoError(t, h1.Release(ctx))
				time.Sleep(time.Duration(rng.IntN(3)) * time.Second)
				require.NoError(t, h2.Release(ctx))
				time.Sleep(30 * time.Second)
				synctest.Wait()
				ok, failed := 0, 0
				for range n {
					select {
					case err := <-errs:
						if err == nil {
							ok++
						} else {
							failed++
						}
					default:
					}
				}
				for _, c := range cancels {
					c()
				}
				require.Equal(t, n, ok+failed, "waiters still waiting 30s after the holders released (admitted %d, ended %d, cancelled %d)", ok, failed, cancelled)
			})
		})
	}
}
