package runlease

import (
	"context"
	"io"
	"slices"
)

// This file holds the optional capabilities of a [Store], with their
// argument types and the Check* helpers their implementations call, and
// what a store that holds resources needs for Close ([ClosableStore],
// [ClosedReporter], [ForgetStore]). The library detects each capability
// with a type assertion on the Store it is given; see [Store] on which of
// these are the stable contract.

// Batcher is an optional capability of a Store: several conditions and
// several writes applied all together or not at all, in the shape of etcd's
// Txn(If…).Then(…). Both built-in stores implement it in one transaction
// (one round trip on Postgres). [Lease.Write] needs it, and [ClaimSlots]
// uses it, when present, so that a refused claim never writes anything.
type Batcher interface {
	// MetaBatch applies ops, in order, if and only if every condition holds
	// at one instant, and reports whether it did. A condition that does not
	// hold is not an error: applied is false and nothing was written.
	//
	// Keys and values follow the Store's rules (see [CheckKey] and
	// [CheckValue]); a batch with an invalid key or value, no ops, more than
	// [MaxBatch] conditions or ops, or two ops on one key is refused with
	// [ErrInvalidArgument] before anything is sent ([CheckBatch] does
	// this). Faults are reported as for the Store's other methods, with
	// Unknown set when the batch may have been applied. The batch must be
	// atomic and isolated with respect to every other call on the store,
	// including single-key calls from other processes.
	MetaBatch(ctx context.Context, conds []Cond, ops []Op) (applied bool, err error)
}

// MaxBatch is the most conditions, and the most ops, one batch may have.
const MaxBatch = 256

// Cond is a condition of a batch: Key holds exactly *Value, or, when Value
// is nil, Key is absent. Make one with [IfEquals] or [IfAbsent].
type Cond struct {
	Key   string
	Value *string
}

// IfEquals is the condition that key holds exactly value.
func IfEquals(key, value string) Cond { return Cond{Key: key, Value: &value} }

// IfAbsent is the condition that key is absent.
func IfAbsent(key string) Cond { return Cond{Key: key} }

// Op is a write of a batch: Key is set to Value, or removed when Delete is
// set (removing an absent key is not an error). Make one with [Put] or
// [Delete].
type Op struct {
	Key    string
	Value  string
	Delete bool
}

// Put is the op that sets key to value.
func Put(key, value string) Op { return Op{Key: key, Value: value} }

// Delete is the op that removes key.
func Delete(key string) Op { return Op{Key: key, Delete: true} }

// CheckBatch returns an [ErrInvalidArgument] error when a batch breaks the
// rules of [Batcher.MetaBatch], and nil otherwise. Batcher implementations
// call it before touching storage.
func CheckBatch(conds []Cond, ops []Op) error {
	if len(ops) == 0 {
		return invalidArg("ops", "a batch needs at least one op")
	}
	if len(conds) > MaxBatch || len(ops) > MaxBatch {
		return invalidArg("batch", "%d conditions and %d ops; the limit is %d each", len(conds), len(ops), MaxBatch)
	}
	for _, c := range conds {
		if err := CheckKey(c.Key); err != nil {
			return err
		}
		if c.Value != nil {
			if err := CheckValue(*c.Value); err != nil {
				return err
			}
		}
	}
	keys := make([]string, 0, len(ops))
	for _, op := range ops {
		if err := CheckKey(op.Key); err != nil {
			return err
		}
		if err := CheckValue(op.Value); err != nil {
			return err
		}
		keys = append(keys, op.Key)
	}
	slices.Sort(keys)
	for i := 1; i < len(keys); i++ {
		if keys[i] == keys[i-1] {
			return invalidArg("ops", "two ops on key %q", keys[i])
		}
	}
	return nil
}

// MultiCASer is an optional capability of a Store: many independent
// conditional writes in one call, each applied or not on its own, as MetaCAS
// would. A [Renewer] uses it to renew many leases in one round trip (one
// batch of two statements on Postgres, one transaction on SQLite), so that
// one process can keep a hundred thousand leases alive.
type MultiCASer interface {
	// MetaCASMany performs every write in writes and reports, for each,
	// whether it applied. It is not atomic as a whole: some writes may apply
	// and others not. Writes with invalid keys or values, two writes of one
	// key, or more than [MaxMultiCAS] writes are refused with
	// [ErrInvalidArgument] before anything is sent ([CheckCASMany] does
	// this). A fault leaves every write's outcome unknown or not applied,
	// as the error says.
	MetaCASMany(ctx context.Context, writes []CASWrite) (swapped []bool, err error)
}

// MaxMultiCAS is the most writes one MetaCASMany call may take.
const MaxMultiCAS = 1024

// CASWrite is one write of [MultiCASer.MetaCASMany]: Value is written at Key
// if Key holds exactly *Expected, or, when Expected is nil, if Key is absent.
type CASWrite struct {
	Key      string
	Expected *string
	Value    string
}

// CheckCASMany returns an [ErrInvalidArgument] error when writes break the
// rules of [MultiCASer.MetaCASMany], and nil otherwise.
func CheckCASMany(writes []CASWrite) error {
	if len(writes) > MaxMultiCAS {
		return invalidArg("writes", "%d writes; the limit is %d", len(writes), MaxMultiCAS)
	}
	keys := make([]string, len(writes))
	for i, w := range writes {
		if err := CheckKey(w.Key); err != nil {
			return err
		}
		if err := CheckValue(w.Value); err != nil {
			return err
		}
		keys[i] = w.Key
	}
	slices.Sort(keys)
	for i := 1; i < len(keys); i++ {
		if keys[i] == keys[i-1] {
			return invalidArg("writes", "two writes of key %q", keys[i])
		}
	}
	return nil
}

// MultiScanner is an optional capability of a Store: several MetaScans in
// one call, which a networked store sends in one round trip. A claim of
// slots reads a scope's slot rows and its queue with it, so that the queue
// costs a claim no round trip of its own. Both built-in stores implement
// it.
type MultiScanner interface {
	// MetaScanMany returns, for each prefix, what MetaScan of it returns.
	// It is not a snapshot: each scan is linearizable on its own. More than
	// [MaxScanMany] prefixes, or an invalid one, is refused with
	// [ErrInvalidArgument] before anything is read ([CheckPrefixes] does
	// this).
	MetaScanMany(ctx context.Context, prefixes []string) ([][]Row, error)
}

// MaxScanMany is the most prefixes one MetaScanMany call may take, and the
// most ranges one MetaRanges call may take.
const MaxScanMany = 16

// CheckPrefixes returns an [ErrInvalidArgument] error when prefixes is not
// a list [MultiScanner.MetaScanMany] accepts, and nil otherwise.
func CheckPrefixes(prefixes []string) error {
	if len(prefixes) > MaxScanMany {
		return invalidArg("prefixes", "%d prefixes; the limit is %d", len(prefixes), MaxScanMany)
	}
	for _, p := range prefixes {
		if err := CheckPrefix(p); err != nil {
			return err
		}
	}
	return nil
}

// Range is one ordered read of [RangeReader]: at most Limit rows whose key
// starts with Prefix and is greater than After, in ascending byte order of
// key. After "" starts at the first key of the prefix; Limit 0 reads every
// row the range holds (a MetaScan of Prefix, cut at After).
type Range struct {
	Prefix string
	After  string
	Limit  int
}

// RangeReader is an optional capability of a Store: ordered reads of the
// first rows of several prefixes, in one call that a networked store sends
// in one round trip. The admission queue keeps a waiter's rank in its key,
// so the head of a queue is the first rows of its prefix: with this, a
// claim or a wake-up reads only the head, and costs the same behind a
// queue of ten entries or of a hundred thousand. Without it the library
// reads the whole prefix and keeps the head itself (correct, and as slow
// as the queue is long). Both built-in stores and the etcd store implement
// it.
type RangeReader interface {
	// MetaRanges returns, for each range, its rows: what MetaScan of
	// the range's prefix returns, without the keys up to and including
	// After, and cut after Limit rows when Limit is positive. It is not a
	// snapshot: each range is linearizable on its own. More than
	// [MaxScanMany] ranges, an invalid prefix or after key, or a negative
	// limit is refused with [ErrInvalidArgument] before anything is read
	// ([CheckRanges] does this).
	MetaRanges(ctx context.Context, ranges []Range) ([][]Row, error)
}

// CheckRanges returns an [ErrInvalidArgument] error when ranges is not a
// list [RangeReader.MetaRanges] accepts, and nil otherwise.
func CheckRanges(ranges []Range) error {
	if len(ranges) > MaxScanMany {
		return invalidArg("ranges", "%d ranges; the limit is %d", len(ranges), MaxScanMany)
	}
	for _, r := range ranges {
		if err := CheckPrefix(r.Prefix); err != nil {
			return err
		}
		if len(r.After) > MaxKeyLen {
			return invalidArg("after", "%d bytes long, the limit is %d", len(r.After), MaxKeyLen)
		}
		if err := checkText("after", r.After); err != nil {
			return err
		}
		if r.Limit < 0 {
			return invalidArg("limit", "%d is negative", r.Limit)
		}
	}
	return nil
}

// Notifier is an optional capability of a Store: conditional writes that
// wake the waiters of a key, so that a released lease is handed over in
// milliseconds rather than a poll interval. The Postgres store implements it
// with LISTEN/NOTIFY, across processes; the SQLite store within its process.
// Notifications are hints: a waiter always re-reads, and falls back to
// polling when a notification is lost.
type Notifier interface {
	// MetaCASNotify is MetaCAS that, when it writes, wakes the subscribers
	// of key (once the write is visible to them).
	MetaCASNotify(ctx context.Context, key string, expected *string, value string) (swapped bool, err error)
	// Subscribe returns a channel that receives a value whenever key may
	// have changed, and a function that ends the subscription. The channel
	// is buffered: wake-ups that arrive while one is pending merge into it.
	Subscribe(key string) (wake <-chan struct{}, cancel func())
}

// RowNotifier is an optional refinement of [Notifier] whose wake-ups carry
// the row the waking write stored, so that a waiter woken by a release can
// take the lease over at once instead of reading the row first: a handoff
// is then two round trips, the release and the takeover. Both built-in
// stores implement it. A row carried is a hint like the wake-up itself: the
// waiter's write is conditional on it, and a row that changed since only
// costs a read.
type RowNotifier interface {
	Notifier
	// SubscribeRows is Subscribe whose channel receives the row each waking
	// write stored, or "" when a wake-up carries none (after a reconnect,
	// say): then the key must be read. A pending wake-up is replaced by a
	// later one, so a receive yields the latest.
	SubscribeRows(key string) (rows <-chan string, cancel func())
}

// DeleteNotifier is an optional capability of a [Notifier] Store: a
// conditional delete that, when it deletes, wakes the subscribers of
// another key. A released slot wakes the waiters of its scope's queue with
// it, so that the next run is admitted in milliseconds rather than a poll
// interval. Both built-in stores implement it: the Postgres store with
// LISTEN/NOTIFY in the delete's own statement, and only when a subscriber
// waits; the SQLite store within its process.
type DeleteNotifier interface {
	Notifier
	// MetaDeleteNotify is MetaDelete that, when it deletes, wakes the
	// subscribers of wakeKey (once the delete is visible to them).
	MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (deleted bool, err error)
}

// DeleteReadNotifier is an optional refinement of [DeleteNotifier]: the
// conditional delete that wakes the subscribers of another key, with a tag
// its own wake-up carries, and ordered reads after it, in one call that a
// networked store sends in one round trip. A released slot reads the head
// of its scope's queue with it and hands that read to the waiters of its
// own process, who are admitted on it without a wake-up read of their own;
// the tag tells its process's subscription which wake-up is the release's
// own, already answered. Both built-in stores implement it.
type DeleteReadNotifier interface {
	DeleteNotifier
	// MetaDeleteNotifyRanges is MetaDeleteNotify whose wake-up of wakeKey
	// carries tag to the key's SubscribeTags subscribers, followed by
	// MetaRanges of ranges, read after the delete (and seeing it, when it
	// deleted) whether or not it deleted. deleted and err are the
	// delete's, as MetaDeleteNotify reports them; rows are the reads', or
	// nil when they were not made or failed (the reads are a hint: their
	// fault is not reported).
	// An invalid tag ([CheckTag]), or what MetaDeleteNotify or MetaRanges
	// refuse, is refused with [ErrInvalidArgument] before anything is
	// written or read.
	MetaDeleteNotifyRanges(ctx context.Context, key, expected, wakeKey, tag string, ranges []Range) (deleted bool, rows [][]Row, err error)
	// SubscribeTags is Subscribe whose channel receives, for each wake-up,
	// the tag of the MetaDeleteNotifyRanges call that sent it, or "" when
	// it carries none: any other wake-up, and two or more that merged
	// while pending (a receive then stands for all of them).
	SubscribeTags(key string) (tags <-chan string, cancel func())
}

// MaxTagLen is the longest tag [DeleteReadNotifier.MetaDeleteNotifyRanges]
// takes.
const MaxTagLen = 64

// checkDeleteRead returns an [ErrInvalidArgument] error when the wake key,
// tag or ranges of a MetaDeleteNotifyRanges call are not ones it takes.
func checkDeleteRead(wakeKey, tag string, ranges []Range) error {
	if err := CheckKey(wakeKey); err != nil {
		return err
	}
	if err := CheckTag(tag); err != nil {
		return err
	}
	return CheckRanges(ranges)
}

// CheckTag returns an [ErrInvalidArgument] error when tag is not one
// [DeleteReadNotifier.MetaDeleteNotifyRanges] takes: empty, longer than
// [MaxTagLen], or not text a key could hold.
func CheckTag(tag string) error {
	if tag == "" {
		return invalidArg("tag", "empty")
	}
	if len(tag) > MaxTagLen {
		return invalidArg("tag", "%d bytes long, the limit is %d", len(tag), MaxTagLen)
	}
	return checkText("tag", tag)
}

// ClosableStore is a [Store] that holds resources until Close: a file lock
// and database handles, or a connection pool. [Open] returns one;
// [*SQLiteStore] and [*PostgresStore] implement it. Close follows the
// store's own contract: it is idempotent, and calls after it fail with
// [ErrStoreClosed]. A store that holds resources calls [ForgetStore] from
// its Close, and should implement [ClosedReporter].
type ClosableStore interface {
	Store
	io.Closer
}

// ClosedReporter is an optional capability of a store that can be closed:
// Closed reports whether its Close has begun, without I/O. It must report
// true from before Close calls [ForgetStore] on, and must be safe for
// concurrent use. The library then remembers no released row of a closed
// store (see [ForgetStore]), even one whose release was in flight when
// Close began. Both built-in stores implement it.
type ClosedReporter interface {
	Closed() bool
}

// ForgetStore forgets what the library remembers of store in this process,
// so that nothing here keeps a closed store reachable. The library
// remembers the rows its Leases released, by Store value, to take a run
// released here again in one round trip; those rows refer to the Store
// value. A store that holds resources (a file, a pool,
// goroutines) calls ForgetStore from its Close, after it has begun refusing
// calls, with the Store value its users hand the library (the value whose
// Close it is, not a value it embeds); a store that wraps another and says
// so with Unwrap (see [Store]) may pass itself, and the rows of the store
// it wraps are forgotten.
//
// A release in flight when Close began may still remember its row after
// ForgetStore returns, unless the store implements [ClosedReporter], whose
// Closed reports true by the time Close calls ForgetStore, or Close calls
// ForgetStore only once the calls in flight have returned. A store that
// never calls it stays reachable while a row of it is remembered: until
// its run is acquired or pruned again here, or until 1024 later releases
// have pushed the row out. ForgetStore is safe for concurrent use, and
// walks the remembered rows, 1024 at most.
func ForgetStore(store Store) {
	forgetReleasedOf(storeIdentity(store))
}
