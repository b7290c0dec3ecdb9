package etcdstore

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease/internal/wakeup"
)

// A key's watch that ended (compaction, a lost leader, a closed stream)
// starts again after a delay that doubles from minRewatch to maxRewatch
// while the watch keeps failing before it is established, so that a cluster
// without a leader is not asked to watch in a tight loop.
const (
	minRewatch = 100 * time.Millisecond
	maxRewatch = 5 * time.Second
)

// keyWatch is the one etcd watch of a key that every subscriber of the key
// in this store shares. Its fields are guarded by Store.watchMu, a leaf
// lock under which the subscribers are sent to (see package wakeup's lock
// rule).
type keyWatch struct {
	subs   map[*wakeup.Sub]struct{}
	cancel context.CancelFunc
}

// Subscribe implements [runlease.Notifier]: the channel receives a value
// whenever key may have changed, or key's bell rang ([Store.MetaDeleteNotify]
// with key as its wakeKey). The store watches each key that has
// subscribers once, however many there are, key and its bell with the same
// watch; the watch ends with the last subscription.
func (s *Store) Subscribe(key string) (<-chan struct{}, func()) {
	sub, wake := wakeup.NewWake()
	return wake, s.subscribe(key, sub)
}

// SubscribeRows implements [runlease.RowNotifier]: the channel receives the
// row each write of key stored, or "" after a delete, after key's bell rang,
// or when events may have been lost (the watch restarted after a
// compaction, a lost leader or a reconnect the client could not resume):
// then the key must be read.
func (s *Store) SubscribeRows(key string) (<-chan string, func()) {
	sub, rows := wakeup.NewRows()
	return rows, s.subscribe(key, sub)
}

func (s *Store) subscribe(key string, sub *wakeup.Sub) (cancel func()) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.stopped {
		return func() {} // a closed store wakes no one; waiters poll
	}
	if s.watches == nil {
		s.watches = map[string]*keyWatch{}
	}
	w := s.watches[key]
	if w == nil {
		ctx, stop := context.WithCancel(context.Background())
		w = &keyWatch{subs: map[*wakeup.Sub]struct{}{}, cancel: stop}
		s.watches[key] = w
		s.wg.Add(1)
		go s.watch(ctx, key, w)
	}
	w.subs[sub] = struct{}{}
	return func() {
		s.watchMu.Lock()
		defer s.watchMu.Unlock()
		delete(w.subs, sub)
		if len(w.subs) == 0 && s.watches[key] == w {
			delete(s.watches, key)
			w.cancel()
		}
	}
}

// watch runs the watch of key until ctx ends. Each time a watch is
// established, every subscriber is woken without a row: a write between
// its subscription and the watch's start, or between a broken watch and its
// successor, would otherwise be lost. A lost event costs a read, never a
// missed hand-over.
//
// One watch covers key and its bell: the range from key's etcd key to the
// key right after its bell holds those two keys and no other. An event of
// the bell wakes the subscribers without a row, so that a SubscribeRows
// subscriber never takes the bell's value for key's row.
func (s *Store) watch(ctx context.Context, key string, w *keyWatch) {
	defer s.wg.Done()
	full := s.o.prefix + key
	rangeEnd := bellKey(full) + "\x00"
	delay := minRewatch
	for ctx.Err() == nil {
		// Each round has a context of its own, so that a watch this loop
		// gives up on is unregistered even if its channel stays open.
		round, end := context.WithCancel(ctx)
		wch := s.client.Watch(clientv3.WithRequireLeader(round), full, clientv3.WithRange(rangeEnd), clientv3.WithCreatedNotify())
		for resp := range wch {
			if resp.Canceled || resp.Err() != nil {
				break // compacted, no leader, closed: start again
			}
			if resp.Created {
				delay = minRewatch
				s.wake(w, "", false)
				continue
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypePut && string(ev.Kv.Key) == full {
					s.wake(w, string(ev.Kv.Value), true)
				} else {
					s.wake(w, "", false) // key deleted, or its bell rang
				}
			}
		}
		end()
		s.wake(w, "", false)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, maxRewatch)
	}
}

// wake sends row to every subscriber of w without blocking: a pending
// wake-up is replaced, so a slow subscriber sees the latest row. The sends
// run under Store.watchMu, so no two of them to one subscriber run at once.
func (s *Store) wake(w *keyWatch, row string, hasRow bool) {
	if !hasRow {
		row = ""
	}
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for sub := range w.subs {
		sub.Send(row)
	}
}

// stopWatches ends every watch and waits for their goroutines.
func (s *Store) stopWatches() {
	s.watchMu.Lock()
	s.stopped = true
	for key, w := range s.watches {
		w.cancel()
		delete(s.watches, key)
	}
	s.watchMu.Unlock()
	s.wg.Wait()
}
