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
	d.note(unknown, false, pgRun{pid: 7}, "k", "other")
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
		d.note(step.err, step.landed, pgRun{pid: 8}, step.key)
		assert.True(t, d.has("k"), "after %s, k is still in doubt", step.name)
	}
	d.note(nil, true, pgRun{pid: 8}, "k")
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
	d.note(unknown, false, pgRun{pid: 7}, "a", "b")
	d.note(unknown, false, pgRun{pid: 9}, "c")
	pids, gen := d.backends()
	assert.ElementsMatch(t, []int32{7, 9}, pids)
	d.note(unknown, false, pgRun{pid: 7}, "b") // after the barrier was taken
	d.note(unknown, false, pgRun{pid: 11}, "d")
	d.settle(gen, pids, pgBackends{9: time.UnixMilli(1)})
	assert.False(t, d.has("a"), "a's backend was done before the barrier")
	assert.True(t, d.has("b"), "b was noted again after the barrier was taken")
	assert.True(t, d.has("c"), "c's backend was busy")
	assert.True(t, d.has("d"), "d's backend was not asked about")
	pids, gen = d.backends()
	d.settle(gen, pids, nil)
	assert.False(t, d.any(), "a barrier that found every backend done settles all")
}

// TestPgDoubtsWaitOnlyForACutWriteWhoseBackendIsStillThere: a read of a
// key in doubt waits while a write of it whose connection was cut may
// still run: its backend, asked about, is there, and started before the
// write was noted (one that started after took the id of one that
// exited). A write whose reply was read in full has run; a write noted
// after the barrier asked is not waited for.
func TestPgDoubtsWaitOnlyForACutWriteWhoseBackendIsStillThere(t *testing.T) {
	t.Parallel()
	unknown := &StorageError{Op: "MetaBatch", Unknown: true, Err: errors.New("reply lost")}
	at := time.UnixMilli(1_800_000_000_000)
	before, after := at.Add(-time.Minute), at.Add(time.Millisecond)
	var d pgDoubts
	d.note(unknown, false, pgRun{pid: 7, cut: true, at: at}, "cut")
	d.note(unknown, false, pgRun{pid: 8, at: at}, "answered")
	d.note(unknown, false, pgRun{pid: 9, cut: true, at: at}, "id taken")
	d.note(unknown, false, pgRun{pid: 10, cut: true}, "time unknown")
	pids, gen := d.backends()
	d.note(unknown, false, pgRun{pid: 11, cut: true, at: at}, "later")
	there := pgBackends{7: before, 8: before, 9: after, 10: after, 11: before}
	assert.True(t, d.running("cut", gen, there), "its backend may still run it")
	assert.False(t, d.running("cut", gen, pgBackends{7: {}}), "a backend whose start is hidden is another role's, which took the id")
	assert.False(t, d.running("cut", gen, pgBackends{}), "its backend is gone")
	assert.False(t, d.running("answered", gen, there), "its reply was read in full")
	assert.False(t, d.running("id taken", gen, there), "the backend there started after the write")
	assert.True(t, d.running("time unknown", gen, there))
	assert.False(t, d.running("later", gen, there), "noted after the barrier asked")
	assert.False(t, d.running("no doubt", gen, there))

	d.settle(gen, pids, there)
	assert.True(t, d.has("cut"))
	assert.True(t, d.has("answered"), "its backend is still there")
	assert.False(t, d.has("id taken"), "its backend has exited")
	assert.True(t, d.has("time unknown"))
	assert.True(t, d.has("later"))
}

// TestParseBackends reads the barrier's list of backends still there.
func TestParseBackends(t *testing.T) {
	t.Parallel()
	got, err := parseBackends(nil)
	require.NoError(t, err)
	assert.Empty(t, got)
	got, err = parseBackends([]byte("12:1800000000000123,34:"))
	require.NoError(t, err)
	assert.Equal(t, pgBackends{12: time.UnixMicro(1800000000000123), 34: {}}, got)
	for _, bad := range []string{"x:1", "12:y", ""} {
		_, err := parseBackends([]byte(bad))
		assert.Error(t, err, "%q", bad)
	}
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

	s.doubts.note(unknown, false, pgRun{pid: goneID}, "gone")
	s.doubts.note(unknown, false, pgRun{pid: idle.PgConn().PID()}, "idle")
	s.doubts.note(unknown, false, pgRun{pid: inTx.PgConn().PID()}, "in-tx")
	s.doubts.note(unknown, false, pgRun{pid: ownID}, "own")
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
// transaction, its client gone), then on backend Q (gone), stays in doubt
// while P is there, though a barrier finds Q gone: P may still commit the
// write. A read of the key waits for P meanwhile, and returns once P has
// committed, with P's write.
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

	// The read-back of the write in doubt waits: write 1 may still commit.
	c3, cancel3 := context.WithTimeout(ctx, 300*time.Millisecond)
	v, _, err := s.MetaGet(c3, key)
	cancel3()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a read returned %q while write 1 could still commit", v)
	require.Equal(t, "active", state(p), "write 1 may still commit")
	require.True(t, s.doubts.has(key),
		"key settled while backend %d, which ran a write of it in doubt, was still in its transaction", p)

	// The holder lets go: write 1 commits, and the read, which waited for
	// it, returns it.
	read := make(chan string, 1)
	go func() {
		v, _, err := s.MetaGet(ctx, key)
		assert.NoError(t, err)
		read <- v
	}()
	time.Sleep(100 * time.Millisecond)
	_, err = holder.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
	assert.Equal(t, "v1", <-read, "the read returned before write 1 committed")
	assert.Equal(t, "gone", state(p))
}

func ptrTo(s string) *string { return &s }

// TestPostgresDoubtKeptWhileTheWriteWaitsUnreadOnAnIdleBackend: a backend is
// idle while a write sent to it still sits unread in its socket (a backend
// slow to be scheduled; SIGSTOP stands for that here). The client gives up
// the write, an unknown outcome. A barrier finds the backend idle, which is
// not done: the key stays in doubt, and a read of it waits until the
// backend has read the write, run it and exited, then returns what it left.
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

	c2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	v, _, err := s.MetaGet(c2, key) // the barrier
	cancel2()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a read returned %q while the write sat unread", v)
	require.True(t, s.doubts.has(key), "key settled while its write sat unread at idle backend %d", p)

	read := make(chan string, 1)
	go func() {
		v, _, err := s.MetaGet(ctx, key)
		assert.NoError(t, err)
		read <- v
	}()
	time.Sleep(100 * time.Millisecond)
	resume()
	v = <-read
	require.Equal(t, "gone", state(p), "the read returned %q before the backend was done", v)
	var cur string
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT value FROM "+table+" WHERE key = $1", key).Scan(&cur))
	assert.Equal(t, cur, v, "the read returned what the backend left")
	t.Logf("after the backend resumed: %q", v)
}

// TestPostgresDoubtSettledWriteIsLostInAFailover: the unread-write case of
// TestPostgresDoubtKeptWhileTheWriteWaitsUnreadOnAnIdleBackend under
// synchronous replication. A read while the backend has the write still
// to run waits for it. The backend then runs the write and commits it
// locally, and waits for the (now cut off) standby until an operator or a
// pooler's clean-up terminates it: the commit stands on the primary only.
// A read of the key returns it only if the key had been settled (a plain
// MetaGet); the standby, promoted, has the value before it: a reader
// would act on a value the failover lost. Kept in doubt, the read waits
// for the standby instead.
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
	c1, cancel1 := context.WithTimeout(ctx, 300*time.Millisecond)
	v, _, err := s.MetaGet(c1, key) // the barrier, the standby up
	cancel1()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a read returned %q while the write sat unread", v)
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

// TestPostgresReadDoesNotWaitForABackendOfAnotherRole: the store's role is
// an ordinary one (no pg_read_all_stats). A write of key k was noted in
// doubt on backend P, its connection cut; P has exited, and a backend of
// another role took its id. The server hides that backend's start from
// the store's role, and the store's own backends are never hidden from
// it, so the read knows the backend is not P: it neither waits for it (as
// long as another application's connection may live) nor keeps k in
// doubt.
func TestPostgresReadDoesNotWaitForABackendOfAnotherRole(t *testing.T) {
	ctx := t.Context()
	admin := pgtest.Pool(t)
	suffix := fmt.Sprintf("%d_%d", time.Now().UnixNano(), syscall.Getpid())
	storeRole, otherRole := "rl_store_"+suffix, "rl_other_"+suffix
	for _, role := range []string{storeRole, otherRole} {
		_, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
			_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
		})
	}
	_, err := admin.Exec(ctx, "GRANT CREATE ON SCHEMA public TO "+storeRole)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "REVOKE CREATE ON SCHEMA public FROM "+storeRole) })

	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.ConnConfig.User = storeRole
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := NewPostgres(ctx, pool, WithTable("rl_doubt_"+suffix), WithCreateTable(true))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ok, err := s.MetaCAS(ctx, "k", nil, "v0")
	require.NoError(t, err)
	require.True(t, ok)

	ocfg, err := pgx.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	ocfg.User = otherRole
	other, err := pgx.ConnectConfig(ctx, ocfg)
	require.NoError(t, err)
	defer other.Close(context.Background())
	unknown := &StorageError{Op: "MetaCAS", Key: "k", Unknown: true, Err: errors.New("reply lost")}
	s.doubts.note(unknown, false, pgRun{pid: other.PgConn().PID(), cut: true, at: time.Now().Add(-time.Second)}, "k")

	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, found, err := s.MetaGet(c, "k")
	require.NoError(t, err, "the read waited for another role's backend")
	assert.True(t, found)
	assert.Equal(t, "v0", v)
	assert.False(t, s.doubts.has("k"), "the write's backend is gone: the key is out of doubt")
}
