package benchkit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/areev/runlease"
)

// Raw sends the statements a store would, directly, with none of the
// library around them: the baseline each benchmark is compared with. Its
// methods mirror the store's (same SQL, same handle settings) so that the
// ratio of the two is what the library costs over the physical limit of the
// machine. Implementations are safe for concurrent use.
type Raw interface {
	// Get reads key's value.
	Get(ctx context.Context, key string) (string, bool, error)
	// Insert writes key if absent, and reports whether it did.
	Insert(ctx context.Context, key, value string) (bool, error)
	// Update writes value over exactly old, and reports whether it did.
	Update(ctx context.Context, key, old, value string) (bool, error)
	// UpdateNotify is Update that also queues a notification, as the
	// store's Release does (Postgres: RETURNING pg_notify; SQLite: a plain
	// Update, since the store wakes its waiters in process).
	UpdateNotify(ctx context.Context, key, old, value string) (bool, error)
	// Delete removes key if it holds exactly old, and reports whether it did.
	Delete(ctx context.Context, key, old string) (bool, error)
	// Scan returns the rows whose key starts with prefix, in key order.
	Scan(ctx context.Context, prefix string) ([]runlease.Row, error)
	// FencedWrite writes value over exactly old at key and, in the same
	// transaction and only if that write happened, upserts value2 at key2:
	// the least a fenced write can cost.
	FencedWrite(ctx context.Context, key, old, value, key2, value2 string) (bool, error)
	// Upsert writes every row, in one statement or transaction (set-up work).
	Upsert(ctx context.Context, rows []runlease.Row) error
	// Trips returns the round trips (Postgres) or calls (SQLite) so far.
	Trips() int64
}

// Env is one store under test, a Raw line to the same storage, and their
// round-trip counters. Kind is "sqlite" or "postgres".
type Env struct {
	Kind  string
	Store runlease.Store // what the scenarios give the library
	Raw   Raw

	trips   func() int64 // the store's round trips (Postgres) or calls (SQLite)
	warm    func(ctx context.Context, n int) error
	pg      *pgEnv // Postgres only
	seq     atomic.Int64
	mu      sync.Mutex
	done    map[string]error // set-up steps that ran, by name
	closers []func() error
}

// Kinds are the stores an Env can be opened on.
var Kinds = []string{"sqlite", "postgres"}

// Trips returns the store's round trips so far: socket round trips for
// Postgres, store calls for SQLite.
func (e *Env) Trips() int64 { return e.trips() }

// TripUnit names what Trips counts.
func (e *Env) TripUnit() string {
	if e.Kind == "sqlite" {
		return "store calls"
	}
	return "socket round trips"
}

// Seq returns a number no earlier call on e returned, for unique keys.
func (e *Env) Seq() int64 { return e.seq.Add(1) }

// Once runs fn the first time it is called with name on e, and returns its
// error then and on every later call with name.
func (e *Env) Once(name string, fn func() error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done == nil {
		e.done = map[string]error{}
	}
	if err, ok := e.done[name]; ok {
		return err
	}
	err := fn()
	e.done[name] = err
	return err
}

// Warm opens up to n connections ahead of a measurement, so no connection
// handshake lands inside one.
func (e *Env) Warm(ctx context.Context, n int) error {
	if e.warm == nil {
		return nil
	}
	return e.warm(ctx, n)
}

// Peer opens a second store on the same storage, as another node would
// (Postgres only: its own pool, the same table and trip counter). It is
// closed with e.
func (e *Env) Peer(ctx context.Context) (runlease.Store, error) {
	if e.pg == nil {
		return nil, fmt.Errorf("benchkit: a %s store has no peer nodes", e.Kind)
	}
	s, _, closeFn, err := e.pg.peer(ctx)
	if err != nil {
		return nil, err
	}
	e.onClose(closeFn)
	return s, nil
}

// Close closes everything e opened, in reverse order.
func (e *Env) Close() error {
	var errs []error
	for i := len(e.closers) - 1; i >= 0; i-- {
		errs = append(errs, e.closers[i]())
	}
	e.closers = nil
	return errors.Join(errs...)
}

func (e *Env) onClose(fn func() error) { e.closers = append(e.closers, fn) }

// Open opens an Env of the given kind: for "sqlite" a fresh file in dir,
// for "postgres" a fresh table on the server at dsn.
func Open(ctx context.Context, kind, dir, dsn string) (*Env, error) {
	switch kind {
	case "sqlite":
		return OpenSQLite(ctx, dir)
	case "postgres":
		return OpenPostgres(ctx, dsn)
	}
	return nil, fmt.Errorf("benchkit: unknown store %q (want sqlite or postgres)", kind)
}
