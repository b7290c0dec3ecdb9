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
// A key stays in doubt until a write of it changes its row and is
// acknowledged (that commit waited for the standby after every earlier
// commit of the key), or until a barrier read finds the backend that ran
// the write in doubt done: the barrier's statement looks the backend up in
// pg_stat_activity before it commits, so a backend gone or idle then has
// committed or rolled back before the barrier did, and the barrier's
// confirmed commit covers its write. Every read-back of a write in doubt
// thus settles the doubts noted before it, including those of keys no
// call reads or writes again (a run given up), so the set does not grow
// with the process's lifetime.
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
// Its last column lists, of the backends $2, those still busy: in a
// transaction, or whose state this role may not see (its own backend is
// not: a write that ran on it ended before this statement began).
const pgGetDurable = `SELECT (SELECT value FROM %s WHERE key = $1), pg_logical_emit_message(true, 'runlease', 'barrier'), ` + pgDurable +
	`, (SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE pid = ANY($2::int4[]) AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle')`

// pgDoubts is the set of keys in doubt. mu is a leaf lock.
type pgDoubts struct {
	mu   sync.Mutex
	keys map[string]pgDoubt
	gen  uint64 // notes made so far
	// size is len(keys), kept beside it so that a write that landed, the
	// common case, clears nothing and takes no lock while no key is in
	// doubt: a batched renewal of 512 leases then collects no keys.
	size atomic.Int64
}

// pgDoubt is why a key is in doubt: the last write of it whose outcome is
// unknown ran on backend pid, and was noted as the gen-th note.
type pgDoubt struct {
	pid uint32
	gen uint64
}

// note records the outcome of a write of keys, run on backend pid: in
// doubt when err is an unknown outcome, out of doubt when the write changed
// their rows and was acknowledged (landed), unchanged otherwise.
func (d *pgDoubts) note(err error, landed bool, pid uint32, keys ...string) {
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
			d.keys = map[string]pgDoubt{}
		}
		d.keys[k] = pgDoubt{pid: pid, gen: d.gen}
	}
	d.size.Store(int64(len(d.keys)))
}

// backends returns the backends of the writes in doubt now, and the note
// they were all made by.
func (d *pgDoubts) backends() (pids []int32, gen uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, doubt := range d.keys {
		if !slices.Contains(pids, int32(doubt.pid)) {
			pids = append(pids, int32(doubt.pid))
		}
	}
	return pids, d.gen
}

// settle takes out of doubt every key noted by note gen or earlier whose
// backend was asked about (pids) and was not busy: a barrier that looked
// before it committed found that backend's transaction over, and the
// standby confirmed the barrier's commit, so whatever that write committed
// is there too. A key noted again since keeps its doubt.
func (d *pgDoubts) settle(gen uint64, pids []int32, busy []int32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, doubt := range d.keys {
		if doubt.gen <= gen && slices.Contains(pids, int32(doubt.pid)) && !slices.Contains(busy, int32(doubt.pid)) {
			delete(d.keys, k)
		}
	}
	d.size.Store(int64(len(d.keys)))
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
// also settles the doubts whose backends it finds done.
func (s *PostgresStore) getDurable(ctx context.Context, key string) (string, bool, error) {
	var v string
	var found bool
	pids, gen := s.doubts.backends()
	var busy []int32
	err := s.do(ctx, "MetaGet", key, false, func(c *pgx.Conn) error {
		res, err := send(ctx, c, pgStmt{s.q.getDurable, []any{key, pids}})
		if err != nil {
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			// The barrier's wait for the standby may have been cut
			// short by the cancel request of the context's end.
			return fmt.Errorf("the read's wait for the standby may have been cancelled: %w", cerr)
		}
		if len(res[0].Rows) != 1 {
			return errors.New("unexpected reply: the barrier read returned no row")
		}
		row := res[0].Rows[0]
		if row[0] != nil {
			v, found = string(row[0]), true
		}
		busy, err = parsePIDs(row[len(row)-1])
		return err
	})
	if err != nil {
		return "", false, err
	}
	s.doubts.settle(gen, pids, busy)
	return v, found, nil
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
