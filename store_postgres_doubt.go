package runlease

import (
	"context"
	"fmt"
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
// acknowledged: that commit waited for the standby after every earlier
// commit of the key. The set holds only keys of writes whose reply was
// lost, and each leaves at its key's next write that lands.
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
const pgGetDurable = `SELECT (SELECT value FROM %s WHERE key = $1), pg_logical_emit_message(true, 'runlease', 'barrier'), ` + pgDurable

// pgDoubts is the set of keys in doubt. mu is a leaf lock.
type pgDoubts struct {
	mu   sync.Mutex
	keys map[string]struct{}
	// size is len(keys), kept beside it so that a write that landed, the
	// common case, clears nothing and takes no lock while no key is in
	// doubt: a batched renewal of 512 leases then collects no keys.
	size atomic.Int64
}

// note records the outcome of a write of keys: in doubt when err is an
// unknown outcome, out of doubt when the write changed their rows and was
// acknowledged (landed), unchanged otherwise.
func (d *pgDoubts) note(err error, landed bool, keys ...string) {
	unknown := IsOutcomeUnknown(err)
	if !unknown && (err != nil || !landed || !d.any()) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, k := range keys {
		if !unknown {
			delete(d.keys, k)
			d.size.Store(int64(len(d.keys)))
			continue
		}
		if d.keys == nil {
			d.keys = map[string]struct{}{}
		}
		d.keys[k] = struct{}{}
		d.size.Store(int64(len(d.keys)))
	}
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

// getDurable is MetaGet of a key in doubt, read through the barrier.
func (s *PostgresStore) getDurable(ctx context.Context, key string) (string, bool, error) {
	var v string
	var found bool
	err := s.do(ctx, "MetaGet", key, false, func(c *pgx.Conn) error {
		res, err := send(ctx, c, pgStmt{s.q.getDurable, []any{key}})
		if err != nil {
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			// The barrier's wait for the standby may have been cut
			// short by the cancel request of the context's end.
			return fmt.Errorf("the read's wait for the standby may have been cancelled: %w", cerr)
		}
		if len(res[0].Rows) == 1 && res[0].Rows[0][0] != nil {
			v, found = string(res[0].Rows[0][0]), true
		}
		return nil
	})
	if err != nil {
		return "", false, err
	}
	return v, found, nil
}

// opKeys returns the keys ops write.
func opKeys(ops []Op) []string {
	keys := make([]string, len(ops))
	for i, op := range ops {
		keys[i] = op.Key
	}
	return keys
}
