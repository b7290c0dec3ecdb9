package runlease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// A room is where the waiters of one process wait for one scope of one
// store: it holds the one subscription of the scope's bell that all of them
// share, and it lets them share their reads of the scope, so that a release
// costs the store one read per waiting process, not one per waiting call.
//
// A waiter's read is a freshness requirement: the rows must come from a
// scan that started after some moment (its need). A waiter woken by a ring
// needs a scan started after the ring arrived, so every waiter woken by one
// ring shares the first such scan; a waiter woken by its timer, reading for
// the first time, or reading again after a write of its own (its entries,
// or an admission the store refused) needs a scan started after that
// moment, so it always sees its own writes and never decides on a read its
// own last move may have changed.
//
// Moments are ticks of roomClock, not readings of a clock: a scan counts as
// fresh only if its tick was taken after the need's, which orders them as
// the program does even where two readings of a clock would be equal (a
// coarse clock, or the frozen clock of a test bubble).
//
// Sharing reads never weakens the limit: every admission is one batch
// conditional on every slot row, queue entry and mark it was planned from
// (on a store without batches, each slot is a write conditional on its row
// as read), so a waiter that planned on rows that changed since they were
// scanned is refused (ErrConditionFailed) and reads again, with need set
// to after the refusal. A stale shared read costs a retry, never an
// over-admission; decoding stays per waiter and never writes through the
// shared rows (decodeScope).
//
// Rooms are keyed by the Store value the waiters call, not by the store's
// identity through Unwrap (lineage.go): the room reads and subscribes
// through one of its waiters' Store values, and two values of one identity
// may differ in what they do (a decorator that counts, traces, injects
// faults or hides a capability such as Notifier). Equal Store values are
// one room; a process that reaches one database through two Store values
// makes one read per value, still not one per waiter.
//
// rooms.mu is a leaf lock, held only to find, make or remove a room and to
// count its members; a room's mu is a leaf lock too, held only to record a
// ring, to pick, start or finish a scan, and to add or remove a waiter's
// wake-up channel. They are never held together, nor across store calls.
var rooms = struct {
	mu sync.Mutex
	m  map[roomKey]*room
}{m: map[roomKey]*room{}}

type roomKey struct {
	store Store
	scope string
}

// roomClock orders the rooms' rings, the starts of their scans and the
// moments waiters need their reads to follow.
var roomClock atomic.Uint64

func roomTick() uint64 { return roomClock.Add(1) }

// room is one scope of one Store value, while a waiter of the process waits
// for it.
type room struct {
	store Store
	sc    Scope

	refs int // the waiters in the room; guarded by rooms.mu

	// Set before ready is closed, read only after it is.
	ready  chan struct{} // closed once the subscription is in place
	stop   chan struct{} // closed to end fanOut (nil: no subscription)
	exited chan struct{} // closed when fanOut has returned
	cancel func()        // ends the subscription

	mu sync.Mutex
	// Each member (a waiter, by its wake-up channel) is in unplaced or in
	// placed, never both. unplaced holds the members without a place;
	// placed holds the line key of each member that holds a place, and
	// order the same members in key order. A ring wakes the members
	// without a place and the first depth members with one (the largest
	// headDepth of the members' scopes), so its cost does not grow with
	// the members far back in the line.
	unplaced map[chan struct{}]struct{}
	placed   map[chan struct{}]string
	order    memberOrder
	depth    int
	ringSeq  uint64 // the tick of the latest ring
	// expiryTick is the latest tick a waiter woken by an expiry took,
	// after the clock that judges expiry read expiryMS (tickAfter).
	expiryTick uint64
	expiryMS   int64
	rings      uint64    // how many rings were fanned out
	flight     *roomScan // the latest scan in flight, if any
	last       *roomScan // the latest scan that succeeded, if any
	// tagged is set before ready is closed when the subscription carries
	// tags (the store is a DeleteReadNotifier): only then does a release
	// of the process hand its read over (queue_room_hand.go).
	tagged bool
	// handed holds the tags of the process's hand-overs whose wake-ups have
	// not come back: a wake-up that carries one is a release already
	// answered, not a ring. handedOrder is their order, oldest first, to
	// bound them (maxHanded).
	handed      map[string]struct{}
	handedOrder []string
	hand        *roomHand // the latest hand-over, if any
}

// roomScan is one scan of a room's scope. raw and err are written by the
// scan's starter before done is closed and only read after; raw is never
// written through by anyone (decodeScope only reads it).
type roomScan struct {
	seq  uint64 // tick taken before the scan was sent
	done chan struct{}
	raw  scopeRows
	err  error
	cut  bool // it failed because its starter's context ended, or the store panicked
}

// joinRooms puts a waiter whose wake-up channel is wake into the room of
// each of scopes, making the rooms that do not exist yet, and appends each
// room to *into as soon as it is joined. When it returns,
// every room's subscription is in place and will wake wake, so a read that
// follows sees every release a later ring announces.
func joinRooms(store Store, scopes []Scope, wake chan struct{}, into *[]*room) {
	for _, sc := range scopes {
		*into = append(*into, joinRoom(store, sc, wake))
	}
}

// joinRoom puts wake into the room of sc. If the store panics in Subscribe,
// the call takes its count back before the panic goes on: the room is
// left without a subscription (its waiters poll) and removed with its last
// member.
func joinRoom(store Store, sc Scope, wake chan struct{}) *room {
	k := roomKey{store: store, scope: sc.name}
	rooms.mu.Lock()
	r := rooms.m[k]
	made := r == nil
	if made {
		r = &room{store: store, sc: sc, ready: make(chan struct{}), unplaced: map[chan struct{}]struct{}{},
			placed: map[chan struct{}]string{}}
		rooms.m[k] = r
	}
	r.refs++ // a room in the map has a member: this one keeps it there
	rooms.mu.Unlock()
	joined := false
	defer func() {
		if !joined {
			r.leave(wake)
		}
	}()
	if made {
		r.open() // outside rooms.mu: Subscribe is a store call
	}
	<-r.ready
	r.mu.Lock()
	r.unplaced[wake] = struct{}{}
	if d := headDepth(sc); d > r.depth {
		// Members the deeper window takes in are near now: they look.
		r.depth = d
		r.order.first(d, wakeUp)
	}
	r.mu.Unlock()
	joined = true
	return r
}

// open subscribes to the room's bell, when the store rings it, and starts
// the one goroutine that fans its rings out.
func (r *room) open() {
	r.cancel = func() {} // until a subscription is in place
	defer close(r.ready)
	if d, ok := r.store.(DeleteReadNotifier); ok {
		ch, cancel := d.SubscribeTags(queueBell(r.sc.name))
		r.cancel, r.stop, r.exited = cancel, make(chan struct{}), make(chan struct{})
		r.tagged, r.handed = true, map[string]struct{}{}
		go r.fanOutTags(ch)
		return
	}
	n, ok := r.store.(Notifier)
	if !ok {
		return
	}
	ch, cancel := n.Subscribe(queueBell(r.sc.name))
	r.cancel, r.stop, r.exited = cancel, make(chan struct{}), make(chan struct{})
	go r.fanOut(ch)
}

// fanOut records the tick of each ring and wakes every waiter of the room.
// A wake-up is sent without blocking: a waiter's channel holds one, and a
// waiter that has not looked yet will read after this ring anyway.
func (r *room) fanOut(ch <-chan struct{}) {
	defer close(r.exited)
	for {
		select {
		case <-r.stop:
			return
		case <-ch:
		}
		r.ring()
	}
}

// fanOutTags is fanOut for a subscription that carries tags: a wake-up
// that carries the tag of one of the process's hand-overs was answered by
// it, and is not a ring (heard).
func (r *room) fanOutTags(ch <-chan string) {
	defer close(r.exited)
	for {
		select {
		case <-r.stop:
			return
		case tag := <-ch:
			r.heard(tag)
		}
	}
}

// ring records a ring and wakes the members it concerns: those without a
// place, and the first depth members with one.
func (r *room) ring() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ringLocked()
}

// ringLocked is ring with r.mu held.
func (r *room) ringLocked() {
	r.ringSeq = roomTick()
	r.rings++
	for w := range r.unplaced {
		wakeUp(w)
	}
	r.order.first(r.depth, wakeUp)
}

// leaveRooms takes the waiter whose wake-up channel is wake out of rs. The
// last waiter to leave a room removes it, ends its goroutine (waiting for
// it) and its subscription.
func leaveRooms(rs []*room, wake chan struct{}) {
	for _, r := range rs {
		r.leave(wake)
	}
}

func (r *room) leave(wake chan struct{}) {
	r.mu.Lock()
	delete(r.unplaced, wake)
	r.unplaceLocked(wake)
	r.mu.Unlock()
	rooms.mu.Lock()
	r.refs--
	last := r.refs == 0
	if last {
		delete(rooms.m, roomKey{store: r.store, scope: r.sc.name})
	}
	rooms.mu.Unlock()
	if !last {
		return
	}
	if r.stop != nil {
		close(r.stop)
		<-r.exited
	}
	r.cancel()
}

// place records that the member whose wake-up channel is wake holds its
// place at key ("" : it holds none, and every ring wakes it).
func (r *room) place(wake chan struct{}, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unplaceLocked(wake)
	if key == "" {
		r.unplaced[wake] = struct{}{}
		return
	}
	delete(r.unplaced, wake)
	r.placed[wake] = key
	r.order.insert(key, wake)
}

// unplaceLocked takes the member's place out of the order. A member that
// was among the first depth lets the next one in, which is woken: a member
// further back sleeps through its polls (sleepRenewing) and counts on this
// wake-up to look once it is near. r.mu is held.
func (r *room) unplaceLocked(wake chan struct{}) {
	old, ok := r.placed[wake]
	if !ok {
		return
	}
	wasNear := r.order.within(r.depth, old, wake)
	r.order.remove(old, wake)
	delete(r.placed, wake)
	if next := r.order.nth(r.depth - 1); wasNear && next != nil {
		wakeUp(next)
	}
}

// wakeUp sends a wake-up on w without blocking: the channel holds one, and
// a member that has one pending looks anyway.
func wakeUp(w chan struct{}) {
	select {
	case w <- struct{}{}:
	default:
	}
}

// near reports whether a ring of the room wakes the member whose wake-up
// channel is wake: it holds no place, or one among the first depth.
func (r *room) near(wake chan struct{}) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	key, placed := r.placed[wake]
	return !placed || r.order.within(r.depth, key, wake)
}

// lastRing returns the tick of the room's latest ring (0: none yet).
func (r *room) lastRing() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ringSeq
}

// tickAfter returns a tick taken once the clock that judges expiry read
// atMS or later, for a waiter woken by an expiry at atMS: the tick an
// earlier waiter recorded, when its reading was that late, so that the
// waiters woken by one expiry share the scan that follows it; otherwise
// tick, which the caller took after its clock read nowMS, recorded for
// the waiters after it.
func (r *room) tickAfter(atMS, nowMS int64, tick uint64) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expiryTick != 0 && r.expiryMS >= atMS {
		return r.expiryTick
	}
	r.expiryMS, r.expiryTick = nowMS, tick
	return tick
}

// rows returns the rows of the room's scope from a scan that started after
// tick need, the later of fresh (what the caller's own moves need) and
// rung (the latest ring it was woken by): the latest one that succeeded,
// if it did; else the read of the latest hand-over, if it answers both
// (roomHand.answers); else the scan in flight, if it started after need,
// which the call waits for; else a scan of its own, sent with ctx, which
// later calls may share.
//
// A joiner whose ctx ends first returns ctx's error. A scan that failed
// because its starter's context ended says nothing about the store, so a
// joiner whose own ctx is live reads again rather than share that error;
// any other error is shared, and the caller's retry handles it as it would
// its own. A joiner waits for a scan at most patience, then reads on its
// own: a scan stuck on one bad connection holds up only its starter, as it
// would without sharing.
func (r *room) rows(ctx context.Context, fresh, rung uint64, patience time.Duration) (scopeRows, error) {
	need := max(fresh, rung)
	for {
		r.mu.Lock()
		if l := r.last; l != nil && l.seq > need {
			r.mu.Unlock()
			return l.raw, nil
		}
		if h := r.hand; h != nil && h.answers(fresh, rung) {
			r.mu.Unlock()
			return h.raw, nil
		}
		if f := r.flight; f != nil && f.seq > need {
			r.mu.Unlock()
			raw, again, err := f.join(ctx, patience)
			if !again {
				return raw, err
			}
			need = max(need, f.seq) // a newer scan, or one of its own
			continue
		}
		f := &roomScan{seq: roomTick(), done: make(chan struct{})}
		r.flight = f
		r.mu.Unlock()
		r.scan(ctx, f)
		return f.raw, f.err
	}
}

// joinPatience bounds how long a waiter waits for a scan another waiter
// sent before it sends its own; a waiter whose poll is shorter waits at
// most its poll.
const joinPatience = time.Second

// join waits for f, and returns what it read, or again when the caller
// must read on its own: f failed because its starter's context ended (not
// the caller's), or it took longer than patience.
func (f *roomScan) join(ctx context.Context, patience time.Duration) (raw scopeRows, again bool, err error) {
	t := time.NewTimer(patience)
	defer t.Stop()
	select {
	case <-f.done:
	case <-ctx.Done():
		return scopeRows{}, false, ctx.Err()
	case <-t.C:
		return scopeRows{}, true, nil
	}
	if f.cut && ctx.Err() == nil {
		return scopeRows{}, true, nil
	}
	return f.raw, false, f.err
}

// scan runs f, records it as the room's latest success when it is one, and
// releases its joiners, even if the store panics.
func (r *room) scan(ctx context.Context, f *roomScan) {
	f.err, f.cut = errScanAborted, true
	defer func() {
		r.mu.Lock()
		if r.flight == f {
			r.flight = nil
		}
		if f.err == nil && (r.last == nil || f.seq > r.last.seq) {
			r.last = f
		}
		r.mu.Unlock()
		close(f.done)
	}()
	reads, finish := roomReads(r.sc, &f.raw)
	if f.err = readAll(ctx, r.store, reads); f.err == nil {
		finish()
	}
	f.cut = f.err != nil && ctx.Err() != nil
}

// errScanAborted marks a scan whose starter never returned from the store
// (it panicked); its joiners read again, so it is never returned.
var errScanAborted = errors.New("shared scan aborted")
