// Package brokenstore is an in-memory [runlease.Store] that passes the
// conformance suite, and variants of it that are each broken in one way the
// suite must catch. The strength test of storetest runs the suite against
// every variant and requires each to fail the subtest that names its bug,
// and the correct store to pass; a change that weakens the suite so that a
// bug slips through fails that test.
//
// The bugs model what real stores get wrong: a batch that checks a
// condition outside its lock, a call that ignores its context, a scan cut
// off at a page or read page by page, a context error returned bare, a cache
// per handle, and a fault labelled as not applied after the write landed.
// Where a bug needs a race to show, the variant yields between the two
// steps that should have been one, as a store waiting on I/O would, or, for
// a scan read page by page, lets the writes in flight land between pages.
package brokenstore

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/storetest"
)

// Bug names the one way a variant of the store is broken.
type Bug string

// The variants. Each constant's comment says what the variant does wrong.
const (
	// None is the correct store.
	None Bug = "none"
	// WriteSkew checks the conditions of a batch on keys that it only reads
	// before it takes its lock, so two batches that each read the key the
	// other writes can both apply.
	WriteSkew Bug = "write-skew"
	// IgnoresCancel makes MetaBatch and MetaCASMany run on a context that
	// has ended.
	IgnoresCancel Bug = "ignores-cancel"
	// TruncatedScan returns at most the first 100 rows of a scan.
	TruncatedScan Bug = "truncated-scan"
	// PagingScan reads a scan 100 rows at a time, each page at its own
	// instant, with writes landing between pages, as a store that pages
	// through a range under concurrent writes does: rows that move
	// meanwhile are seen twice or not at all.
	PagingScan Bug = "paging-scan"
	// BareContextError returns the context's error itself, not a
	// [*runlease.StorageError] wrapping it.
	BareContextError Bug = "bare-context-error"
	// HandleCache keeps, in each handle, the values it has read or
	// written, and serves reads from them, so a handle does not see what
	// another handle on the same storage wrote.
	HandleCache Bug = "handle-cache"
	// MislabelledFault reports a fault after a write applied as not
	// applied (Unknown false).
	MislabelledFault Bug = "mislabelled-fault"
	// ScanManyOnePage answers each prefix of a MetaScanMany with its first
	// 100 rows only, as a store that sends one ranged read per prefix and
	// ignores that more rows remain.
	ScanManyOnePage Bug = "scan-many-one-page"
)

// Bugs lists every variant but None.
var Bugs = []Bug{WriteSkew, IgnoresCancel, TruncatedScan, PagingScan, BareContextError, HandleCache, MislabelledFault, ScanManyOnePage}

// pageRows is the page of TruncatedScan and PagingScan.
const pageRows = 100

// writeIdle is how long a PagingScan scan waits, between two pages, for
// writes while none lands: a scan with no writer running waits at most
// this long, once, and then reads on.
const writeIdle = 20 * time.Millisecond

// Storage is the table that the handles of one store share, as a database
// is shared by its connections.
type Storage struct {
	bug  Bug
	mu   sync.Mutex
	rows map[string]string

	// PagingScan only. The scan that is reading page by page holds the
	// turn (paging); between two of its pages it lets quota more writes
	// land and holds back any later write until it has read the next
	// page. held counts the writes held back. writing is when writes were
	// last seen coming: one landed, or a page read kept them waiting.
	// turn, on mu, wakes the scan and the writes held back.
	paging  bool
	quota   int
	held    int
	writing time.Time
	turn    *sync.Cond
}

// NewStorage returns empty storage whose handles have bug.
func NewStorage(bug Bug) *Storage {
	st := &Storage{bug: bug, rows: map[string]string{}}
	st.turn = sync.NewCond(&st.mu)
	return st
}

// Open returns a new handle on st.
func (st *Storage) Open() *Store { return &Store{st: st, cache: map[string]cached{}} }

// Store is one handle on a [Storage]. It implements [runlease.Store],
// [runlease.Batcher], [runlease.MultiCASer], [runlease.MultiScanner] and
// [runlease.RangeReader], and is safe for concurrent use.
type Store struct {
	st *Storage

	cacheMu sync.Mutex
	cache   map[string]cached // HandleCache only

	faultMu sync.Mutex
	fault   storetest.Fault // armed by Inject, taken by the next write
}

type cached struct {
	value string
	found bool
}

// Harness returns the storetest harness of the variant with bug: a fresh
// storage per store, a second handle on it, and faults injected in the
// store itself.
func Harness(bug Bug) storetest.Harness {
	return storetest.Harness{
		New:    func(*testing.T) runlease.Store { return NewStorage(bug).Open() },
		Reopen: func(_ *testing.T, s runlease.Store) runlease.Store { return s.(*Store).st.Open() },
		Faulty: func(*testing.T) storetest.FaultyStore {
			s := NewStorage(bug).Open()
			return storetest.FaultyStore{Store: s, Inject: s.Inject}
		},
	}
}

// Inject arms f for the next write, as [storetest.FaultyStore] describes.
// A fault before the write applies fails it with nothing written; one after
// writes and then fails, labelled as an unknown outcome (or, with
// MislabelledFault, as not applied).
func (s *Store) Inject(f storetest.Fault) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.fault = f
}

// takeFault returns the armed fault and disarms it.
func (s *Store) takeFault() storetest.FaultKind {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	k := s.fault.Kind
	s.fault = storetest.Fault{}
	return k
}

// faultBefore reports the armed fault's error if it strikes before the
// write. Otherwise after, if not nil, must be called once the write is
// done, and returns the error to report then.
func (s *Store) faultBefore(op string) (before error, after func() error) {
	switch s.takeFault() {
	case storetest.FaultBeforeApply:
		return &runlease.StorageError{Op: op, Err: errInjected}, nil
	case storetest.FaultAfterApply:
		return nil, func() error {
			return &runlease.StorageError{Op: op, Unknown: s.st.bug != MislabelledFault, Err: errInjected}
		}
	}
	return nil, nil
}

var errInjected = injectedError{}

type injectedError struct{}

func (injectedError) Error() string { return "injected fault" }

// ctxErr returns the fault for a call whose context has ended, or nil.
func (s *Store) ctxErr(ctx context.Context, op, key string) error {
	err := ctx.Err()
	if err == nil || s.st.bug == BareContextError {
		return err
	}
	return &runlease.StorageError{Op: op, Key: key, Err: err}
}

// remember records what this handle last read or wrote at key.
func (s *Store) remember(key, value string, found bool) {
	if s.st.bug != HandleCache {
		return
	}
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	s.cache[key] = cached{value, found}
}

// MetaGet implements [runlease.Store].
func (s *Store) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if err := runlease.CheckKey(key); err != nil {
		return "", false, err
	}
	if err := s.ctxErr(ctx, "MetaGet", key); err != nil {
		return "", false, err
	}
	if s.st.bug == HandleCache {
		s.cacheMu.Lock()
		c, ok := s.cache[key]
		s.cacheMu.Unlock()
		if ok {
			return c.value, c.found, nil
		}
	}
	s.st.mu.Lock()
	v, found := s.st.rows[key]
	s.st.mu.Unlock()
	s.remember(key, v, found)
	return v, found, nil
}

// MetaCAS implements [runlease.Store].
func (s *Store) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := runlease.CheckKey(key); err != nil {
		return false, err
	}
	if err := runlease.CheckValue(value); err != nil {
		return false, err
	}
	return s.write(ctx, "MetaCAS", key, func() bool {
		v, found := s.st.rows[key]
		if found != (expected != nil) || (found && v != *expected) {
			return false
		}
		s.st.rows[key] = value
		s.remember(key, value, true)
		return true
	})
}

// MetaDelete implements [runlease.Store].
func (s *Store) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if err := runlease.CheckKey(key); err != nil {
		return false, err
	}
	return s.write(ctx, "MetaDelete", key, func() bool {
		if v, found := s.st.rows[key]; !found || v != expected {
			return false
		}
		delete(s.st.rows, key)
		s.remember(key, "", false)
		return true
	})
}

// write runs apply under the storage's lock, with the context checked and
// the armed fault struck around it.
func (s *Store) write(ctx context.Context, op, key string, apply func() bool) (bool, error) {
	if err := s.ctxErr(ctx, op, key); err != nil {
		return false, err
	}
	before, after := s.faultBefore(op)
	if before != nil {
		return false, before
	}
	s.st.mu.Lock()
	s.st.admit()
	ok := apply()
	if ok {
		s.st.landed()
	}
	s.st.mu.Unlock()
	if after != nil {
		return false, after()
	}
	return ok, nil
}

// admit holds back a write, for PagingScan, while a scan is between two
// pages and the writes it lets in have all landed, until the scan has read
// its next page or ended. st.mu must be held; it is released while the
// write waits.
func (st *Storage) admit() {
	for st.bug == PagingScan && st.paging && st.quota == 0 {
		st.held++
		st.turn.Wait()
		st.held--
	}
}

// landed records, for PagingScan, that a write changed the rows, and wakes
// the scan between pages once the writes it lets in have all landed. st.mu
// must be held.
func (st *Storage) landed() {
	if st.bug != PagingScan {
		return
	}
	st.writing = time.Now()
	if st.paging && st.quota > 0 {
		st.quota--
		if st.quota == 0 {
			st.turn.Broadcast()
		}
	}
}

// wake wakes whatever waits on st.turn, to look again at why it waits.
func (st *Storage) wake() {
	st.mu.Lock()
	st.turn.Broadcast()
	st.mu.Unlock()
}

// MetaScan implements [runlease.Store].
func (s *Store) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	if err := runlease.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	if err := s.ctxErr(ctx, "MetaScan", prefix); err != nil {
		return nil, err
	}
	if s.st.bug != PagingScan {
		s.st.mu.Lock()
		defer s.st.mu.Unlock()
		rows := s.st.page(prefix, "", -1)
		if s.st.bug == TruncatedScan && len(rows) > pageRows {
			rows = rows[:pageRows]
		}
		return rows, nil
	}
	return s.st.pagingScan(ctx, prefix), nil
}

// pagingScan is MetaScan for PagingScan: the rows of prefix read 100 at a
// time, each page at its own instant, with writes landing between pages.
//
// Between two pages the scan lets in 1 to 4 writes, the number drawn at
// random for each gap, waits for them to land, and holds back any later
// write until it has read the next page. If writes stop coming (none for
// writeIdle), or ctx ends, it reads on without them. A scan that only
// yielded between pages would leave it to the scheduler whether any write
// lands between them, and how many: a writer that is not running during a
// scan writes nothing between its pages. Here, while a writer keeps
// writing, the number of writes that land between any two pages of a scan
// is as likely to be even as odd, and each value modulo 4 is as likely as
// another, so a row that moves meanwhile is seen twice or missed in a
// steady share of scans, however the goroutines are scheduled.
//
// One scan at a time pages through the storage; another waits its turn.
func (st *Storage) pagingScan(ctx context.Context, prefix string) []runlease.Row {
	stop := context.AfterFunc(ctx, st.wake)
	defer stop()
	st.mu.Lock()
	defer st.mu.Unlock()
	for st.paging {
		st.turn.Wait()
	}
	st.paging = true
	defer func() {
		st.paging, st.quota = false, 0
		st.turn.Broadcast()
	}()
	var out []runlease.Row
	after := ""
	for {
		readAt := time.Now()
		rows := st.page(prefix, after, pageRows)
		out = append(out, rows...)
		if len(rows) < pageRows {
			return out
		}
		after = rows[len(rows)-1].Key
		// Writes kept from landing by the page just read are still
		// coming: their wait for writeIdle starts now.
		if st.held > 0 || readAt.Sub(st.writing) < writeIdle {
			st.writing = time.Now()
		}
		st.quota = 1 + rand.IntN(4)
		st.turn.Broadcast()
		st.awaitQuota(ctx)
		st.quota = 0
	}
}

// awaitQuota waits until the writes a scan lets in between two pages have
// landed, until writeIdle has passed since writes were last seen coming,
// or until ctx ends. st.mu must be held; it is released while the scan
// waits.
func (st *Storage) awaitQuota(ctx context.Context) {
	for st.quota > 0 && ctx.Err() == nil {
		idle := time.Until(st.writing.Add(writeIdle))
		if idle <= 0 {
			return
		}
		timer := time.AfterFunc(idle, st.wake)
		st.turn.Wait()
		timer.Stop()
	}
}

// page returns, in key order, up to n rows (every row when n < 0) whose key
// starts with prefix and sorts after after. st.mu must be held.
func (st *Storage) page(prefix, after string, n int) []runlease.Row {
	var rows []runlease.Row
	for k, v := range st.rows {
		if strings.HasPrefix(k, prefix) && (after == "" || k > after) {
			rows = append(rows, runlease.Row{Key: k, Value: v})
		}
	}
	slices.SortFunc(rows, func(a, b runlease.Row) int { return strings.Compare(a.Key, b.Key) })
	if n >= 0 && len(rows) > n {
		rows = rows[:n]
	}
	return rows
}
