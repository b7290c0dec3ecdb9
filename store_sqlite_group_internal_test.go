package runlease

import (
	"context"
	"database/sql"
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
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"modernc.org/sqlite"
)

// groupStore is an embedded store on a file of its own whose group commits
// are counted, and writes held back by another connection until release.
type groupStore struct {
	*SQLiteStore
	path    string
	mu      sync.Mutex
	commits []int     // the size of each group run, in order
	after   func(int) // called as each group is run, if set
	exits   atomic.Int32
	release func()
}

func openGroupStore(t *testing.T, name string) *groupStore {
	t.Helper()
	g := &groupStore{path: filepath.Join(t.TempDir(), name)}
	s, err := OpenSQLite(g.path)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	g.SQLiteStore = s
	s.hooks = &sqliteHooks{
		committed: func(n int) {
			g.mu.Lock()
			g.commits = append(g.commits, n)
			after := g.after
			g.mu.Unlock()
			if after != nil {
				after(n)
			}
		},
		exited: func(string) { g.exits.Add(1) },
	}
	return g
}

// onCommit sets what is called as each group has run.
func (g *groupStore) onCommit(fn func(int)) {
	g.mu.Lock()
	g.after = fn
	g.mu.Unlock()
}

func (g *groupStore) groups() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.commits)
}

// waitQueue waits until the store's queue of writes satisfies cond.
func waitQueue(t *testing.T, s *SQLiteStore, cond func(q *groupQueue) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.group.mu.Lock()
		ok := cond(&s.group)
		s.group.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the queue of writes never reached the state waited for")
}

// queued is a waitQueue condition: a leader is committing and n writes wait.
func queued(n int) func(q *groupQueue) bool {
	return func(q *groupQueue) bool { return q.leading && len(q.queue) == n }
}

// call is the outcome of a write started with start.
type call struct {
	ok  bool
	err error
}

// start runs fn on a goroutine of its own and returns where its outcome
// arrives.
func start(fn func() (bool, error)) <-chan call {
	ch := make(chan call, 1)
	go func() {
		ok, err := fn()
		ch <- call{ok, err}
	}()
	return ch
}

// lead starts a write that becomes the leader and then waits, in SQLite,
// for the write lock that release gives up; it returns once it waits.
func (g *groupStore) lead(t *testing.T) <-chan call {
	t.Helper()
	g.release = blockWrites(t, g.path)
	ch := start(func() (bool, error) { return g.MetaCAS(t.Context(), "leader", nil, "v") })
	waitQueue(t, g.SQLiteStore, queued(0))
	return ch
}

func TestSQLiteGroupCommit(t *testing.T) {
	verifyNoLeaks(t)

	t.Run("writes_that_arrive_during_a_commit_share_the_next_one", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, "share.db")
		leader := g.lead(t)
		const n = 12
		var outs []<-chan call
		for i := range n {
			key := fmt.Sprintf("k%d", i)
			outs = append(outs, start(func() (bool, error) { return g.MetaCAS(t.Context(), key, nil, "v") }))
		}
		waitQueue(t, g.SQLiteStore, queued(n))
		g.release()
		require.NoError(t, (<-leader).err)
		for i, o := range outs {
			r := <-o
			require.NoError(t, r.err, "write %d", i)
			assert.True(t, r.ok, "write %d", i)
		}
		assert.Equal(t, []int{1, n}, g.groups(), "the leader committed alone, the %d queued behind it together", n)
		rows, err := g.MetaScan(t.Context(), "k")
		require.NoError(t, err)
		assert.Len(t, rows, n, "every write of the group is there")
	})

	t.Run("dependent_writes_in_one_group_are_checked_and_applied_in_order", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, "order.db")
		leader := g.lead(t)
		steps := []func() (bool, error){
			func() (bool, error) { return g.MetaCAS(t.Context(), "k", nil, "v1") },
			func() (bool, error) { return g.MetaCAS(t.Context(), "k", ptr("v1"), "v2") },
			func() (bool, error) { return g.MetaCAS(t.Context(), "k", ptr("v1"), "v3") }, // v2 is there now
			func() (bool, error) {
				return g.MetaBatch(t.Context(), []Cond{IfEquals("k", "v2")}, []Op{Put("k", "v4"), Put("other", "x")})
			},
			func() (bool, error) { return g.MetaDelete(t.Context(), "k", "v4") },
			func() (bool, error) {
				sw, err := g.MetaCASMany(t.Context(), []CASWrite{{Key: "k", Value: "v5"}, {Key: "other", Expected: ptr("y"), Value: "z"}})
				return slices.Equal(sw, []bool{true, false}), err
			},
			func() (bool, error) { return g.MetaBatch(t.Context(), []Cond{IfAbsent("k")}, []Op{Put("k", "v6")}) },
		}
		want := []bool{true, true, false, true, true, true, false}
		var outs []<-chan call
		for i, step := range steps {
			outs = append(outs, start(step))
			waitQueue(t, g.SQLiteStore, queued(i+1)) // so that they queue in this order
		}
		g.release()
		require.NoError(t, (<-leader).err)
		for i, o := range outs {
			r := <-o
			require.NoError(t, r.err, "step %d", i)
			assert.Equal(t, want[i], r.ok, "step %d", i)
		}
		assert.Equal(t, []int{1, len(steps)}, g.groups())
		v, _, err := g.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, "v5", v)
		v, _, err = g.MetaGet(t.Context(), "other")
		require.NoError(t, err)
		assert.Equal(t, "x", v)
	})

	t.Run("a_call_cancelled_while_queued_changes_nothing_and_fails_not_applied", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, "cancel.db")
		leader := g.lead(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancelled := start(func() (bool, error) { return g.MetaCAS(ctx, "cancelled", nil, "v") })
		waitQueue(t, g.SQLiteStore, queued(1))
		other := start(func() (bool, error) { return g.MetaCAS(t.Context(), "other", nil, "v") })
		waitQueue(t, g.SQLiteStore, queued(2))
		cancel()
		r := <-cancelled
		require.ErrorIs(t, r.err, context.Canceled)
		var se *StorageError
		require.ErrorAs(t, r.err, &se)
		assert.False(t, IsOutcomeUnknown(r.err), "a call that never left the queue was not applied")
		waitQueue(t, g.SQLiteStore, queued(1))
		g.release()
		require.NoError(t, (<-leader).err)
		require.NoError(t, (<-other).err)
		_, found, err := g.MetaGet(t.Context(), "cancelled")
		require.NoError(t, err)
		assert.False(t, found)
		assert.Equal(t, []int{1, 1}, g.groups())
	})

	t.Run("a_call_cancelled_as_it_is_handed_the_lead_still_commits_the_group", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, "handoff.db")
		leader := g.lead(t)
		ctx, cancel := context.WithCancel(t.Context())
		head := start(func() (bool, error) { return g.MetaCAS(ctx, "head", nil, "v") })
		waitQueue(t, g.SQLiteStore, queued(1))
		behind := start(func() (bool, error) { return g.MetaCAS(t.Context(), "behind", nil, "v") })
		waitQueue(t, g.SQLiteStore, queued(2))
		g.onCommit(func(int) { cancel() }) // before the lead is handed on
		g.release()
		require.NoError(t, (<-leader).err)
		r := <-head
		require.ErrorIs(t, r.err, context.Canceled)
		assert.False(t, IsOutcomeUnknown(r.err), "its write was skipped before it ran")
		require.NoError(t, (<-behind).err)
		_, found, err := g.MetaGet(t.Context(), "head")
		require.NoError(t, err)
		assert.False(t, found)
		_, found, err = g.MetaGet(t.Context(), "behind")
		require.NoError(t, err)
		assert.True(t, found)
	})

	t.Run("a_call_cancelled_in_a_group_before_it_ran_is_skipped_and_not_applied", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, "taken.db")
		leader := g.lead(t)
		ctx, cancel := context.WithCancel(t.Context())
		first := start(func() (bool, error) { return g.MetaCAS(t.Context(), "first", nil, "v") })
		waitQueue(t, g.SQLiteStore, queued(1))
		taken := start(func() (bool, error) { return g.MetaCAS(ctx, "taken", nil, "v") })
		waitQueue(t, g.SQLiteStore, queued(2))
		// Hold the write lock again as soon as the leader has committed, so
		// that the next group waits for it with both calls taken.
		again := make(chan func(), 1)
		var once sync.Once
		g.onCommit(func(int) { once.Do(func() { again <- holdWriteLock(t, g.path) }) })
		g.release()
		require.NoError(t, (<-leader).err)
		release := <-again
		waitQueue(t, g.SQLiteStore, func(q *groupQueue) bool { return len(q.queue) == 0 })
		cancel()
		r := <-taken
		require.ErrorIs(t, r.err, context.Canceled)
		assert.False(t, IsOutcomeUnknown(r.err), "the group had not sent it: the leader skips it")
		release()
		require.NoError(t, (<-first).err)
		_, found, err := g.MetaGet(t.Context(), "taken")
		require.NoError(t, err)
		assert.False(t, found)
	})

	t.Run("a_failed_commit_fails_every_call_in_it_as_not_applied", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, failCommitMarker+"fail.db")
		_, err := g.MetaCAS(t.Context(), "seed", nil, "s")
		require.NoError(t, err)
		leader := g.lead(t)
		outs := []<-chan call{
			start(func() (bool, error) { return g.MetaCAS(t.Context(), "a", nil, "v") }),
			start(func() (bool, error) { return g.MetaCAS(t.Context(), "seed", ptr("not s"), "v") }), // changes nothing
			start(func() (bool, error) {
				return g.MetaBatch(t.Context(), []Cond{IfEquals("seed", "s")}, []Op{Put("seed", "t"), Put("b", "v")})
			}),
			start(func() (bool, error) { return g.MetaDelete(t.Context(), "seed", "s") }),
		}
		waitQueue(t, g.SQLiteStore, queued(len(outs)))
		failNextCommit.Store(g.path, new(atomic.Int32)) // the leader's commit passes, the group's fails
		t.Cleanup(func() { failNextCommit.Delete(g.path) })
		g.release()
		require.NoError(t, (<-leader).err)
		for i, o := range outs {
			r := <-o
			var se *StorageError
			require.ErrorAs(t, r.err, &se, "call %d", i)
			assert.False(t, se.Unknown, "call %d: a commit the commit hook turned into a rollback applied nothing: %v", i, r.err)
			assert.False(t, r.ok, "call %d", i)
		}
		rows, err := g.MetaScan(t.Context(), "")
		require.NoError(t, err)
		assert.Equal(t, []Row{{Key: "leader", Value: "v"}, {Key: "seed", Value: "s"}}, rows, "nothing of the group applied")
		ok, err := g.MetaCAS(t.Context(), "after", nil, "v")
		require.NoError(t, err, "the store writes again after a failed group")
		assert.True(t, ok)
	})

	t.Run("a_write_that_fails_inside_a_group_leaves_nothing_and_the_others_commit", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, "refuse.db")
		// A statement-level failure, as SQLite reports a constraint: the
		// statement fails, the transaction goes on.
		_, err := g.w.ExecContext(t.Context(), `CREATE TRIGGER refuse BEFORE INSERT ON runlease_meta
			WHEN NEW.key = 'refused' BEGIN SELECT RAISE(ABORT, 'refused'); END`)
		require.NoError(t, err)
		leader := g.lead(t)
		outs := []<-chan call{
			start(func() (bool, error) { return g.MetaCAS(t.Context(), "a", nil, "v") }),
			start(func() (bool, error) { return g.MetaBatch(t.Context(), nil, []Op{Put("b", "v"), Put("refused", "v")}) }),
			start(func() (bool, error) {
				sw, err := g.MetaCASMany(t.Context(), []CASWrite{{Key: "c", Value: "v"}, {Key: "refused", Value: "v"}})
				return sw != nil, err
			}),
			start(func() (bool, error) { return g.MetaCAS(t.Context(), "d", nil, "v") }),
		}
		waitQueue(t, g.SQLiteStore, queued(len(outs))) // all queued before any runs
		g.release()
		require.NoError(t, (<-leader).err)
		for i, o := range outs {
			r := <-o
			if i == 1 || i == 2 {
				var se *StorageError
				require.ErrorAs(t, r.err, &se, "call %d", i)
				assert.False(t, se.Unknown, "call %d: its savepoint was rolled back, so nothing applied: %v", i, r.err)
				continue
			}
			require.NoError(t, r.err, "call %d", i)
			assert.True(t, r.ok, "call %d", i)
		}
		rows, err := g.MetaScan(t.Context(), "")
		require.NoError(t, err)
		assert.Equal(t, []Row{{Key: "a", Value: "v"}, {Key: "d", Value: "v"}, {Key: "leader", Value: "v"}}, rows,
			"nothing of the failed writes, all of the others")
		assert.Equal(t, []int{1, len(outs)}, g.groups())
	})

	t.Run("a_failure_that_ends_the_transaction_fails_the_whole_group_as_not_applied", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, "full.db")
		// A file that cannot grow: SQLite answers a write that needs new
		// pages with SQLITE_FULL and rolls the transaction back.
		_, err := g.w.ExecContext(t.Context(), "PRAGMA max_page_count = 3")
		require.NoError(t, err)
		leader := g.lead(t)
		big := strings.Repeat("x", 64<<10)
		outs := []<-chan call{start(func() (bool, error) { return g.MetaCAS(t.Context(), "a", nil, "v") })}
		waitQueue(t, g.SQLiteStore, queued(1))
		outs = append(outs, start(func() (bool, error) { return g.MetaBatch(t.Context(), nil, []Op{Put("b", "v"), Put("big", big)}) }))
		waitQueue(t, g.SQLiteStore, queued(2))
		outs = append(outs, start(func() (bool, error) { return g.MetaCAS(t.Context(), "c", nil, "v") }))
		waitQueue(t, g.SQLiteStore, queued(3))
		g.release()
		require.NoError(t, (<-leader).err)
		rows, err := g.MetaScan(t.Context(), "")
		require.NoError(t, err)
		for i, o := range outs {
			r := <-o
			if i == 1 {
				require.Error(t, r.err, "the batch cannot fit in the file")
			}
			if r.err == nil {
				assert.Contains(t, rows, Row{Key: []string{"a", "b", "c"}[i], Value: "v"}, "call %d succeeded", i)
				continue
			}
			var se *StorageError
			require.ErrorAs(t, r.err, &se, "call %d", i)
			assert.False(t, se.Unknown, "call %d: the transaction was rolled back, so nothing applied: %v", i, r.err)
		}
		assert.NotContains(t, rows, Row{Key: "b", Value: "v"}, "nothing of the failed batch")
	})

	t.Run("close_waits_for_every_queued_call_and_each_commits", func(t *testing.T) {
		t.Parallel()
		g := openGroupStore(t, "close.db")
		leader := g.lead(t)
		const n = 6
		var outs []<-chan call
		for i := range n {
			key := fmt.Sprintf("k%d", i)
			outs = append(outs, start(func() (bool, error) { return g.MetaCAS(t.Context(), key, nil, "v") }))
		}
		waitQueue(t, g.SQLiteStore, queued(n))
		var refused error
		g.hooks.closing = func() {
			_, refused = g.MetaCAS(t.Context(), "late", nil, "v")
			g.release()
		}
		require.NoError(t, g.Close())
		assert.Equal(t, int32(n+1), g.exits.Load(), "Close returned only after every queued call")
		assert.Equal(t, ErrStoreClosed, refused)
		for i, o := range append(outs, leader) {
			r := <-o
			require.NoError(t, r.err, "call %d", i)
			assert.True(t, r.ok, "call %d", i)
		}
		s, err := OpenSQLite(g.path)
		require.NoError(t, err)
		defer s.Close()
		rows, err := s.MetaScan(t.Context(), "k")
		require.NoError(t, err)
		assert.Len(t, rows, n, "every queued write was committed before Close returned")
	})
}

// holdWriteLock takes SQLite's write lock on path from a connection of its
// own, from any goroutine, and returns what gives it up.
func holdWriteLock(t *testing.T, path string) (release func()) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if !assert.NoError(t, err) {
		return func() {}
	}
	conn, err := db.Conn(context.Background())
	if assert.NoError(t, err) {
		_, err = conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
		assert.NoError(t, err)
	}
	return func() {
		if conn != nil {
			_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
			conn.Close()
		}
		db.Close()
	}
}

func ptr(s string) *string { return &s }

// failCommitMarker names the files whose writer connections take the
// commit hook of failNextCommit.
const failCommitMarker = "failcommit-"

// failNextCommit maps the path of a store to the count of commits seen
// since it was armed: the second one (the first group's after the
// leader's own) is turned into a rollback.
var failNextCommit sync.Map // string → *atomic.Int32

func init() {
	sqlite.RegisterConnectionHook(func(conn sqlite.ExecQuerierContext, dsn string) error {
		if !strings.Contains(dsn, failCommitMarker) {
			return nil
		}
		hooks, ok := conn.(sqlite.HookRegisterer)
		if !ok {
			return errors.New("the SQLite connection takes no commit hook")
		}
		hooks.RegisterCommitHook(func() int32 {
			var fail int32
			failNextCommit.Range(func(path, n any) bool {
				if strings.Contains(dsn, filepath.Base(path.(string))) && n.(*atomic.Int32).Add(1) == 2 {
					fail = 1
				}
				return true
			})
			return fail
		})
		return nil
	})
}

// verifyNoLeaks fails t if goroutines started during t outlive it.
func verifyNoLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

func unknown(err error) bool { return IsOutcomeUnknown(err) }

// TestSQLiteGroupOutcomesMatchWhatCommitted runs concurrent CAS chains through
// MetaBatch (each applied batch logs its write in the same transaction),
// MetaCAS and MetaCASMany, with contexts that end at random and writes that
// a trigger refuses (one-statement ones abort their group, batches their
// savepoint), and checks every outcome against what committed: a success
// must be there, false/nil and "not applied" must not be, and no two
// applied CASes share an expected value.
func TestSQLiteGroupOutcomesMatchWhatCommitted(t *testing.T) {
	verifyNoLeaks(t)
	path := filepath.Join(t.TempDir(), "acct.db")
	s, err := OpenSQLite(path)
	require.NoError(t, err)
	defer func() { s.Close() }()
	ctx := t.Context()
	_, err = s.w.ExecContext(ctx, `CREATE TRIGGER boom_i BEFORE INSERT ON runlease_meta
		WHEN NEW.value LIKE '%boom%' BEGIN SELECT RAISE(ABORT, 'boom'); END`)
	require.NoError(t, err)
	_, err = s.w.ExecContext(ctx, `CREATE TRIGGER boom_u BEFORE UPDATE ON runlease_meta
		WHEN NEW.value LIKE '%boom%' BEGIN SELECT RAISE(ABORT, 'boom'); END`)
	require.NoError(t, err)
	_, err = s.MetaCAS(ctx, "chain", nil, "0")
	require.NoError(t, err)
	_, err = s.MetaCAS(ctx, "count", nil, "0")
	require.NoError(t, err)

	const workers, iters = 8, 60
	type outcome struct {
		value    string // the chain value it wrote
		ok       bool
		err      error
		isBatch  bool
		expected string
	}
	var mu sync.Mutex
	var outs []outcome
	var countOK, countUnknown atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range iters {
				cctx, cancel := ctx, context.CancelFunc(func() {})
				if rng.IntN(4) == 0 {
					cctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
				}
				switch rng.IntN(4) {
				case 0, 1: // batch on the chain, logged
					cur, _, err := s.MetaGet(ctx, "chain")
					if !assert.NoError(t, err) {
						cancel()
						return
					}
					next := fmt.Sprintf("w%d-%d", w, i)
					ops := []Op{Put("chain", next), Put("log/"+next, cur)}
					if rng.IntN(10) == 0 {
						ops = append(ops, Put("x/"+next, "boom")) // refused: its savepoint is undone
					}
					ok, err := s.MetaBatch(cctx, []Cond{IfEquals("chain", cur)}, ops)
					mu.Lock()
					outs = append(outs, outcome{value: next, ok: ok, err: err, isBatch: true, expected: cur})
					mu.Unlock()
				case 2: // a counter, by single CAS
					cur, _, err := s.MetaGet(ctx, "count")
					if !assert.NoError(t, err) {
						cancel()
						return
					}
					n, _ := strconv.Atoi(cur)
					value := strconv.Itoa(n + 1)
					if rng.IntN(10) == 0 {
						value = "boom" // refused: aborts its whole group
					}
					ok, err := s.MetaCAS(cctx, "count", &cur, value)
					switch {
					case err == nil && ok:
						countOK.Add(1)
					case err != nil && unknown(err):
						countUnknown.Add(1)
					}
				case 3: // unrelated writes in the same groups
					key := fmt.Sprintf("m/%d", rng.IntN(4))
					cur, found, err := s.MetaGet(ctx, key)
					if !assert.NoError(t, err) {
						cancel()
						return
					}
					var exp *string
					if found {
						exp = &cur
					}
					_, err = s.MetaCASMany(cctx, []CASWrite{{Key: key, Expected: exp, Value: fmt.Sprintf("%d-%d", w, i)}})
					if err != nil {
						var se *StorageError
						assert.ErrorAs(t, err, &se)
					}
					if rng.IntN(3) == 0 && found {
						_, _ = s.MetaDelete(cctx, key, cur)
					}
				}
				cancel()
			}
		})
	}
	wg.Wait()
	require.NoError(t, s.Close())

	// Check against what is on disk, through a store opened afresh.
	s2, err := OpenSQLite(path)
	require.NoError(t, err)
	defer s2.Close()
	logs, err := s2.MetaScan(ctx, "log/")
	require.NoError(t, err)
	logged := map[string]string{} // value → expected
	for _, r := range logs {
		logged[strings.TrimPrefix(r.Key, "log/")] = r.Value
	}
	for _, o := range outs {
		_, there := logged[o.value]
		switch {
		case o.err == nil && o.ok:
			assert.True(t, there, "batch %s reported applied, not committed", o.value)
		case o.err == nil:
			assert.False(t, there, "batch %s reported a lost race, committed", o.value)
		case !unknown(o.err):
			assert.False(t, there, "batch %s reported not applied (%v), committed", o.value, o.err)
			var se *StorageError
			assert.ErrorAs(t, o.err, &se)
		}
	}
	// The applied batches form one chain from "0" to the final value: no
	// two applied CASes with the same expected value, none lost.
	byExpected := map[string]string{}
	for v, exp := range logged {
		if prev, dup := byExpected[exp]; dup {
			t.Errorf("two applied CASes over %q: %q and %q", exp, prev, v)
		}
		byExpected[exp] = v
	}
	final, _, err := s2.MetaGet(ctx, "chain")
	require.NoError(t, err)
	steps, at := 0, "0"
	for at != final {
		next, ok := byExpected[at]
		if !assert.True(t, ok, "the chain breaks at %q", at) {
			break
		}
		at = next
		steps++
	}
	assert.Equal(t, len(logged), steps, "every applied batch is on the chain")
	rows, err := s2.MetaScan(ctx, "x/")
	require.NoError(t, err)
	assert.Empty(t, rows, "nothing of a refused batch")
	cnt, _, err := s2.MetaGet(ctx, "count")
	require.NoError(t, err)
	n, err := strconv.Atoi(cnt)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, int64(n), countOK.Load(), "every reported increment is there")
	assert.LessOrEqual(t, int64(n), countOK.Load()+countUnknown.Load(), "an increment reported not applied committed")
}

// A queue longer than maxGroup is committed in turns, in order.
func TestSQLiteGroupALongQueueCommitsInTurnsInOrder(t *testing.T) {
	verifyNoLeaks(t)
	g := openGroupStore(t, "long.db")
	leader := g.lead(t)
	const n = maxGroup + 44
	var outs []<-chan call
	for i := range n {
		outs = append(outs, start(func() (bool, error) { return g.MetaCAS(t.Context(), fmt.Sprintf("k%04d", i), nil, "v") }))
	}
	waitQueue(t, g.SQLiteStore, queued(n))
	g.release()
	require.NoError(t, (<-leader).err)
	for i, o := range outs {
		r := <-o
		require.NoError(t, r.err, "call %d", i)
		assert.True(t, r.ok)
	}
	assert.Equal(t, []int{1, maxGroup, n - maxGroup}, g.groups())
	rows, err := g.MetaScan(t.Context(), "k")
	require.NoError(t, err)
	assert.Len(t, rows, n)
}

// An in-memory store (one connection for reads and writes) under concurrent
// writes, reads and scans: no deadlock, and counters add up.
func TestSQLiteGroupInMemoryUnderConcurrentCalls(t *testing.T) {
	verifyNoLeaks(t)
	s, err := OpenSQLite(":memory:")
	require.NoError(t, err)
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const workers, iters = 6, 80
	var oks atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range iters {
				if w%3 == 2 {
					_, err := s.MetaScan(ctx, "")
					assert.NoError(t, err)
					continue
				}
				cur, found, err := s.MetaGet(ctx, "n")
				if !assert.NoError(t, err) {
					return
				}
				if !found {
					if ok, err := s.MetaCAS(ctx, "n", nil, "1"); assert.NoError(t, err) && ok {
						oks.Add(1)
					}
					continue
				}
				v, _ := strconv.Atoi(cur)
				next := strconv.Itoa(v + 1)
				var ok bool
				if i%2 == 0 {
					ok, err = s.MetaCAS(ctx, "n", &cur, next)
				} else {
					ok, err = s.MetaBatch(ctx, []Cond{IfEquals("n", cur)}, []Op{Put("n", next), Put(fmt.Sprintf("w%d", w), next)})
				}
				if assert.NoError(t, err) && ok {
					oks.Add(1)
				}
			}
		})
	}
	wg.Wait()
	v, _, err := s.MetaGet(ctx, "n")
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatInt(oks.Load(), 10), v)
}

// A read-only store refuses concurrent writes before they queue.
func TestSQLiteGroupReadOnlyStoreRefusesWritesBeforeTheyQueue(t *testing.T) {
	verifyNoLeaks(t)
	path := filepath.Join(t.TempDir(), "ro.db")
	w, err := OpenSQLite(path)
	require.NoError(t, err)
	_, err = w.MetaCAS(t.Context(), "k", nil, "v")
	require.NoError(t, err)
	ro, err := OpenSQLiteReadOnly(path)
	require.NoError(t, err)
	defer ro.Close()
	defer w.Close()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			var err error
			switch i % 4 {
			case 0:
				_, err = ro.MetaCAS(t.Context(), "k", ptr("v"), "x")
			case 1:
				_, err = ro.MetaDelete(t.Context(), "k", "v")
			case 2:
				_, err = ro.MetaBatch(t.Context(), nil, []Op{Put("k", "x")})
			case 3:
				_, err = ro.MetaCASMany(t.Context(), []CASWrite{{Key: "k", Value: "x"}})
			}
			assert.ErrorIs(t, err, ErrInvalidArgument)
		})
	}
	wg.Wait()
	ro.group.mu.Lock()
	assert.False(t, ro.group.leading)
	assert.Empty(t, ro.group.queue)
	ro.group.mu.Unlock()
	v, _, err := ro.MetaGet(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "v", v)
}
