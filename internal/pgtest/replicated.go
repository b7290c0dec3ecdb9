package pgtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// standbyName is the standby's application_name, which the primary's
// synchronous_standby_names names when replication is synchronous.
const standbyName = "standby1"

// Replicated is a private primary and one streaming standby, each a
// server process of its own on loopback ports, for failover tests. With
// synchronous replication the primary acknowledges a commit only once the
// standby has flushed it (synchronous_commit = on, which the store pins);
// without, the standby follows as fast as it can.
type Replicated struct {
	Primary, Standby *Cluster
	t                testing.TB
	sync             bool
}

// StartReplicated creates and starts a primary and a standby streaming
// from it, and waits until the standby streams (and, when sync, is the
// primary's synchronous standby).
func StartReplicated(t testing.TB, sync bool) *Replicated {
	t.Helper()
	names := "''"
	if sync {
		names = standbyName
	}
	p := newCluster(t, "-c wal_level=replica -c max_wal_senders=4 -c wal_keep_size=64MB -c synchronous_standby_names="+names)
	p.initdb()
	p.Start()
	s := newCluster(t, "-c hot_standby=on -c wal_receiver_status_interval=1s")
	conn := fmt.Sprintf("host=127.0.0.1 port=%d user=runlease application_name=%s", p.port, standbyName)
	s.run("pg_basebackup", "-d", conn, "-D", s.data(), "-R", "-X", "stream", "--no-sync", "-c", "fast")
	s.Start()
	r := &Replicated{Primary: p, Standby: s, t: t, sync: sync}
	r.waitStreaming()
	return r
}

// DSN returns a DSN that names both servers and connects only to the one
// that accepts writes, as a client of a failover pair is configured.
func (r *Replicated) DSN() string {
	return fmt.Sprintf("postgres://runlease@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=read-write",
		r.Primary.port, r.Standby.port)
}

// waitStreaming waits until the primary reports the standby streaming, in
// the synchronous state when replication is synchronous.
func (r *Replicated) waitStreaming() {
	r.t.Helper()
	want := "async"
	if r.sync {
		want = "sync"
	}
	r.poll("the standby to stream", func(ctx context.Context) (bool, error) {
		var state string
		err := r.query(ctx, r.Primary, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, []any{standbyName}, &state)
		return err == nil && state == want, nil
	})
}

// WaitCaughtUp waits until the standby has replayed everything the primary
// has written so far.
func (r *Replicated) WaitCaughtUp() {
	r.t.Helper()
	var lsn string
	if err := r.query(context.Background(), r.Primary, `SELECT pg_current_wal_lsn()::text`, nil, &lsn); err != nil {
		r.t.Fatalf("pgtest: %v", err)
	}
	r.poll("the standby to replay "+lsn, func(ctx context.Context) (bool, error) {
		var done bool
		err := r.query(ctx, r.Standby, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, []any{lsn}, &done)
		return err == nil && done, nil
	})
}

// DisconnectStandby stops the standby at once: from then on the primary
// commits what the standby never receives, as it does when the standby is
// cut off or far behind. With synchronous replication the primary's
// commits wait for it instead. ReconnectStandby starts it again; it goes
// on from the WAL it had, streaming if the primary is up.
func (r *Replicated) DisconnectStandby() { r.Standby.Stop() }

// ReconnectStandby starts the standby DisconnectStandby stopped.
func (r *Replicated) ReconnectStandby() { r.Standby.Start() }

// KillPrimary stops the primary at once, as a crash does (see Stop).
func (r *Replicated) KillPrimary() { r.Primary.Stop() }

// Promote makes the standby the primary (pg_ctl promote, waiting until it
// accepts writes).
func (r *Replicated) Promote() {
	r.t.Helper()
	r.Standby.ctl(false, "promote")
}

// WaitSyncRepWaiter waits until a backend of the primary other than those
// in skip waits for the synchronous standby to confirm its commit (wait
// event SyncRep), and returns its process id: a commit that the primary has
// made locally and not yet acknowledged.
func (r *Replicated) WaitSyncRepWaiter(skip ...int) int {
	r.t.Helper()
	var pid int
	r.poll("a commit waiting for the synchronous standby", func(ctx context.Context) (bool, error) {
		err := r.query(ctx, r.Primary, `SELECT coalesce(min(pid), 0) FROM pg_stat_activity
WHERE wait_event = 'SyncRep' AND NOT pid = ANY(coalesce($1::int[], '{}'))`, []any{skip}, &pid)
		return err == nil && pid != 0, nil
	})
	return pid
}

// SyncRepWaiters returns the primary's backends that wait for the
// synchronous standby now.
func (r *Replicated) SyncRepWaiters() ([]int, error) {
	var pids []int
	err := r.query(context.Background(), r.Primary,
		`SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE wait_event = 'SyncRep'`, nil, &pids)
	return pids, err
}

// Terminate ends the primary's backend pid with pg_terminate_backend, as
// an operator or a connection pooler's clean-up does.
func (r *Replicated) Terminate(pid int) {
	r.t.Helper()
	var ok bool
	if err := r.query(context.Background(), r.Primary, `SELECT pg_terminate_backend($1)`, []any{pid}, &ok); err != nil || !ok {
		r.t.Fatalf("pgtest: terminating backend %d: %v (signalled: %v)", pid, err, ok)
	}
}

// Exec runs sql on c over a connection of its own, as the cluster's
// superuser.
func (r *Replicated) Exec(c *Cluster, sql string) {
	r.t.Helper()
	conn, err := pgx.Connect(context.Background(), c.DSN())
	if err != nil {
		r.t.Fatalf("pgtest: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		r.t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

func (r *Replicated) poll(what string, done func(ctx context.Context) (bool, error)) {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ok, err := done(ctx)
		cancel()
		if err != nil {
			r.t.Fatalf("pgtest: waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("pgtest: timed out waiting for %s", what)
}

// query runs sql on c over a connection of its own and scans one row.
func (r *Replicated) query(ctx context.Context, c *Cluster, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, c.DSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}
