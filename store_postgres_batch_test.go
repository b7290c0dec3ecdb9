package runlease_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// pgReplace replaces a row by a new one in one transaction (the simple
// protocol runs both statements in one).
const pgReplace = `DELETE FROM %[1]s WHERE key = $1; INSERT INTO %[1]s (key, value) VALUES ($1, 'c') ON CONFLICT DO NOTHING`

// TestPostgresMetaBatch covers what the conformance suite cannot: batches
// whose rows other writers delete and create while they run.
func TestPostgresMetaBatch(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)

	t.Run("a_batch_whose_rows_keep_being_replaced_is_decided_never_failed", func(t *testing.T) {
		t.Parallel()
		s, table := pgStoreAndTable(t, pool)
		keys := []string{"r:a", "r:b", "r:c"}
		for _, k := range keys {
			mustCAS(t, s, k, nil, "c")
		}
		stop := make(chan struct{})
		var churn sync.WaitGroup
		for i := range 2 * len(keys) {
			churn.Go(func() { replaceUntil(t, pool, table, keys[i%len(keys)], stop) })
		}
		var errs []error
		batches := 300
		if testing.Short() {
			batches = 120 // the count is for confidence only
		}
		for range batches {
			var ops []runlease.Op
			for _, k := range keys {
				ops = append(ops, runlease.Put(k, "c"))
			}
			if _, err := s.MetaBatch(t.Context(), nil, ops); err != nil {
				errs = append(errs, err)
			}
		}
		close(stop)
		churn.Wait()
		assert.Empty(t, errs, "of %d batches", batches)
	})
}

// replaceUntil deletes key's row and creates it again in one transaction,
// over and over, until stop closes: a batch that waits for the row's lock
// then finds it deleted, and its successor not yet visible.
func replaceUntil(t *testing.T, pool *pgxpool.Pool, table, key string, stop <-chan struct{}) {
	sql := fmt.Sprintf(pgReplace, pgtest.Ident(table))
	for {
		select {
		case <-stop:
			return
		default:
		}
		_, _ = pool.Exec(t.Context(), sql, pgx.QueryExecModeSimpleProtocol, key)
	}
}

func TestPostgresFencedBatchForm(t *testing.T) {
	t.Parallel()
	s, r, _ := recordedStore(t, nil)
	require.True(t, mustCAS(t, s, "lease", nil, "v1"))
	require.True(t, mustCAS(t, s, "old", nil, "o1"))

	fenced := [][]string{{"fenced"}}
	general := [][]string{{"hold", "apply"}}
	cases := []struct {
		name  string
		conds []runlease.Cond
		ops   []runlease.Op
		want  [][]string
	}{
		{"a_fenced_write_of_two_keys_is_one_statement", []runlease.Cond{runlease.IfEquals("lease", "v1")},
			[]runlease.Op{runlease.Put("ckpt", "c1"), runlease.Put("lease", "v2")}, fenced},
		{"a_fenced_write_of_several_keys_present_and_absent_is_one_statement", []runlease.Cond{runlease.IfEquals("lease", "v2")},
			[]runlease.Op{runlease.Put("lease", "v3"), runlease.Put("z", "z1"), runlease.Put("old", "o2"), runlease.Put("a", "a1")},
			[][]string{{"fenced-many"}}},
		{"a_fenced_write_of_its_condition_key_alone_is_the_conditional_update", []runlease.Cond{runlease.IfEquals("lease", "v3")},
			[]runlease.Op{runlease.Put("lease", "v4")}, [][]string{{"update"}}},
		{"an_absent_key_condition_takes_the_general_form", []runlease.Cond{runlease.IfAbsent("new")},
			[]runlease.Op{runlease.Put("new", "n1"), runlease.Put("ckpt", "c2")}, general},
		{"a_condition_on_a_key_not_written_takes_the_general_form", []runlease.Cond{runlease.IfEquals("lease", "v4")},
			[]runlease.Op{runlease.Put("ckpt", "c3")}, general},
		{"a_delete_takes_the_general_form", []runlease.Cond{runlease.IfEquals("lease", "v4")},
			[]runlease.Op{runlease.Put("lease", "v5"), runlease.Delete("old")}, general},
		{"two_conditions_take_the_general_form", []runlease.Cond{runlease.IfEquals("lease", "v5"), runlease.IfEquals("ckpt", "c3")},
			[]runlease.Op{runlease.Put("lease", "v6"), runlease.Put("ckpt", "c4")}, general},
		{"no_condition_takes_the_general_form", nil, []runlease.Op{runlease.Put("ckpt", "c5")}, general},
	}
	for _, tc := range cases { // in order: each starts from the rows the last left
		mark := r.mark()
		ok, err := s.MetaBatch(t.Context(), tc.conds, tc.ops)
		require.NoError(t, err, tc.name)
		assert.True(t, ok, "%s: applied", tc.name)
		assert.Equal(t, tc.want, kinds(r.since(mark)), "%s: the statements of each round trip", tc.name)
		want := map[string]*string{}
		for _, op := range tc.ops {
			want[op.Key] = strptr(op.Value)
			if op.Delete {
				want[op.Key] = nil
			}
		}
		wantRows(t, s, want)
	}
}

func TestPostgresLeaseWriteIsOneFencedStatement(t *testing.T) {
	t.Parallel()
	s, r, _ := recordedStore(t, nil)
	l, err := runlease.Acquire(t.Context(), s, "run", "node")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Release(context.WithoutCancel(t.Context())) })
	for i := range 3 {
		mark := r.mark()
		require.NoError(t, l.Write(t.Context(), runlease.Put("ckpt:run", strings.Repeat("é", i+1))))
		assert.Equal(t, [][]string{{"fenced"}}, kinds(r.since(mark)), "write %d of one key", i)
		mark = r.mark()
		require.NoError(t, l.Write(t.Context(), runlease.Put("ckpt:run", "one"), runlease.Put("ckpt:run:2", strings.Repeat("ü", i+1))))
		assert.Equal(t, [][]string{{"fenced-many"}}, kinds(r.since(mark)), "write %d of two keys", i)
	}
	wantRows(t, s, map[string]*string{"ckpt:run": strptr("one"), "ckpt:run:2": strptr("üüü")})
}

func TestPostgresFencedBatchConditions(t *testing.T) {
	t.Parallel()
	s, r, _ := recordedStore(t, nil)
	require.True(t, mustCAS(t, s, "lease", nil, "v1"))
	require.True(t, mustCAS(t, s, "other", nil, "o1"))
	unchanged := map[string]*string{"lease": strptr("v1"), "other": strptr("o1"), "fresh": nil, "gone": nil}
	fenced := [][]string{{"fenced"}}
	cases := []struct {
		name string
		cond runlease.Cond
		ops  []runlease.Op
		want [][]string
	}{
		{"a_stale_value_writes_nothing", runlease.IfEquals("lease", "v0"),
			[]runlease.Op{runlease.Put("lease", "v2"), runlease.Put("other", "o2"), runlease.Put("fresh", "f")},
			[][]string{{"fenced-many"}}},
		{"a_value_that_differs_only_in_case_writes_nothing", runlease.IfEquals("lease", "V1"),
			[]runlease.Op{runlease.Put("lease", "v2"), runlease.Put("fresh", "f")}, fenced},
		{"an_empty_expected_value_writes_nothing", runlease.IfEquals("lease", ""),
			[]runlease.Op{runlease.Put("lease", "v2"), runlease.Put("fresh", "f")}, fenced},
		{"an_absent_condition_key_writes_nothing", runlease.IfEquals("gone", "v1"),
			[]runlease.Op{runlease.Put("gone", "v2"), runlease.Put("other", "o2")}, fenced},
		{"a_failed_update_alone_writes_nothing", runlease.IfEquals("lease", "v0"),
			[]runlease.Op{runlease.Put("lease", "v2")}, [][]string{{"update"}}},
	}
	for _, tc := range cases { // not parallel: each checks that no case wrote
		mark := r.mark()
		ok, err := s.MetaBatch(t.Context(), []runlease.Cond{tc.cond}, tc.ops)
		require.NoError(t, err, tc.name)
		assert.False(t, ok, "%s: applied", tc.name)
		assert.Equal(t, tc.want, kinds(r.since(mark)), "%s: the statements of each round trip", tc.name)
		wantRows(t, s, unchanged)
	}
}

func TestPostgresFencedBatchValuesAreByteExact(t *testing.T) {
	t.Parallel()
	s, r, _ := recordedStore(t, nil)
	big := strings.Repeat("ü", runlease.MaxValueLen/2)
	values := []string{
		"plain",
		"",
		"ünïcödé ✓ 日本語 🙂 e\u0301 \u00e9",
		"quotes ' \" \\ $1 %s ::text[] {a,b} NULL",
		"tab\tnewline\ncr\r control \x01\x1f",
		big,
		strings.Repeat("x", runlease.MaxValueLen),
	}
	// Each value goes through both fenced statements: to one other key,
	// then to two more, so that every key written takes a new value.
	keys := []string{"lease:ü", "ckpt:日本", "ckpt:🙂", "ckpt:{a,\"b\"}"}
	passes := []struct {
		others []string
		want   [][]string
	}{
		{keys[1:2], [][]string{{"fenced"}}},
		{keys[2:], [][]string{{"fenced-many"}}},
	}
	cur := "start"
	require.True(t, mustCAS(t, s, keys[0], nil, cur))
	for i, v := range values {
		for _, pass := range passes {
			mark := r.mark()
			next := fmt.Sprintf("%s·%d", v, len(pass.others))
			if len(next) > runlease.MaxValueLen {
				next = v
			}
			ops := []runlease.Op{runlease.Put(keys[0], next)}
			want := map[string]*string{keys[0]: strptr(next)}
			for _, k := range pass.others {
				ops = append(ops, runlease.Put(k, v))
				want[k] = strptr(v)
			}
			ok, err := s.MetaBatch(t.Context(), []runlease.Cond{runlease.IfEquals(keys[0], cur)}, ops)
			require.NoError(t, err, "value %d", i)
			require.True(t, ok, "value %d: applied", i)
			assert.Equal(t, pass.want, kinds(r.since(mark)), "value %d", i)
			wantRows(t, s, want)
			cur = next
		}
	}
}

// quickDeadlocks makes the server look for a deadlock after 10 ms of
// waiting for a lock instead of its default second, so that tests that
// provoke deadlocks run in moments. Only a superuser may set it; for
// another role the default stays, and such tests are only slower.
func quickDeadlocks(t *testing.T) func(*pgxpool.Config) {
	t.Helper()
	var super bool
	err := pgtest.Pool(t).QueryRow(t.Context(), `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super)
	require.NoError(t, err)
	return func(cfg *pgxpool.Config) {
		cfg.MaxConns = 24
		if super {
			cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "10ms"
		}
	}
}

// TestPostgresFencedBatchRaces races fenced batches, which take their
// condition's key first, with each other and with batches of the general
// form, which take every key in key order.
func TestPostgresFencedBatchRaces(t *testing.T) {
	t.Parallel()

	t.Run("of_batches_racing_over_one_value_exactly_one_applies_whole", func(t *testing.T) {
		t.Parallel()
		s, _, _ := recordedStore(t, quickDeadlocks(t))
		cur := "v0"
		require.True(t, mustCAS(t, s, "lease", nil, cur))
		const racers = 8
		rounds := 15
		if testing.Short() {
			rounds = 6 // the count is for confidence only
		}
		for round := range rounds {
			var won [racers]bool
			var errs [racers]error
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range racers {
				// Even racers are fenced batches; odd ones have a second
				// condition, which always holds, so take the general form.
				conds := []runlease.Cond{runlease.IfEquals("lease", cur)}
				if i%2 == 1 {
					conds = append(conds, runlease.IfAbsent("never"))
				}
				ops := []runlease.Op{
					runlease.Put("lease", fmt.Sprintf("v%d-%d", round, i)),
					runlease.Put("ckpt", fmt.Sprintf("c%d-%d", round, i)),
					runlease.Put("aside", fmt.Sprintf("a%d-%d", round, i)),
				}
				wg.Go(func() {
					<-start
					won[i], errs[i] = s.MetaBatch(t.Context(), conds, ops)
				})
			}
			close(start)
			wg.Wait()
			winner := -1
			for i := range racers {
				require.NoError(t, errs[i], "round %d, racer %d", round, i)
				if won[i] {
					require.Equal(t, -1, winner, "round %d: racers %d and %d both applied", round, winner, i)
					winner = i
				}
			}
			require.NotEqual(t, -1, winner, "round %d: no racer applied", round)
			cur = fmt.Sprintf("v%d-%d", round, winner)
			wantRows(t, s, map[string]*string{
				"lease": strptr(cur),
				"ckpt":  strptr(fmt.Sprintf("c%d-%d", round, winner)),
				"aside": strptr(fmt.Sprintf("a%d-%d", round, winner)),
			})
		}
	})

	t.Run("a_deadlock_between_a_fenced_and_a_key_order_batch_is_tried_again", func(t *testing.T) {
		t.Parallel()
		s, r, _ := recordedStore(t, quickDeadlocks(t))
		// Fenced batches lock "k:b", then "k:a"; general ones "k:a", then
		// "k:b". Every condition always holds, so every batch applies.
		require.True(t, mustCAS(t, s, "k:a", nil, "a"))
		require.True(t, mustCAS(t, s, "k:b", nil, "b"))
		fenced := func(i int) (bool, error) {
			return s.MetaBatch(t.Context(), []runlease.Cond{runlease.IfEquals("k:b", "b")},
				[]runlease.Op{runlease.Put("k:b", "b"), runlease.Put("k:a", fmt.Sprintf("fenced %d", i))})
		}
		general := func(i int) (bool, error) {
			return s.MetaBatch(t.Context(), []runlease.Cond{runlease.IfAbsent("k:c")},
				[]runlease.Op{runlease.Put("k:a", fmt.Sprintf("general %d", i)), runlease.Put("k:b", "b")})
		}
		mark := r.mark()
		var calls, retried atomic.Int64
		var mu sync.Mutex
		var errs []error
		deadline := time.Now().Add(20 * time.Second)
		var wg sync.WaitGroup
		for w := range 8 {
			batch := fenced
			if w%2 == 1 {
				batch = general
			}
			wg.Go(func() {
				for i := 0; i < 20 || retried.Load() == 0 && time.Now().Before(deadline); i++ {
					calls.Add(1) // before it is sent: trips > calls only after a retry
					ok, err := batch(i)
					if err == nil && !ok {
						err = fmt.Errorf("batch %d of worker %d did not apply", i, w)
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					if trips := int64(len(r.since(mark))); trips > calls.Load() {
						retried.Store(trips - calls.Load())
					}
				}
			})
		}
		wg.Wait()
		require.Empty(t, errs)
		trips := r.since(mark)
		t.Logf("%d batches in %d round trips", calls.Load(), len(trips))
		assert.Greater(t, int64(len(trips)), calls.Load(), "the premise: some batch met a deadlock and was tried again")
		for _, trip := range kinds(trips) {
			assert.Contains(t, [][]string{{"fenced"}, {"hold", "apply"}}, trip)
		}
		wantRows(t, s, map[string]*string{"k:b": strptr("b")})
	})
}

// TestPostgresFencedBatchContext ends the context of a fenced batch before
// it is sent and while it waits for its condition's row.
func TestPostgresFencedBatchContext(t *testing.T) {
	t.Parallel()
	batch := func(ctx context.Context, s *runlease.PostgresStore) (bool, error) {
		return s.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals("lease", "v1")},
			[]runlease.Op{runlease.Put("lease", "v2"), runlease.Put("ckpt", "c2"), runlease.Put("new", "n2")})
	}
	unchanged := map[string]*string{"lease": strptr("v1"), "ckpt": strptr("c1"), "new": nil}
	seed := func(t *testing.T, s runlease.Store) {
		require.True(t, mustCAS(t, s, "lease", nil, "v1"))
		require.True(t, mustCAS(t, s, "ckpt", nil, "c1"))
	}

	t.Run("a_fenced_batch_whose_context_has_ended_sends_nothing", func(t *testing.T) {
		t.Parallel()
		s, r, _ := recordedStore(t, nil)
		seed(t, s)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		mark := r.mark()
		_, err := batch(ctx, s)
		require.ErrorIs(t, err, context.Canceled)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.False(t, se.Unknown, "nothing was sent")
		assert.False(t, se.Retryable, "the caller gave up")
		assert.Empty(t, r.since(mark), "round trips")
		wantRows(t, s, unchanged)
	})

	t.Run("a_fenced_batch_cancelled_by_the_server_while_waiting_changes_nothing", func(t *testing.T) {
		t.Parallel()
		pool := cancelRequestPool(t)
		s, table := pgStoreAndTable(t, pool)
		seed(t, s)
		tx := lockRow(t, pool, table, "lease")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := batch(ctx, s); done <- err }()
		waitForLockWait(t, pool, table)
		cancel()
		err := <-done
		require.ErrorIs(t, err, context.Canceled)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "the premise: the server answered the cancel request")
		assert.Equal(t, "57014", pgErr.Code, "query_canceled")
		assert.False(t, se.Unknown, "the server rolled the statement back and said so")
		assert.False(t, se.Retryable, "the caller gave up")
		require.NoError(t, tx.Rollback(t.Context()))
		wantRows(t, s, unchanged)
	})

	t.Run("a_fenced_batch_whose_connection_is_cut_while_waiting_is_unknown_and_all_or_nothing", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		s, table := pgStoreAndTable(t, pool)
		seed(t, s)
		tx := lockRow(t, pool, table, "lease")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := batch(ctx, s); done <- err }()
		waitForLockWait(t, pool, table)
		cancel()
		err := <-done
		require.ErrorIs(t, err, context.Canceled)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.True(t, se.Unknown, "the statement had reached the server")
		assert.False(t, se.Retryable, "the caller gave up")
		require.NoError(t, tx.Rollback(t.Context()))
		// The orphaned statement may still run and commit: wait until no
		// statement on the table is left, then find all of it or none.
		require.Eventually(t, func() bool {
			var n int
			err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
				WHERE state <> 'idle' AND pid <> pg_backend_pid() AND query LIKE $1`, "%"+table+"%").Scan(&n)
			return err == nil && n == 0
		}, 10*time.Second, 10*time.Millisecond)
		v, _, err := s.MetaGet(t.Context(), "lease")
		require.NoError(t, err)
		if v == "v1" {
			wantRows(t, s, unchanged)
		} else {
			wantRows(t, s, map[string]*string{"lease": strptr("v2"), "ckpt": strptr("c2"), "new": strptr("n2")})
		}
	})
}

// TestPostgresMetaCASMany covers what the conformance suite cannot: the
// locks that concurrent calls take on the server.
func TestPostgresMetaCASMany(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)

	t.Run("overlapping_calls_in_different_orders_never_deadlock", func(t *testing.T) {
		t.Parallel()
		s := pgStore(t, pool)
		const keys, writers, rounds = 10, 8, 10
		for k := range keys {
			require.True(t, mustCAS(t, s, fmt.Sprint("k", k), nil, "0"))
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers*rounds)
		for w := range writers {
			wg.Go(func() {
				for r := range rounds {
					errs <- casManyShuffled(t, s, keys, fmt.Sprintf("w%d-r%d", w, r))
				}
			})
		}
		wg.Wait()
		close(errs)
		failed := 0
		for err := range errs {
			if err != nil {
				failed++
				t.Log(err)
			}
		}
		assert.Zero(t, failed, "calls out of %d that failed", writers*rounds)
	})
}

// casManyShuffled reads every key and writes most of them, in a random
// order, each conditional on the value it read, and every tenth round
// deletes one so that some writes are inserts of an absent key.
func casManyShuffled(t *testing.T, s *runlease.PostgresStore, keys int, value string) error {
	rows, err := s.MetaScan(t.Context(), "k")
	if err != nil {
		return err
	}
	held := map[string]string{}
	for _, r := range rows {
		held[r.Key] = r.Value
	}
	var writes []runlease.CASWrite
	for _, k := range rand.Perm(keys)[:keys-2] {
		key := fmt.Sprint("k", k)
		w := runlease.CASWrite{Key: key, Value: value}
		if v, ok := held[key]; ok {
			w.Expected = &v
		}
		writes = append(writes, w)
	}
	if rand.IntN(10) == 0 && writes[0].Expected != nil {
		if _, err := s.MetaDelete(t.Context(), writes[0].Key, *writes[0].Expected); err != nil {
			return err
		}
	}
	_, err = s.MetaCASMany(t.Context(), writes)
	return err
}

// sqlRecorder records, for every write on the connections it wraps, the
// statements it runs (each Bind, named by the text its statement was
// parsed from, now or by an earlier Parse on the connection) that name one
// table: one entry per round trip of a call on the table.
// It is safe for concurrent use.
type sqlRecorder struct {
	table string // as sanitized, the way the store's statements name it

	mu    sync.Mutex
	trips [][]string
}

// pool returns a pool whose connections r records, closed when t ends.
// tune, when not nil, adjusts the pool's config first.
func (r *sqlRecorder) pool(t *testing.T, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &recordingConn{Conn: c, r: r}, nil
	}
	if tune != nil {
		tune(cfg)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// since returns the round trips recorded after the first n.
func (r *sqlRecorder) since(n int) [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.trips[n:]...)
}

func (r *sqlRecorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.trips)
}

// recordingConn splits what pgx writes into frontend messages. pgx writes
// from one goroutine per connection, so buf needs no lock.
type recordingConn struct {
	net.Conn
	r       *sqlRecorder
	started bool // past the untyped startup (or SSL, cancel) messages
	buf     []byte
	parsed  map[string]string // statement name → its text
}

func (c *recordingConn) Write(b []byte) (int, error) {
	c.buf = append(c.buf, b...)
	var stmts []string
	for {
		if !c.started {
			if len(c.buf) < 8 || len(c.buf) < int(binary.BigEndian.Uint32(c.buf)) {
				break
			}
			n := binary.BigEndian.Uint32(c.buf)
			c.started = binary.BigEndian.Uint32(c.buf[4:]) == pgProtocol3
			c.buf = c.buf[n:]
			continue
		}
		if len(c.buf) < 5 || len(c.buf) < 1+int(binary.BigEndian.Uint32(c.buf[1:])) {
			break
		}
		n := 1 + int(binary.BigEndian.Uint32(c.buf[1:]))
		switch c.buf[0] {
		case 'P': // Parse: the statement's name, then its text
			name, rest, _ := strings.Cut(string(c.buf[5:n]), "\x00")
			query, _, _ := strings.Cut(rest, "\x00")
			if c.parsed == nil {
				c.parsed = map[string]string{}
			}
			c.parsed[name] = query
		case 'B': // Bind: the portal's name, then the statement's, run once each
			_, rest, _ := strings.Cut(string(c.buf[5:n]), "\x00")
			name, _, _ := strings.Cut(rest, "\x00")
			if query := c.parsed[name]; strings.Contains(query, c.r.table) {
				stmts = append(stmts, query)
			}
		}
		c.buf = c.buf[n:]
	}
	if len(stmts) > 0 {
		c.r.mu.Lock()
		c.r.trips = append(c.r.trips, stmts)
		c.r.mu.Unlock()
	}
	return c.Conn.Write(b)
}

// stmtKind names a statement of a batch by what it is.
func stmtKind(sql string) string {
	switch {
	case strings.HasPrefix(sql, "WITH l AS (") && strings.Contains(sql, "unnest("):
		return "fenced-many"
	case strings.HasPrefix(sql, "WITH l AS ("):
		return "fenced"
	case strings.HasPrefix(sql, "UPDATE "):
		return "update"
	case strings.HasPrefix(sql, "INSERT INTO ") && strings.Contains(sql, "WHERE false"):
		return "hold"
	case strings.HasPrefix(sql, "WITH locked AS ("):
		return "apply"
	}
	return "other: " + sql
}

// kinds names the statements of each round trip.
func kinds(trips [][]string) [][]string {
	out := make([][]string, len(trips))
	for i, trip := range trips {
		for _, sql := range trip {
			out[i] = append(out[i], stmtKind(sql))
		}
	}
	return out
}

// recordedStore returns a store on a fresh table of a recording pool, and
// its recorder.
func recordedStore(t *testing.T, tune func(*pgxpool.Config)) (*runlease.PostgresStore, *sqlRecorder, *pgxpool.Pool) {
	t.Helper()
	table := pgtest.NewTable(t, pgtest.Pool(t))
	r := &sqlRecorder{table: pgtest.Ident(table)}
	pool := r.pool(t, tune)
	s, err := runlease.NewPostgres(t.Context(), pool, runlease.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, r, pool
}

// wantRows checks that each key holds its value, or is absent for nil.
func wantRows(t *testing.T, s runlease.Store, want map[string]*string) {
	t.Helper()
	for k, v := range want {
		got, found, err := s.MetaGet(t.Context(), k)
		require.NoError(t, err)
		if v == nil {
			assert.False(t, found, "%q: want absent, holds %q", k, got)
			continue
		}
		if assert.True(t, found, "%q: want %q, absent", k, *v) {
			assert.True(t, got == *v, "%q: not byte for byte what was written (%d bytes, want %d)", k, len(got), len(*v))
		}
	}
}

// pgProtocol3 is the protocol version of the startup message, the last
// message without a type byte.
const pgProtocol3 = 3 << 16
