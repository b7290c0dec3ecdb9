package runlease

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"modernc.org/sqlite"
)

// advHoldMarker names the files whose writer connections take the commit
// hook of advHoldCommit.
const advHoldMarker = "advhold-"

// advHoldCommit maps the base name of a store file to a func called inside
// each commit on its connections (it may block the commit).
var advHoldCommit sync.Map // string → func()

func init() {
	sqlite.RegisterConnectionHook(func(conn sqlite.ExecQuerierContext, dsn string) error {
		if !strings.Contains(dsn, advHoldMarker) {
			return nil
		}
		hooks, ok := conn.(sqlite.HookRegisterer)
		if !ok {
			return errors.New("the SQLite connection takes no commit hook")
		}
		hooks.RegisterCommitHook(func() int32 {
			advHoldCommit.Range(func(name, fn any) bool {
				if strings.Contains(dsn, name.(string)) {
					fn.(func())()
				}
				return true
			})
			return 0
		})
		return nil
	})
}

// A group commit under faults keeps the Store contract (store.go) and the
// design in CONCURRENCY.md: calls whose contexts end, statements that fail
// or roll the transaction back, a full file, and Close.

// store.go: "Every method must be linearizable: it takes effect at one
// instant between its call and its return." A follower taken into a running
// group whose context ends must not return while the group's transaction is
// still open, or its write would take effect after the call returned, and a
// read-back made right after the return (what resolveCAS, tryAcquire and
// updateLocked do) would see it not applied.
func TestSQLiteGroupACallTakenIntoAGroupLandsBeforeItReturns(t *testing.T) {
	verifyNoLeaks(t)
	g := openGroupStore(t, advHoldMarker+"late.db")
	leader := g.lead(t)
	first := start(func() (bool, error) { return g.MetaCAS(t.Context(), "first", nil, "v") })
	waitQueue(t, g.SQLiteStore, queued(1))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	taken := start(func() (bool, error) { return g.MetaCAS(ctx, "taken", nil, "v") })
	waitQueue(t, g.SQLiteStore, queued(2))

	// Block the group's commit (the second commit on the connection: the
	// leader's own is the first) once its statements have run.
	inCommit, letCommit := make(chan struct{}), make(chan struct{})
	var commits atomic.Int32
	name := filepath.Base(g.path)
	advHoldCommit.Store(name, func() {
		if commits.Add(1) == 2 {
			close(inCommit)
			<-letCommit
		}
	})
	t.Cleanup(func() { advHoldCommit.Delete(name) })
	g.release()
	require.NoError(t, (<-leader).err)
	<-inCommit // both statements of the group ran; the commit is under way

	cancel()
	var r call
	var foundAtReturn bool
	select {
	case r = <-taken: // returned while its transaction is still open
		var err error
		_, foundAtReturn, err = g.MetaGet(t.Context(), "taken")
		require.NoError(t, err)
		close(letCommit)
	case <-time.After(300 * time.Millisecond): // waits for the commit
		close(letCommit)
		r = <-taken
		var err error
		_, foundAtReturn, err = g.MetaGet(t.Context(), "taken")
		require.NoError(t, err)
	}
	require.NoError(t, (<-first).err)
	_, foundLater, err := g.MetaGet(t.Context(), "taken")
	require.NoError(t, err)
	switch {
	case r.err == nil:
		assert.True(t, r.ok && foundAtReturn, "reported applied")
	case !unknown(r.err):
		assert.False(t, foundLater, "reported not applied, committed: %v", r.err)
	}
	assert.Equal(t, foundAtReturn, foundLater,
		"the write of a call that returned (%v) took effect after it returned", r.err)
}

// CONCURRENCY.md rule 7: "A write still queued when its context ends leaves
// the queue and fails as not applied ... (if it had been promoted, the lead
// passes to the next in the queue)". A promoted call whose context ended
// does not lead: nothing of it is sent, and it is reported not applied,
// not "outcome unknown".
func TestSQLiteGroupAPromotedCallWhoseContextEndedIsNotApplied(t *testing.T) {
	verifyNoLeaks(t)
	g := openGroupStore(t, "promoted.db")
	q := &g.group
	// Stand for a leader whose commit is in flight.
	q.mu.Lock()
	q.leading = true
	q.mu.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	head := start(func() (bool, error) { return g.MetaCAS(ctx, "head", nil, "v") })
	waitQueue(t, g.SQLiteStore, queued(1))
	// The leader is done and hands the lead on, just as the head's context
	// ends (the head sees both under the lock).
	q.mu.Lock()
	cancel()
	time.Sleep(10 * time.Millisecond) // let the head wake on its context
	q.promoteLocked()
	q.mu.Unlock()
	r := <-head
	require.ErrorIs(t, r.err, context.Canceled)
	_, found, err := g.MetaGet(t.Context(), "head")
	require.NoError(t, err)
	require.False(t, found)
	assert.False(t, unknown(r.err), "nothing was sent: the outcome is known (not applied): %v", r.err)
}

// store.go: "Every method must honour ctx". While another connection holds
// SQLite's write lock, the leader of a group of two or more returns with its
// context's error as soon as that context ends, as the same call alone (one
// transaction per call, or a group of one) does, whose busy handler watches
// the context; not after the whole busy_timeout (10 s) with SQLITE_BUSY.
func TestSQLiteGroupLeaderHonoursItsContextWhileLocked(t *testing.T) {
	verifyNoLeaks(t)
	g := openGroupStore(t, "leaderctx.db")
	leader := g.lead(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	head := start(func() (bool, error) { return g.MetaCAS(ctx, "head", nil, "v") })
	waitQueue(t, g.SQLiteStore, queued(1))
	behindCtx, cancelBehind := context.WithCancel(t.Context())
	defer cancelBehind()
	behind := start(func() (bool, error) { return g.MetaCAS(behindCtx, "behind", nil, "v") })
	waitQueue(t, g.SQLiteStore, queued(2))
	again := make(chan func(), 1)
	var once sync.Once
	g.onCommit(func(int) { once.Do(func() { again <- holdWriteLock(t, g.path) }) })
	g.release()
	require.NoError(t, (<-leader).err)
	release := <-again
	defer release()
	waitQueue(t, g.SQLiteStore, func(q *groupQueue) bool { return len(q.queue) == 0 })
	time.Sleep(50 * time.Millisecond) // the group now waits in BEGIN IMMEDIATE

	began := time.Now()
	cancel()
	cancelBehind()
	rb := <-behind
	require.ErrorIs(t, rb.err, context.Canceled)
	r := <-head
	took := time.Since(began)
	assert.ErrorIs(t, r.err, context.Canceled, "the leader's context ended: %v", r.err)
	assert.Less(t, took, 2*time.Second, "the leader returned %v after its context (and every context of its group) ended", took)
}

// CONCURRENCY.md rule 4: "a failing write leaves nothing behind and the
// others go on." A one-statement write that fails on a constraint (a
// trigger's RAISE(ABORT): SQLite takes back the statement, the transaction
// goes on) fails alone: every other write of its group commits.
func TestSQLiteGroupAFailedStatementFailsOnlyItsOwnWrite(t *testing.T) {
	verifyNoLeaks(t)
	g := openGroupStore(t, "fateshare.db")
	_, err := g.w.ExecContext(t.Context(), `CREATE TRIGGER refuse BEFORE INSERT ON runlease_meta
		WHEN NEW.key = 'refused' BEGIN SELECT RAISE(ABORT, 'refused'); END`)
	require.NoError(t, err)
	leader := g.lead(t)
	outs := []<-chan call{
		start(func() (bool, error) { return g.MetaCAS(t.Context(), "a", nil, "v") }),
	}
	waitQueue(t, g.SQLiteStore, queued(1))
	outs = append(outs, start(func() (bool, error) { return g.MetaCAS(t.Context(), "refused", nil, "v") }))
	waitQueue(t, g.SQLiteStore, queued(2))
	outs = append(outs, start(func() (bool, error) { return g.MetaCAS(t.Context(), "d", nil, "v") }))
	waitQueue(t, g.SQLiteStore, queued(3))
	g.release()
	require.NoError(t, (<-leader).err)
	rows, err := g.MetaScan(t.Context(), "")
	require.NoError(t, err)
	for i, o := range outs {
		r := <-o
		if i == 1 {
			require.Error(t, r.err)
			assert.False(t, unknown(r.err))
			continue
		}
		// Whatever happens, the accounting must hold.
		if r.err != nil {
			assert.False(t, unknown(r.err))
			assert.NotContains(t, rows, Row{Key: []string{"a", "", "d"}[i], Value: "v"}, "call %d failed not applied but committed", i)
		}
		assert.NoError(t, r.err, "call %d failed because another write of its group did", i)
	}
}

// A statement that makes SQLite roll back the whole transaction, inside a
// group: a trigger's RAISE(ROLLBACK), in a one-statement write and in a
// batch. Nothing of the group may commit (no write after it may run in
// autocommit mode), every write is told not applied, and the store writes
// again afterwards.
func TestSQLiteGroupARollbackInsideAGroupCommitsNothing(t *testing.T) {
	verifyNoLeaks(t)
	for _, multi := range []bool{false, true} {
		t.Run(fmt.Sprintf("multi=%v", multi), func(t *testing.T) {
			g := openGroupStore(t, "rollback.db")
			_, err := g.w.ExecContext(t.Context(), `CREATE TRIGGER rb BEFORE INSERT ON runlease_meta
				WHEN NEW.key = 'rb' BEGIN SELECT RAISE(ROLLBACK, 'rolled back'); END`)
			require.NoError(t, err)
			leader := g.lead(t)
			steps := []func() (bool, error){
				func() (bool, error) { return g.MetaCAS(t.Context(), "a", nil, "v") },
				func() (bool, error) {
					return g.MetaBatch(t.Context(), nil, []Op{Put("b", "v"), Put("b2", "v")})
				},
				func() (bool, error) {
					if multi {
						return g.MetaBatch(t.Context(), nil, []Op{Put("c", "v"), Put("rb", "v")})
					}
					return g.MetaCAS(t.Context(), "rb", nil, "v")
				},
				func() (bool, error) { return g.MetaCAS(t.Context(), "d", nil, "v") },
				func() (bool, error) {
					return g.MetaBatch(t.Context(), nil, []Op{Put("e", "v"), Put("e2", "v")})
				},
				func() (bool, error) {
					sw, err := g.MetaCASMany(t.Context(), []CASWrite{{Key: "f", Value: "v"}})
					return len(sw) == 1 && sw[0], err
				},
			}
			var outs []<-chan call
			for i, st := range steps {
				outs = append(outs, start(st))
				waitQueue(t, g.SQLiteStore, queued(i+1))
			}
			g.release()
			require.NoError(t, (<-leader).err)
			rows, err := g.MetaScan(t.Context(), "")
			require.NoError(t, err)
			have := map[string]bool{}
			for _, r := range rows {
				have[r.Key] = true
			}
			keys := []string{"a", "b", "c", "d", "e", "f"}
			for i, o := range outs {
				r := <-o
				if i == 2 {
					require.Error(t, r.err)
				}
				if r.err == nil {
					assert.True(t, have[keys[i]], "call %d reported applied, not committed", i)
					continue
				}
				var se *StorageError
				require.ErrorAs(t, r.err, &se, "call %d", i)
				assert.False(t, se.Unknown, "call %d: %v", i, r.err)
				assert.False(t, have[keys[i]], "call %d reported not applied, committed", i)
			}
			assert.False(t, have["b2"] != have["b"] || have["e2"] != have["e"], "a batch applied in part")
			assert.False(t, have["c"])
			ok, err := g.MetaCAS(t.Context(), "after", nil, "v")
			require.NoError(t, err)
			assert.True(t, ok)
		})
	}
}

// A full file (SQLITE_FULL) met by a one-statement write in the middle of a
// group: the group's accounting holds, and the store writes again.
func TestSQLiteGroupAFullFileKeepsTheAccounting(t *testing.T) {
	verifyNoLeaks(t)
	g := openGroupStore(t, "full1.db")
	_, err := g.w.ExecContext(t.Context(), "PRAGMA max_page_count = 3")
	require.NoError(t, err)
	leader := g.lead(t)
	big := strings.Repeat("x", 64<<10)
	keys := []string{"a", "big", "c", "d"}
	var outs []<-chan call
	for i, k := range keys {
		v := "v"
		if k == "big" {
			v = big
		}
		if k == "d" {
			outs = append(outs, start(func() (bool, error) { return g.MetaBatch(t.Context(), nil, []Op{Put("d", "v"), Put("d2", "v")}) }))
		} else {
			outs = append(outs, start(func() (bool, error) { return g.MetaCAS(t.Context(), k, nil, v) }))
		}
		waitQueue(t, g.SQLiteStore, queued(i+1))
	}
	g.release()
	require.NoError(t, (<-leader).err)
	rows, err := g.MetaScan(t.Context(), "")
	require.NoError(t, err)
	have := map[string]bool{}
	for _, r := range rows {
		have[r.Key] = true
	}
	for i, o := range outs {
		r := <-o
		if i == 1 {
			require.Error(t, r.err)
		}
		if r.err == nil {
			assert.True(t, have[keys[i]], "call %d applied but not there", i)
			continue
		}
		var se *StorageError
		require.ErrorAs(t, r.err, &se, "call %d", i)
		if !se.Unknown {
			assert.False(t, have[keys[i]], "call %d reported not applied, committed: %v", i, r.err)
		}
	}
	assert.Equal(t, have["d"], have["d2"])
	ok, err := g.MetaCAS(t.Context(), "z", nil, "v")
	require.NoError(t, err)
	assert.True(t, ok)
}

// Close while writes queue behind a leader that waits for another
// connection's lock and some of them are cancelled: Close returns once
// every call has, each either committed or failed with its own error, no
// goroutine is left, and writes after Close are refused.
func TestSQLiteGroupCloseWithCancelledWritesQueued(t *testing.T) {
	verifyNoLeaks(t)
	g := openGroupStore(t, "closecancel.db")
	leader := g.lead(t)
	const n = 10
	var outs []<-chan call
	var cancels []context.CancelFunc
	for i := range n {
		ctx, cancel := context.WithCancel(t.Context())
		cancels = append(cancels, cancel)
		key := fmt.Sprintf("k%d", i)
		if i%3 == 0 {
			outs = append(outs, start(func() (bool, error) { return g.MetaBatch(ctx, nil, []Op{Put(key, "v")}) }))
		} else {
			outs = append(outs, start(func() (bool, error) { return g.MetaCAS(ctx, key, nil, "v") }))
		}
		waitQueue(t, g.SQLiteStore, queued(i+1))
	}
	closed := make(chan error, 1)
	g.hooks.closing = func() {
		for i := 0; i < n; i += 2 {
			cancels[i]()
		}
		g.release()
	}
	go func() { closed <- g.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close hangs")
	}
	results := make([]call, n)
	for i, o := range outs {
		results[i] = <-o
	}
	require.NoError(t, (<-leader).err)
	_, err := g.MetaCAS(t.Context(), "late", nil, "v")
	assert.Equal(t, ErrStoreClosed, err)
	s, err := OpenSQLite(g.path)
	require.NoError(t, err)
	defer s.Close()
	for i, r := range results {
		_, found, err := s.MetaGet(t.Context(), fmt.Sprintf("k%d", i))
		require.NoError(t, err)
		switch {
		case r.err == nil:
			assert.True(t, r.ok && found, "call %d", i)
		case !unknown(r.err):
			assert.ErrorIs(t, r.err, context.Canceled, "call %d", i)
			assert.False(t, found, "call %d reported not applied, committed", i)
		default:
			assert.ErrorIs(t, r.err, context.Canceled, "call %d", i)
		}
		if i%2 == 1 {
			assert.NoError(t, r.err, "call %d was never cancelled", i)
		}
	}
	for _, c := range cancels {
		c()
	}
}
