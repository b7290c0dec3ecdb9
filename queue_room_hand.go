package runlease

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
)

// A hand-over is a release of a slot that reads the head of its scope's
// queue in the same call (a DeleteReadNotifier's MetaDeleteNotifyRanges:
// one round trip on Postgres) and hands that read to the waiters of its
// own process, in the scope's room: they are woken at once, as by a ring,
// and decide on the hand-over's read instead of reading again. The next
// run is then admitted one round trip after the release, where a ring
// costs a notification's trip through the store and a wake-up read first.
// Waiters of other processes are woken by the release's notification, as
// before, and read.
//
// The read is trusted only as far as it is known to be fresh. It started
// after the tick sent, taken before the call, and the delete was done
// before it. A waiter may decide on it when:
//   - every move of its own that its next read must show (fresh: a write,
//     a refused admission, a poll, an expiry) came before sent, so the
//     read saw it; and
//   - the latest ring that woke it (rung) is no later than the hand-over's
//     own ring, and no other ring came between sent and that ring (else
//     the hand-over rings as a ring does, and its waiters read): every
//     ring it could have been woken by came before sent, and the read saw
//     what that ring announced.
//
// A stale read only costs a retry, as for any shared read: every
// admission is conditional on the rows it was planned from (see room).
//
// The release's notification comes back to the process's own
// subscription too. It carries the hand-over's tag, which the room
// expects (handed, recorded before the call is sent), so it is not a ring:
// it would wake the waiters to read again what the hand-over gave them. A
// wake-up that merged with another while pending carries no tag and rings.
// A hand-over whose read failed, or whose outcome is unknown, rings.
//
// Locks: r.mu, a leaf lock, is held to record the tag and take sent, and
// again to install the read and wake the members; never across the store
// call.

// maxHanded is the most tags a room expects at once. A tag pushed out
// (its wake-up never came: Postgres notifies only while someone is marked
// as waiting) only makes its wake-up, should it come, a ring.
const maxHanded = 64

// roomHand is a hand-over's read: sent is the tick taken before the call
// was sent, ring the tick of the ring it woke the room with.
type roomHand struct {
	sent, ring uint64
	raw        scopeRows
}

// answers reports whether a waiter whose own moves need a read after tick
// fresh, and whose latest ring is rung, may decide on h's read.
func (h *roomHand) answers(fresh, rung uint64) bool {
	return fresh < h.sent && rung <= h.ring
}

// handTags makes the tags of the process's hand-overs: unique in the
// process, and, by the random part, across the processes that share a
// store.
var handTags struct {
	once   sync.Once
	prefix string
	n      atomic.Uint64
}

func nextHandTag() string {
	handTags.once.Do(func() {
		var b [8]byte
		_, _ = crand.Read(b[:])
		handTags.prefix = "h" + hex.EncodeToString(b[:]) + "."
	})
	return handTags.prefix + strconv.FormatUint(handTags.n.Add(1), 36)
}

// handingRoom returns the room of scope of store in this process, when one
// is ready to be handed a release's read: its subscription carries tags,
// and a member holds a place. Only a member with a place decides on a
// shared read; one without reads its own rows (waiter.read), so a release
// while no member has one rings, as a plain delete does, and spares the
// store the read. A member that takes its place just after the look is
// woken by that ring and reads, as every member was before hand-overs.
func handingRoom(store Store, scope string) *room {
	rooms.mu.Lock()
	r := rooms.m[roomKey{store: store, scope: scope}]
	rooms.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.ready:
	default:
		return nil // still subscribing: the release rings
	}
	if !r.tagged {
		return nil
	}
	r.mu.Lock()
	placed := len(r.placed) > 0
	r.mu.Unlock()
	if !placed {
		return nil
	}
	return r
}

// handOver deletes key if it holds expected, waking the scope's waiters,
// and hands the read of the scope that follows the delete to the room's
// members (see above). It reports what the delete did, as
// MetaDeleteNotify does.
func (r *room) handOver(ctx context.Context, d DeleteReadNotifier, key, expected string) (bool, error) {
	var raw scopeRows
	reads, finish := roomReads(r.sc, &raw)
	tag := nextHandTag()
	r.mu.Lock()
	r.expectLocked(tag)
	sent := roomTick()
	r.mu.Unlock()
	deleted, rows, err := d.MetaDeleteNotifyRanges(ctx, key, expected, queueBell(r.sc.name), tag, rangesOf(reads))
	read := err == nil && len(rows) == len(reads)
	if read {
		for i, rd := range reads {
			*rd.to = rows[i]
		}
		finish()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err != nil && !IsOutcomeUnknown(err):
		delete(r.handed, tag) // nothing was deleted: no wake-up comes
	case err != nil || (deleted && !read):
		// Deleted, or perhaps: its waiters read. Its wake-up, should it
		// come, rings too.
		delete(r.handed, tag)
		r.ringLocked()
	case !deleted:
		delete(r.handed, tag) // no wake-up comes
		if read {
			r.recordLocked(sent, raw)
		}
	case r.ringSeq > sent:
		// A ring came while the call was out: its waiters may have read
		// before the delete, and the read may not show what it rang for.
		r.recordLocked(sent, raw)
		r.ringLocked()
	default:
		r.recordLocked(sent, raw)
		r.ringLocked()
		r.hand = &roomHand{sent: sent, ring: r.ringSeq, raw: raw}
	}
	return deleted, err
}

// recordLocked keeps a read that started after tick seq as the room's
// latest scan, when it is later than the one it has. r.mu is held.
func (r *room) recordLocked(seq uint64, raw scopeRows) {
	if r.last == nil || seq > r.last.seq {
		r.last = &roomScan{seq: seq, raw: raw} // never joined: done is not needed
	}
}

// expectLocked records tag as a hand-over's whose wake-up is to come,
// pushing out the oldest when there are maxHanded. r.mu is held.
func (r *room) expectLocked(tag string) {
	r.handed[tag] = struct{}{}
	r.handedOrder = append(r.handedOrder, tag)
	for len(r.handed) > maxHanded {
		old := r.handedOrder[0]
		r.handedOrder = r.handedOrder[1:]
		delete(r.handed, old)
	}
	if len(r.handedOrder) > 2*maxHanded {
		// Drop the tags whose wake-ups came back.
		kept := make([]string, 0, len(r.handed))
		for _, t := range r.handedOrder {
			if _, ok := r.handed[t]; ok {
				kept = append(kept, t)
			}
		}
		r.handedOrder = kept
	}
}

// heard takes a wake-up of the room's subscription that carries tag: one
// of the process's hand-overs, answered already, or a ring.
func (r *room) heard(tag string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.handed[tag]; ok && tag != "" {
		delete(r.handed, tag)
		return
	}
	r.ringLocked()
}
