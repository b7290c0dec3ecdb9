// Package wakeup is the in-process fan-out of wake-ups by key with which
// stores implement runlease's Notifier, RowNotifier and DeleteReadNotifier:
// a subscriber is a buffered channel, either of bare wake-ups (Subscribe),
// of the row each waking write stored (SubscribeRows), or of the tag each
// waking delete carried (SubscribeTags), and a wake-up that arrives while
// one is pending merges into it: a subscriber that was slow to look sees
// the latest row, and a tag only when one wake-up alone is pending.
//
// Lock rule: sending never blocks, and the sends to one [Sub] must not run
// concurrently (each drains the buffer before it fills it, and only senders
// fill it). A [Set] keeps that rule with its mutex, which is a leaf lock:
// held only to read or change the set and to send, never across I/O or a
// call out. A caller that keeps its own subscribers, as the etcd store does
// per watched key, sends with [Sub.Send] under a lock of its own that is a
// leaf lock too.
package wakeup

import (
	"strings"
	"sync"
)

// Sub is one subscriber: exactly one of its channels is set.
type Sub struct {
	wake chan struct{} // Subscribe's
	rows chan string   // SubscribeRows': the latest row, "" when unknown
	tags chan string   // SubscribeTags': the tag of the one pending wake-up, "" for none
}

// tagMark leads a row that is a delete's tag rather than a stored row
// (TagRow): a store that carries rows in its wake-ups (Postgres, in a
// notification's payload) carries a tag the same way, so a listener of an
// earlier version takes it for a row, and wakes its subscribers.
const tagMark = "runlease-tag:"

// TagRow is the row a store wakes a key's subscribers with for a delete
// tagged tag: its row subscribers get none (""), its tag subscribers get
// tag.
func TagRow(tag string) string { return tagMark + tag }

// tagOf returns the tag row carries, "" when it carries none.
func tagOf(row string) string {
	tag, ok := strings.CutPrefix(row, tagMark)
	if !ok {
		return ""
	}
	return tag
}

// NewWake returns a subscriber of bare wake-ups and the channel it receives
// them on, as [Set.Subscribe] hands out.
func NewWake() (*Sub, <-chan struct{}) {
	sub := &Sub{wake: make(chan struct{}, 1)}
	return sub, sub.wake
}

// NewRows returns a subscriber of rows and the channel it receives them on,
// as [Set.SubscribeRows] hands out.
func NewRows() (*Sub, <-chan string) {
	sub := &Sub{rows: make(chan string, 1)}
	return sub, sub.rows
}

// NewTags returns a subscriber of tags and the channel it receives them on,
// as [Set.SubscribeTags] hands out.
func NewTags() (*Sub, <-chan string) {
	sub := &Sub{tags: make(chan string, 1)}
	return sub, sub.tags
}

// Send wakes sub with row ("" when unknown; a [TagRow] for a tagged
// delete) without blocking. A pending wake-up is replaced: a row
// subscriber that was slow to look sees the latest row, and a tag
// subscriber sees "" (two wake-ups merged, so no one tag names them). The
// caller keeps sends to one Sub from running concurrently (see the
// package's lock rule), so the buffer has room once drained.
func (sub *Sub) Send(row string) {
	switch {
	case sub.wake != nil:
		select {
		case sub.wake <- struct{}{}:
		default:
		}
	case sub.tags != nil:
		tag := tagOf(row)
		select {
		case <-sub.tags:
			tag = ""
		default:
		}
		sub.tags <- tag
	default:
		if strings.HasPrefix(row, tagMark) {
			row = "" // a tag is not a row
		}
		select {
		case <-sub.rows:
		default:
		}
		sub.rows <- row
	}
}

// Set is a set of subscribers by key. The zero value is ready to use. Its
// mutex is a leaf lock: waking sends without blocking.
type Set struct {
	mu    sync.Mutex
	byKey map[string]map[*Sub]struct{}
}

// Subscribe adds a subscriber of bare wake-ups of key, for a store's
// Subscribe, and returns its channel and the function that removes it.
func (s *Set) Subscribe(key string) (wake <-chan struct{}, cancel func()) {
	sub, ch := NewWake()
	return ch, s.add(key, sub)
}

// SubscribeRows adds a subscriber of the rows of key, for a store's
// SubscribeRows, and returns its channel and the function that removes it.
func (s *Set) SubscribeRows(key string) (rows <-chan string, cancel func()) {
	sub, ch := NewRows()
	return ch, s.add(key, sub)
}

// SubscribeTags adds a subscriber of the tags of key, for a store's
// SubscribeTags, and returns its channel and the function that removes it.
func (s *Set) SubscribeTags(key string) (tags <-chan string, cancel func()) {
	sub, ch := NewTags()
	return ch, s.add(key, sub)
}

func (s *Set) add(key string, sub *Sub) (cancel func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey == nil {
		s.byKey = map[string]map[*Sub]struct{}{}
	}
	if s.byKey[key] == nil {
		s.byKey[key] = map[*Sub]struct{}{}
	}
	s.byKey[key][sub] = struct{}{}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.byKey[key], sub)
		if len(s.byKey[key]) == 0 {
			delete(s.byKey, key)
		}
	}
}

// Wake wakes every subscriber of key with row, the row the waking write
// stored, or "" when it is not known.
func (s *Set) Wake(key, row string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.byKey[key] {
		sub.Send(row)
	}
}

// WakeAll wakes every subscriber of every key, without a row: each must
// re-read.
func (s *Set) WakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, subs := range s.byKey {
		for sub := range subs {
			sub.Send("")
		}
	}
}

// Count returns how many keys have a subscriber.
func (s *Set) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}

// CountKey returns how many subscribers key has.
func (s *Set) CountKey(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey[key])
}
