package runlease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Writes in doubt under synchronous replication.
//
// With a synchronous standby the primary makes a commit locally, then waits
// for the standby to confirm it. That wait can be cut short while the
// commit stands: by a cancel request (pgx's
// CancelRequestContextWatcherHandler sends one when a call's context ends;
// pg_cancel_backend sends one too) or by pg_terminate_backend. The server
// warns ("canceling wait for synchronous replication") and keeps the
// commit, visible on the primary and perhaps missing on the standby, so a
// failover loses it. Two rules keep such a write from being reported as
// landed:
//
//   - a write whose context ended before its reply was read is an
//     outcome-unknown fault, even when the server answered that it
//     committed (see do): the answer may be that of a cancelled wait;
//   - a read of a key after a write of it whose outcome was unknown (the
//     read-back that resolves the write, rule 6 of CONCURRENCY.md) is a
//     barrier: its transaction writes a WAL message and commits with
//     synchronous_commit pinned, so it returns only once the standby has
//     every commit made before its own, the write's included, if the write
//     committed. A write found there has landed for good. While the
//     standby is down the barrier waits, like any commit, until its
//     context ends; it then fails, for its wait may have been cancelled.
//
// A write in doubt may also not have run yet. A client that gives a call
// up (its context ends, its connection fails) closes the connection, but
// the server may still run the call's statements, or have them still to
// read, and commit them after a read-back of the key found the row as it
// was before: a caller that took that for a write that never lands would
// act on it (a queue entry taken for gone stays in the queue for a TTL).
// So a read of a key in doubt also waits while a backend may still run a
// write of it in doubt: one whose connection the client closed or left in
// the middle of a reply (cut), and that is still there. Such a backend
// exits once it has run the call or rolled it back, at the connection's
// end. The read looks the backends up in a statement of its own
// (pgDoubtBackends) before the one that reads the row, whose snapshot, at
// READ COMMITTED, thus has every commit of a backend found gone; while one
// is there, it pauses and reads again, until its context ends (a backend
// whose client's connection vanished without a word from the network
// waits for the server's TCP keepalive, and so may the read: the write
// may still come in, and commit). A write whose reply was read in full,
// whose context ended only after, has run, and is not waited for. A
// backend that started after the write was noted took the id of the
// write's backend, which had exited: the note records the server's time,
// as the store's clock bounds it from above.
//
// A key stays in doubt until a write of it changes its row and is
// acknowledged (that commit waited for the standby after every earlier
// commit of the key), or until a barrier read finds the backend that ran
// the write in doubt gone: the barrier's statement looks the backend up in
// pg_stat_activity before it commits, so a backend that has exited by then
// committed or rolled back before the barrier did, and the barrier's
// confirmed commit covers its write. (An idle backend is not enough: the
// write may still wait unread on its connection.) A write of unknown
// outcome leaves its connection broken, and the pool destroys it, so its
// backend exits soon; every read-back of a write in doubt thus settles the
// doubts noted before it whose backends have gone, including those of keys
// no call reads or writes again (a run given up), so the set does not grow
// with the process's lifetime. A key may have several writes in doubt, on
// several backends: it is settled once every one of them has gone. Behind
// a pooler whose backend ids are its own, only a later landed write takes
// a key out of doubt.
//
// The barrier writes a WAL message (pg_logical_emit_message, which every
// role may call unless revoked): a transaction that only took a
// transaction id writes no WAL of its own, and the server lets such a
// commit go without waiting for the standby.
//
// What no rule here catches is a wait cut short while the call's context
// lives (pg_cancel_backend of the backend of a write in flight): the
// server's answer is then a success, with only a warning, which a pool the
// store does not configure does not pass on.
//
// pgDoubtBackends, which leads the barrier read, lists, of the backends
// $1, those still there, other than its own (a write that ran on its own
// backend ended before this statement began), each as its id and its
// start in microseconds since the Unix epoch (nothing after the colon when
// the server hides it). A backend that is there may have the write still
// to read, even while idle: only a backend that has exited can commit
// nothing more. Its first column is its own backend's id, which must be
// the one the connection announced: behind a pooler that hands out backend
// ids of its own (PgBouncer), the ids the writes were noted with are not
// the server's, and nothing is settled, nor waited for, this way. The
// server reads pg_stat_activity once per transaction, at its first use, so
// the look-up is made once, ahead of the read's snapshot.
const (
	pgDoubtBackends = `SELECT pg_backend_pid(), (SELECT string_agg(pid::text || ':' || coalesce((extract(epoch FROM backend_start) * 1e6)::int8::text, ''), ',') ` +
		`FROM pg_stat_activity WHERE pid = ANY($1::int4[]) AND pid <> pg_backend_pid())`
	pgGetDurable = `SELECT (SELECT value FROM %s WHERE key = $1), pg_logical_emit_message(true, 'runlease', 'barrier'), ` + pgDurable
)

// pgDoubtPauseMax caps the pause between two reads of a key whose write in
// doubt may still run; the pause doubles from pgBatchPauseMin.
const pgDoubtPauseMax = 20 * time.Millisecond

// pgDoubts is the set of keys in doubt. mu is a leaf lock.
type pgDoubts struct {
	mu   sync.Mutex
	keys map[string][]pgDoubt
	gen  uint64 // notes made so far
	// size is len(keys), kept beside it so that a write that landed, the
	// common case, clears nothing and takes no lock while no key is in
	// doubt: a batched renewal of 512 leases then collects no keys.
	size atomic.Int64
}

// pgRun is the backend a write ran on, as the doubt set records it: its
// id; whether its connection was closed, or left in the middle of a reply
// (cut), which the pool then closes, so that the backend may run the write
// still, and exits once it is done; and the server's time once the write
// returned, at the latest, as the store's clock bounds it (zero when not
// known): a backend that started after it is another, which took the id.
type pgRun struct {
	pid uint32
	cut bool
	at  time.Time
}

// runOf returns the run of a write on c, once the write returned.
func runOf(c *pgx.Conn) pgRun {
	pc := c.PgConn()
	return pgRun{pid: pc.PID(), cut: pc.IsClosed() || pc.IsBusy()}
}

// note is pgDoubts.note with the time of a write in doubt noted.
func (s *PostgresStore) note(err error, landed bool, run pgRun, keys ...string) {
	if IsOutcomeUnknown(err) {
		now, uncertainty := s.ClockNow()
		run.at = now.Add(uncertainty)
	}
	s.doubts.note(err, landed, run, keys...)
}

// pgDoubt is a write of a key whose outcome is unknown, with its run, and
// noted by the gen-th note. A key is in doubt while any of its writes is.
type pgDoubt struct {
	pgRun
	gen uint64
}

// pgBackends is what a barrier found of the backends it asked about: the
// start of each one still there (zero when the server does not show it).
type pgBackends map[int32]time.Time

// there reports whether the backend of w may still be there: one with its
// id is, its start is shown, and it did not start after w was noted. The
// server hides the start of another role's backends from a role without
// pg_read_all_stats, never of its own: the store's writes run on backends
// of its own role, so a backend whose start is hidden took the id of one
// that exited, and waiting for it could last as long as another
// application's connection.
func (b pgBackends) there(w pgDoubt) bool {
	start, ok := b[int32(w.pid)]
	return ok && !start.IsZero() && (w.at.IsZero() || !start.After(w.at))
}

// note records the outcome of a write of keys, run as run says: in doubt
// when err is an unknown outcome, out of doubt when the write changed
// their rows and was acknowledged (landed), unchanged otherwise.
func (d *pgDoubts) note(err error, landed bool, run pgRun, keys ...string) {
	unknown := IsOutcomeUnknown(err)
	if !unknown && (err != nil || !landed || !d.any()) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	for _, k := range keys {
		if !unknown {
			delete(d.keys, k)
			continue
		}
		if d.keys == nil {
			d.keys = map[string][]pgDoubt{}
		}
		d.keys[k] = append(d.keys[k], pgDoubt{pgRun: run, gen: d.gen})
	}
	d.size.Store(int64(len(d.keys)))
}

// backends returns the backends of the writes in doubt now, and the note
// they were all made by.
func (d *pgDoubts) backends() (pids []int32, gen uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, writes := range d.keys {
		for _, w := range writes {
			if !slices.Contains(pids, int32(w.pid)) {
				pids = append(pids, int32(w.pid))
			}
		}
	}
	return pids, d.gen
}

// settle forgets every write in doubt noted by note gen or earlier whose
// backend was asked about (pids) and was not there (found lists those
// that were): a barrier that looked before it committed found that backend
// gone, and the standby confirmed the barrier's commit, so whatever that
// write committed is there too. A key leaves the set once none of its
// writes is left; a write noted since, on whatever backend, keeps it.
func (d *pgDoubts) settle(gen uint64, pids []int32, found pgBackends) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, writes := range d.keys {
		writes = slices.DeleteFunc(writes, func(w pgDoubt) bool {
			return w.gen <= gen && slices.Contains(pids, int32(w.pid)) && !found.there(w)
		})
		if len(writes) == 0 {
			delete(d.keys, k)
		} else {
			d.keys[k] = writes
		}
	}
	d.size.Store(int64(len(d.keys)))
}

// running reports whether a write of key in doubt, noted by note gen or
// earlier, may still run: its connection was cut, and a barrier found its
// backend still there (found).
func (d *pgDoubts) running(key string, gen uint64, found pgBackends) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.ContainsFunc(d.keys[key], func(w pgDoubt) bool {
		return w.cut && w.gen <= gen && found.there(w)
	})
}

// any reports whether some key may be in doubt: when it is false, a
// write that landed has nothing to clear, and a read nothing to wait for.
// A note racing it may be missed either way, as it would be by a look
// under the lock an instant earlier: the key stays in doubt a write
// longer, which costs a barrier, never a false landing.
func (d *pgDoubts) any() bool { return d.size.Load() > 0 }

// has reports whether key is in doubt.
func (d *pgDoubts) has(key string) bool {
	if !d.any() {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.keys[key]
	return ok
}

// getDurable is MetaGet of a key in doubt, read through the barrier, which
// also settles the doubts whose backends it finds done. While a write of
// the key in doubt may still run, it reads again after a pause, until its
// context ends.
func (s *PostgresStore) getDurable(ctx context.Context, key string) (string, bool, error) {
	pause := pgBatchPauseMin
	for {
		v, found, running, err := s.readDurable(ctx, key)
		if err != nil || !running {
			return v, found, err
		}
		if err := sleepCtx(ctx, pause); err != nil {
			err = fmt.Errorf("a write of the key whose outcome is unknown may still run: %w", err)
			return "", false, s.fault(ctx, "MetaGet", key, false, false, err)
		}
		pause = min(2*pause, pgDoubtPauseMax)
	}
}

// readDurable reads key through the barrier once, and reports whether a
// write of it in doubt may still run, which the read may have missed.
func (s *PostgresStore) readDurable(ctx context.Context, key string) (v string, found, running bool, err error) {
	pids, gen := s.doubts.backends()
	var there pgBackends
	serverIDs := false // the connection's backend id is the server's own
	err = s.do(ctx, "MetaGet", key, false, func(c *pgx.Conn) error {
		res, err := send(ctx, c, pgStmt{pgDoubtBackends, []any{pids}}, pgStmt{s.q.getDurable, []any{key}})
		if err != nil {
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			// The barrier's wait for the standby may have been cut
			// short by the cancel request of the context's end.
			return fmt.Errorf("the read's wait for the standby may have been cancelled: %w", cerr)
		}
		if len(res[0].Rows) != 1 || len(res[1].Rows) != 1 {
			return errors.New("unexpected reply: the barrier read returned no row")
		}
		if row := res[1].Rows[0]; row[0] != nil {
			v, found = string(row[0]), true
		}
		own, err := parsePIDs(res[0].Rows[0][0])
		if err != nil {
			return err
		}
		serverIDs = len(own) == 1 && uint32(own[0]) == c.PgConn().PID()
		there, err = parseBackends(res[0].Rows[0][1])
		return err
	})
	if err != nil || !serverIDs {
		return v, found, false, err
	}
	s.doubts.settle(gen, pids, there)
	return v, found, s.doubts.running(key, gen, there), nil
}

// parseBackends parses a comma-separated list of backends, each its id, a
// colon and its start in microseconds since the Unix epoch, or nothing.
func parseBackends(b []byte) (pgBackends, error) {
	there := pgBackends{}
	if b == nil {
		return there, nil
	}
	for f := range strings.SplitSeq(string(b), ",") {
		id, start, _ := strings.Cut(f, ":")
		pid, err := strconv.ParseInt(id, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("unexpected reply: backend id %q: %w", f, err)
		}
		var at time.Time
		if start != "" {
			us, err := strconv.ParseInt(start, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("unexpected reply: backend start %q: %w", f, err)
			}
			at = time.UnixMicro(us)
		}
		there[int32(pid)] = at
	}
	return there, nil
}

// parsePIDs parses a comma-separated list of backend ids (nil: none).
func parsePIDs(b []byte) ([]int32, error) {
	if b == nil {
		return nil, nil
	}
	var pids []int32
	for f := range strings.SplitSeq(string(b), ",") {
		n, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("unexpected reply: backend id %q: %w", f, err)
		}
		pids = append(pids, int32(n))
	}
	return pids, nil
}

// opKeys returns the keys ops write.
func opKeys(ops []Op) []string {
	keys := make([]string, len(ops))
	for i, op := range ops {
		keys[i] = op.Key
	}
	return keys
}
