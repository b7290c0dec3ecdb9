package runlease

import "time"

// schedule is a Renewer's queue of keepers by the instant its loop must
// next look at each. Keepers due at the same instant share a bucket, and
// only the buckets' instants are kept in order, in a heap of integers:
// renewals fall on beats (onBeat), a batch's keepers share one trust window
// end, and a keeper to look at at once goes into one bucket with every
// other such keeper, so a process keeping many leases has few buckets. A
// keeper moves in O(1) while its instant has a bucket, and a look costs
// no walk of a tree of every keeper (which, with a heap of keepers, cost a
// third of the CPU of a process keeping 300,000 leases: cache-missing
// comparisons at every move).
//
// The schedule belongs to its Renewer and is guarded by Renewer.mu, as are
// the fields of Keeper it uses (bucket, index).
type schedule struct {
	origin  time.Time         // keys count nanoseconds after it, on the monotonic clock
	buckets map[int64]*bucket // every bucket holding a keeper, by key
	// keys is a min-heap of the keys of buckets. The key of a bucket that
	// emptied before its instant stays until it is popped or the heap is
	// rebuilt (tidy), so that leaving a bucket never searches the heap.
	keys []int64
	n    int // keepers queued
}

// bucket is the keepers due at one instant, in no order.
type bucket struct {
	key     int64
	at      time.Time
	keepers []*Keeper
}

// soon is the key of the bucket of keepers the loop must look at at once:
// it sorts before every instant a keeper can be due at.
const soon = int64(-1 << 63)

// len returns how many keepers are queued.
func (s *schedule) len() int { return s.n }

// add queues k, which is not queued, to be looked at at.
func (s *schedule) add(k *Keeper, at time.Time) {
	s.init()
	s.addKey(k, max(int64(at.Sub(s.origin)), soon+1), at)
}

// addSoon queues k, which is not queued, to be looked at at once.
func (s *schedule) addSoon(k *Keeper) {
	s.init()
	s.addKey(k, soon, time.Time{})
}

func (s *schedule) init() {
	if s.buckets == nil {
		s.origin, s.buckets = time.Now(), map[int64]*bucket{}
	}
}

func (s *schedule) addKey(k *Keeper, key int64, at time.Time) {
	b := s.buckets[key]
	if b == nil {
		b = &bucket{key: key, at: at}
		s.buckets[key] = b
		s.push(key)
	}
	k.bucket, k.index = b, len(b.keepers)
	b.keepers = append(b.keepers, k)
	s.n++
}

// remove takes k, which is queued, out of the schedule.
func (s *schedule) remove(k *Keeper) {
	b := k.bucket
	last := b.keepers[len(b.keepers)-1]
	b.keepers[k.index], last.index = last, k.index
	b.keepers[len(b.keepers)-1] = nil
	b.keepers = b.keepers[:len(b.keepers)-1]
	k.bucket, k.index = nil, -1
	s.n--
	if len(b.keepers) == 0 {
		delete(s.buckets, b.key)
		s.tidy()
	}
}

// moveSoon makes the loop look at k, which is queued, at once.
func (s *schedule) moveSoon(k *Keeper) {
	if k.bucket.key != soon {
		s.remove(k)
		s.addSoon(k)
	}
}

// first returns the instant of the earliest bucket, and false when no
// keeper is queued. The bucket of keepers to look at at once is due at any
// instant.
func (s *schedule) first() (time.Time, bool) {
	for len(s.keys) > 0 {
		b := s.buckets[s.keys[0]]
		switch {
		case b == nil:
			s.pop() // emptied before its instant
		case b.key == soon:
			return time.Time{}, true
		default:
			return b.at, true
		}
	}
	return time.Time{}, false
}

// takeDue takes out and returns the keepers of the earliest bucket when it
// is due by now, and nil when none is.
func (s *schedule) takeDue(now time.Time) []*Keeper {
	at, ok := s.first()
	if !ok || at.After(now) {
		return nil
	}
	b := s.buckets[s.pop()]
	delete(s.buckets, b.key)
	for _, k := range b.keepers {
		k.bucket, k.index = nil, -1
	}
	s.n -= len(b.keepers)
	return b.keepers
}

// all returns every keeper queued.
func (s *schedule) all() []*Keeper {
	out := make([]*Keeper, 0, s.n)
	for _, b := range s.buckets {
		out = append(out, b.keepers...)
	}
	return out
}

// tidy rebuilds the heap of keys from the buckets when keys of emptied
// buckets outnumber them, so that keepers that come and go before their
// instants cannot grow it without bound.
func (s *schedule) tidy() {
	if len(s.keys) <= 2*len(s.buckets)+64 {
		return
	}
	s.keys = s.keys[:0]
	for key := range s.buckets {
		s.push(key)
	}
}

// push adds key to the heap of keys.
func (s *schedule) push(key int64) {
	s.keys = append(s.keys, key)
	for i := len(s.keys) - 1; i > 0; {
		parent := (i - 1) / 2
		if s.keys[parent] <= s.keys[i] {
			break
		}
		s.keys[parent], s.keys[i] = s.keys[i], s.keys[parent]
		i = parent
	}
}

// pop removes and returns the least key.
func (s *schedule) pop() int64 {
	keys := s.keys
	least, last := keys[0], len(keys)-1
	keys[0] = keys[last]
	keys = keys[:last]
	for i := 0; ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < len(keys) && keys[l] < keys[small] {
			small = l
		}
		if r < len(keys) && keys[r] < keys[small] {
			small = r
		}
		if small == i {
			break
		}
		keys[i], keys[small] = keys[small], keys[i]
		i = small
	}
	s.keys = keys
	return least
}
