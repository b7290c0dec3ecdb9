package runlease

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/systest"
)

// TestPgDoubtsKeepAKeyInDoubtUntilAWriteOfItLands: a write of unknown
// outcome puts its keys in doubt; only a write that changed the row and was
// acknowledged takes a key out, since only its commit waited for the
// standby after the write in doubt. A refused write, a fault that changed
// nothing and a write of another key leave the doubt as it was.
func TestPgDoubtsKeepAKeyInDoubtUntilAWriteOfItLands(t *testing.T) {
	t.Parallel()
	unknown := &StorageError{Op: "MetaCAS", Key: "k", Unknown: true, Err: errors.New("reset")}
	notApplied := &StorageError{Op: "MetaCAS", Key: "k", Err: errors.New("refused")}
	var d pgDoubts
	assert.False(t, d.has("k"))
	d.note(unknown, false, 7, "k", "other")
	assert.True(t, d.has("k"))
	assert.True(t, d.has("other"))
	for _, step := range []struct {
		name   string
		err    error
		landed bool
		key    string
	}{
		{"refused", nil, false, "k"},
		{"not applied", notApplied, false, "k"},
		{"another key landed", nil, true, "third"},
	} {
		d.note(step.err, step.landed, 8, step.key)
		assert.True(t, d.has("k"), "after %s, k is still in doubt", step.name)
	}
	d.note(nil, true, 8, "k")
	assert.False(t, d.has("k"), "a write of k landed")
	assert.True(t, d.has("other"))
}

// TestPgDoubtsSettleOnlyWhatTheBarrierCovers: a barrier settles the keys
// noted up to the note it was taken after whose backend it found done; a
// key whose backend was busy, or noted again since, keeps its doubt.
func TestPgDoubtsSettleOnlyWhatTheBarrierCovers(t *testing.T) {
	t.Parallel()
	unknown := &StorageError{Op: "MetaCAS", Key: "k", Unknown: true, Err: errors.New("reset")}
	var d pgDoubts
	d.note(unknown, false, 7, "a", "b")
	d.note(unknown, false, 9, "c")
	pids, gen := d.backends()
	assert.ElementsMatch(t, []int32{7, 9}, pids)
	d.note(unknown, false, 7, "b") // after the barrier was taken
	d.note(unknown, false, 11, "d")
	d.settle(gen, pids, []int32{9})
	assert.False(t, d.has("a"), "a's backend was done before the barrier")
	assert.True(t, d.has("b"), "b was noted again after the barrier was taken")
	assert.True(t, d.has("c"), "c's backend was busy")
	assert.True(t, d.has("d"), "d's backend was not asked about")
	pids, gen = d.backends()
	d.settle(gen, pids, nil)
	assert.False(t, d.any(), "a barrier that found every backend done settles all")
}

// TestPostgresBarrierReadSettlesDoubtsOfGoneBackends: on a real server, a
// read through the barrier settles every key in doubt whose write's backend
// has exited, or is the barrier's own, and keeps the keys of a backend
// still there (in a transaction, or idle, which may have the write still
// to read) until a later barrier finds it gone. A key in doubt that nothing
// reads or writes again thus does not stay.
func TestPostgresBarrierReadSettlesDoubtsOfGoneBackends(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = 1 // every call runs on one backend, the barrier's own
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := newPgOnTable(t, pool)
	unknown := &StorageError{Op: "MetaCAS", Key: "k", Unknown: true, Err: errors.New("reply lost")}
	backend := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, pgtest.DSN(t))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	gone, idle, inTx := backend(), backend(), backend()
	goneID := gone.PgConn().PID()
	require.NoError(t, gone.Close(ctx))
	_, err = inTx.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = inTx.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	// The pool's own backend: a write on it ended before the barrier ran.
	pooled, err := pool.Acquire(ctx)
	require.NoError(t, err)
	ownID := pooled.Conn().PgConn().PID()
	pooled.Release()

	s.doubts.note(unknown, false, goneID, "gone")
	s.doubts.note(unknown, false, idle.PgConn().PID(), "idle")
	s.doubts.note(unknown, false, inTx.PgConn().PID(), "in-tx")
	s.doubts.note(unknown, false, ownID, "own")
	require.Eventually(t, func() bool { // an exited backend leaves pg_stat_activity at once, or nearly
		_, _, err := s.MetaGet(ctx, "gone")
		require.NoError(t, err)
		return !s.doubts.has("gone")
	}, 10*time.Second, 20*time.Millisecond)
	assert.True(t, s.doubts.has("idle"), "an idle backend may still have the write to read")
	assert.True(t, s.doubts.has("in-tx"), "a backend in a transaction may still commit the write")
	assert.False(t, s.doubts.has("own"), "the barrier's own backend ran the write before it")

	_, err = inTx.Exec(ctx, "COMMIT")
	require.NoError(t, err)
	require.NoError(t, inTx.Close(ctx))
	require.NoError(t, idle.Close(ctx))
	require.Eventually(t, func() bool {
		for _, key := range []string{"idle", "in-tx"} { // a read of a key in doubt goes through the barrier
			_, _, err = s.MetaGet(ctx, key)
			require.NoError(t, err)
		}
		return !s.doubts.any()
	}, 10*time.Second, 20*time.Millisecond, "once their backends have exited, no key stays in doubt")
}

// TestPostgresDoubtKeptWhileAnEarlierWriteOfTheKeyStillRuns: a key written
// twice with unknown outcomes, first on backend P (still blocked in its
// transaction, its client gone), then on backend Q (gone), is recorded with
// Q only. A barrier that finds Q gone settles the key, though P may still
// commit the write, after the barrier, unconfirmed by the standby: a plain
// read of the key then sees it.
func TestPostgresDoubtKeptWhileAnEarlierWriteOfTheKeyStillRuns(t *testing.T) {
	systest.Mark(t)
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	// cut stands for a network fault: no new connection reaches the
	// server, so neither does the cancel request pgx sends when it gives
	// up a connection.
	var cut atomic.Bool
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if cut.Load() {
			return nil, errors.New("network unreachable")
		}
		return dial(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := pgtest.NewTable(t, pool)
	s, err := NewPostgres(ctx, pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	const key = "k"
	ok, err := s.MetaCAS(ctx, key, nil, "v0")
	require.NoError(t, err)
	require.True(t, ok)

	// A holder locks the row: every write of it now waits.
	holder, err := pgx.Connect(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close(context.Background()) })
	_, err = holder.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = holder.Exec(ctx, "SELECT 1 FROM "+table+" WHERE key = $1 FOR UPDATE", key)
	require.NoError(t, err)

	state := backendState(t, pgtest.DSN(t))
	pidOf := func() uint32 {
		s.doubts.mu.Lock()
		defer s.doubts.mu.Unlock()
		return s.doubts.keys[key][len(s.doubts.keys[key])-1].pid
	}

	// Write 1: its context ends while it waits for the lock, and the
	// network fails then; pgx closes the connection, its cancel request
	// does not get through, and backend P keeps waiting.
	c1, cancel1 := context.WithTimeout(ctx, 300*time.Millisecond)
	time.AfterFunc(200*time.Millisecond, func() { cut.Store(true) })
	_, err = s.MetaCAS(c1, key, ptrTo("v0"), "v1")
	cancel1()
	require.True(t, IsOutcomeUnknown(err), "write 1: %v", err)
	p := pidOf()
	time.Sleep(time.Second) // pgx's cancel request would have landed by now
	require.Equal(t, "active", state(p), "write 1's backend still waits for the lock")
	cut.Store(false)

	// Write 2 of the same key, on backend Q: unknown outcome, and Q ends.
	c2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = s.MetaCAS(c2, key, ptrTo("v0"), "v2")
	cancel2()
	require.True(t, IsOutcomeUnknown(err), "write 2: %v", err)
	q := pidOf()
	require.NotEqual(t, p, q)
	// Its cancel request got through: Q rolled back and exits.
	require.Eventually(t, func() bool { return state(q) == "gone" }, 10*time.Second, 20*time.Millisecond)

	// The read-back of the write in doubt: a barrier.
	v, found, err := s.MetaGet(ctx, key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "v0", v)
	require.Equal(t, "active", state(p), "write 1 may still commit")
	inDoubt := s.doubts.has(key)

	// The holder lets go: write 1 commits now, after the barrier, and a
	// read that is no barrier returns it (under synchronous replication,
	// while the standby may not have it yet).
	_, err = holder.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return state(p) == "gone" }, 10*time.Second, 20*time.Millisecond)
	v, _, err = s.MetaGet(ctx, key)
	require.NoError(t, err)
	t.Logf("after write 1 committed: %q, read through a barrier: %v", v, s.doubts.has(key))
	require.True(t, inDoubt,
		"key settled while backend %d, which ran a write of it in doubt, was still in its transaction; that write committed %q after the barrier", p, v)
}

func ptrTo(s string) *string { return &s }

// TestPostgresDoubtKeptWhileTheWriteWaitsUnreadOnAnIdleBackend: a backend is
// idle while a write sent to it still sits unread in its socket (a backend
// slow to be scheduled; SIGSTOP stands for that here). The client gives up
// the write, an unknown outcome; a barrier finds the backend idle and
// settles the key; the backend then reads the write, runs and commits it,
// after the barrier, and a read that is no barrier returns it.
func TestPostgresDoubtKeptWhileTheWriteWaitsUnreadOnAnIdleBackend(t *testing.T) {
	systest.Mark(t)
	ctx := t.Context()
	// A private server: the backend this test stops may hold a lock of
	// the server's own (its statistics), which would stall other tests.
	dsn := pgtest.StartCluster(t).DSN()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 2 // the write's connection, given up, holds its place until the backend answers
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := pgtest.NewTable(t, pool)
	s, err := NewPostgres(ctx, pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	const key = "k"
	ok, err := s.MetaCAS(ctx, key, nil, "v0")
	require.NoError(t, err)
	require.True(t, ok)

	state := backendState(t, dsn)

	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	p := c.Conn().PgConn().PID()
	c.Release()
	require.Equal(t, "idle", state(p))
	resume := stopBackend(t, p)
	writeInDoubt(t, s, key)
	require.Equal(t, "idle", state(p), "the backend has not read the write yet")

	v, _, err := s.MetaGet(ctx, key) // the barrier
	require.NoError(t, err)
	require.Equal(t, "v0", v)
	inDoubt := s.doubts.has(key)

	resume()
	require.Eventually(t, func() bool { return state(p) == "gone" }, 10*time.Second, 20*time.Millisecond)
	v, _, err = s.MetaGet(ctx, key)
	require.NoError(t, err)
	t.Logf("after the backend resumed: %q, read through a barrier: %v", v, s.doubts.has(key))
	require.True(t, inDoubt,
		"key settled while its write sat unread at idle backend %d; the value now is %q", p, v)
}

// TestPostgresDoubtSettledWriteIsLostInAFailover: the unread-write case of
// TestPostgresDoubtKeptWhileTheWriteWaitsUnreadOnAnIdleBackend under
// synchronous replication. Once the barrier settled the key, the backend
// runs the write and commits it locally, and waits for the (now cut off)
// standby until an operator or a pooler's clean-up terminates it: the
// commit stands on the primary only, and a plain MetaGet returns it (the
// key is no longer in doubt); the standby, promoted, has the value before
// it: a reader acted on a value the failover lost. Before the settling,
// the key stayed in doubt and the read waited for the standby.
func TestPostgresDoubtSettledWriteIsLostInAFailover(t *testing.T) {
	systest.Mark(t)
	pair := pgtest.StartReplicated(t, true)
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(pair.DSN())
	require.NoError(t, err)
	cfg.MaxConns = 2 // the write's connection, given up, holds its place until the backend answers
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	s, err := NewPostgres(ctx, pool, WithTable("doubt_failover"))
	require.NoError(t, err)
	const key = "k"
	ok, err := s.MetaCAS(ctx, key, nil, "v0")
	require.NoError(t, err)
	require.True(t, ok)

	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	p := c.Conn().PgConn().PID()
	c.Release()
	resume := stopBackend(t, p)
	writeInDoubt(t, s, key)
	v, _, err := s.MetaGet(ctx, key) // the barrier, the standby up
	require.NoError(t, err)
	require.Equal(t, "v0", v)
	t.Logf("in doubt after the barrier: %v", s.doubts.has(key))

	pair.DisconnectStandby()
	resume()
	require.Equal(t, int(p), pair.WaitSyncRepWaiter(), "the write committed locally, unconfirmed")
	// An operator or a pooler's clean-up ends the backend: its wait is cut
	// short and the commit stands, visible on the primary only.
	pair.Terminate(int(p))
	admin, err := pgx.Connect(ctx, pair.Primary.DSN())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int32(p)).Scan(&n))
		return n == 0
	}, 10*time.Second, 20*time.Millisecond, "the terminated backend exits")
	require.NoError(t, admin.Close(ctx))
	c2, cancel2 := context.WithTimeout(ctx, 3*time.Second)
	read, _, readErr := s.MetaGet(c2, key)
	cancel2()
	t.Logf("MetaGet while the standby is cut off: %q, %v", read, readErr)
	pool.Close()
	s.Close()

	pair.KillPrimary()
	pair.ReconnectStandby()
	pair.Promote()
	after, err := OpenPostgres(ctx, pair.DSN(), WithTable("doubt_failover"))
	require.NoError(t, err)
	t.Cleanup(func() { after.Close() })
	var kept string
	require.Eventually(t, func() bool {
		var err error
		kept, _, err = after.MetaGet(ctx, key)
		return err == nil
	}, 60*time.Second, 100*time.Millisecond)
	if readErr == nil {
		require.Equal(t, kept, read, "MetaGet returned a value the failover lost")
	}
}

// keyProxy relays Postgres connections as a pooler does (PgBouncer, which
// the README supports, gives its clients backend keys of its own): a
// client's PgConn().PID() is not its server backend's pid. Cancel requests
// are passed on to the backend they stand for.
type keyProxy struct {
	ln   net.Listener
	mu   sync.Mutex
	real map[uint32]pgproto3.BackendKeyData // by the pid the client sees
	next uint32
}

func startKeyProxy(t *testing.T, server string) *keyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &keyProxy{ln: ln, real: map[uint32]pgproto3.BackendKeyData{}, next: 4_000_000}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, server)
		}
	}()
	return p
}

func (p *keyProxy) serverKey(pid uint32) pgproto3.BackendKeyData {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.real[pid]
}

func (p *keyProxy) serve(client net.Conn, server string) {
	defer client.Close()
	be := pgproto3.NewBackend(client, client)
	msg, err := be.ReceiveStartupMessage()
	if err != nil {
		return
	}
	srv, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer srv.Close()
	fe := pgproto3.NewFrontend(srv, srv)
	switch m := msg.(type) {
	case *pgproto3.CancelRequest:
		if key := p.serverKey(m.ProcessID); key.ProcessID != 0 {
			fe.Send(&pgproto3.CancelRequest{ProcessID: key.ProcessID, SecretKey: key.SecretKey})
			_ = fe.Flush()
			_, _ = io.Copy(io.Discard, srv)
		}
		return
	case *pgproto3.StartupMessage:
		fe.Send(m)
		if fe.Flush() != nil {
			return
		}
	default:
		return
	}
	for {
		bm, err := fe.Receive()
		if err != nil {
			return
		}
		if k, ok := bm.(*pgproto3.BackendKeyData); ok {
			p.mu.Lock()
			p.next++
			fake := p.next
			p.real[fake] = pgproto3.BackendKeyData{ProcessID: k.ProcessID, SecretKey: slices.Clone(k.SecretKey)}
			p.mu.Unlock()
			bm = &pgproto3.BackendKeyData{ProcessID: fake, SecretKey: k.SecretKey}
		}
		be.Send(bm)
		if be.Flush() != nil {
			return
		}
		if _, ok := bm.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(srv, client); _ = srv.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, srv); _ = client.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

// TestPostgresDoubtKeptBehindAPoolerThatGivesBackendKeysOfItsOwn: behind a
// pooler, the pid a connection reports is the pooler's, which
// pg_stat_activity never lists, so the first barrier takes it for a backend
// gone and settles the key, whatever the server's backend is doing: here
// it has the write still to read (SIGSTOP stands for a slow backend or a
// delayed packet), and commits it after the barrier.
func TestPostgresDoubtKeptBehindAPoolerThatGivesBackendKeysOfItsOwn(t *testing.T) {
	systest.Mark(t)
	ctx := t.Context()
	// A private server: the backend this test stops may hold a lock of
	// the server's own (its statistics), which would stall other tests.
	dsn := pgtest.StartCluster(t).DSN()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	proxy := startKeyProxy(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(proxy.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := pgtest.NewTable(t, pool)
	s, err := NewPostgres(ctx, pool, WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	const key = "k"
	ok, err := s.MetaCAS(ctx, key, nil, "v0")
	require.NoError(t, err)
	require.True(t, ok)

	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	seen := c.Conn().PgConn().PID()
	c.Release()
	p := proxy.serverKey(seen).ProcessID
	require.NotZero(t, p)
	require.NotEqual(t, seen, p)
	resume := stopBackend(t, p)
	writeInDoubt(t, s, key)
	v, _, err := s.MetaGet(ctx, key) // the barrier
	require.NoError(t, err)
	require.Equal(t, "v0", v)
	inDoubt := s.doubts.has(key)

	resume()
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	require.Eventually(t, func() bool {
		var cur string
		require.NoError(t, admin.QueryRow(ctx, "SELECT value FROM "+table+" WHERE key = $1", key).Scan(&cur))
		return cur == "v1"
	}, 10*time.Second, 20*time.Millisecond, "the backend runs the write once resumed")
	require.True(t, inDoubt,
		"key settled by a barrier that looked up the pooler's pid %d, while server backend %d had the write still to run; it committed it after the barrier", seen, p)
}

// stopBackend stops the server backend p (SIGSTOP), and returns what
// resumes it, once, which t's clean-up also calls.
func stopBackend(t *testing.T, p uint32) (resume func()) {
	t.Helper()
	require.NoError(t, syscall.Kill(int(p), syscall.SIGSTOP))
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			require.NoError(t, syscall.Kill(int(p), syscall.SIGCONT))
		}
	}
	t.Cleanup(resume)
	return resume
}

// writeInDoubt writes key from v0 to v1 with a context that ends before
// the reply comes back: an unknown outcome, which puts key in doubt.
func writeInDoubt(t *testing.T, s *PostgresStore, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := s.MetaCAS(ctx, key, ptrTo("v0"), "v1")
	require.True(t, IsOutcomeUnknown(err), "write: %v", err)
	require.True(t, s.doubts.has(key))
}

// backendState returns what tells the state of a server backend, by its
// pg_stat_activity row, read on a connection of its own to dsn: "gone"
// once the backend has exited, "null" when its state is hidden.
func backendState(t *testing.T, dsn string) func(pid uint32) string {
	t.Helper()
	admin, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	return func(pid uint32) string {
		var st *string
		err := admin.QueryRow(t.Context(), "SELECT state FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&st)
		if err == pgx.ErrNoRows {
			return "gone"
		}
		require.NoError(t, err)
		if st == nil {
			return "null"
		}
		return *st
	}
}
