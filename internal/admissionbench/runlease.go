package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/benchkit"
)

// runleaseContender admits through runlease.ClaimSlotsWait on one scope,
// and gives the unit back with Slots.Release: only the library's public
// API, so that the harness measures whatever the queue's implementation.
type runleaseContender struct {
	kind   string // "postgres" or "sqlite"
	raw    runlease.ClosableStore
	store  runlease.Store
	scope  runlease.Scope
	w      *watch
	ptrips *benchkit.TripCounter
	pool   *pgxpool.Pool
	table  string
	dir    string
	seq    atomic.Int64
	// principals spreads the backlog's waiters over this many fair-share
	// principals, and workerPrincipals the contention scenario's (0: they
	// name none).
	principals       int
	workerPrincipals int
	// poll is the waiters' WithWaitPoll (0: the library's default).
	poll time.Duration
}

const scopeName = "admissionbench"

func randHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newRunleasePostgres(ctx context.Context, dsn string, limit int) (*runleaseContender, error) {
	return openRunleasePostgresTable(ctx, dsn, limit, "admissionbench_"+randHex())
}

// openRunleasePostgresTable opens the store of table, made if missing: a
// fresh one for a measurement, or the measured one for a child queueing
// part of its backlog.
func openRunleasePostgresTable(ctx context.Context, dsn string, limit int, table string) (*runleaseContender, error) {
	c := &runleaseContender{kind: "postgres", w: &watch{}, ptrips: &benchkit.TripCounter{}, principals: 16,
		scope: runlease.NamedScope(scopeName, limit)}
	pool, err := benchkit.OpenCountedPool(ctx, dsn, 0, c.ptrips)
	if err != nil {
		return nil, err
	}
	c.pool = pool
	c.table = table
	s, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(c.table))
	if err != nil {
		pool.Close()
		return nil, err
	}
	c.raw = s
	c.store = wrapStore(s, c.w)
	return c, nil
}

func newRunleaseSQLite(limit int) (*runleaseContender, error) {
	dir, err := os.MkdirTemp("", "admissionbench-")
	if err != nil {
		return nil, err
	}
	s, err := runlease.OpenSQLite(filepath.Join(dir, "runlease.db"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &runleaseContender{kind: "sqlite", raw: s, w: &watch{}, dir: dir, principals: 16,
		scope: runlease.NamedScope(scopeName, limit)}
	c.store = wrapStore(s, c.w)
	return c, nil
}

func (c *runleaseContender) name() string { return "runlease-" + c.kind }

func (c *runleaseContender) trips() int64 {
	if c.ptrips != nil {
		return c.ptrips.Load()
	}
	return c.w.calls.Load()
}

func (c *runleaseContender) tripUnit() string {
	if c.ptrips != nil {
		return "round trips"
	}
	return "store calls"
}

func (c *runleaseContender) admit(ctx context.Context, w int, ahead bool, queued func()) (func(context.Context) error, error) {
	opts := []runlease.Option{}
	role := roleOf(ctx)
	switch {
	case ahead:
		opts = append(opts, runlease.WithPriority(1), runlease.WithFairShare(fmt.Sprintf("probe%d", w), 1))
		role = roleProbe
	case role == roleWorker:
		if c.workerPrincipals > 0 {
			opts = append(opts, runlease.WithFairShare(fmt.Sprintf("p%d", w%c.workerPrincipals), 1))
		}
	default:
		// The backlog: several principals, so that the queue is not one
		// principal's line.
		opts = append(opts, runlease.WithFairShare(fmt.Sprintf("p%d", w%c.principals), 1))
	}
	if c.poll > 0 {
		opts = append(opts, runlease.WithWaitPoll(c.poll))
	}
	if role != "" {
		ctx = withRole(ctx, role)
	}
	if queued != nil {
		ctx = context.WithValue(ctx, keyQueued, queued)
	}
	run := fmt.Sprintf("w%d-%d", w, c.seq.Add(1))
	slots, err := runlease.ClaimSlotsWait(ctx, c.store, run, []runlease.Scope{c.scope}, opts...)
	if err != nil {
		return nil, err
	}
	return slots.Release, nil
}

func (c *runleaseContender) refusedClaim(ctx context.Context) (time.Duration, error) {
	ctx = withRole(ctx, roleHarness)
	run := fmt.Sprintf("refused-%d", c.seq.Add(1))
	t := time.Now()
	s, err := runlease.ClaimSlots(ctx, c.store, run, []runlease.Scope{c.scope}, runlease.WithFairShare("harness", 1))
	d := time.Since(t)
	if err == nil {
		_ = s.Release(ctx)
		return d, errors.New("a plain claim was admitted while every unit was held")
	}
	if !errors.Is(err, runlease.ErrConcurrencyLimit) {
		return d, err
	}
	return d, nil
}

// queueLen counts the scope's live waiters, as runlease.Queues lists them.
func (c *runleaseContender) queueLen(ctx context.Context) (int, error) {
	ws, err := runlease.Queues(withRole(ctx, roleHarness), c.store)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, w := range ws {
		if w.Scope == scopeName {
			n++
		}
	}
	return n, nil
}

func (c *runleaseContender) resetReads() { c.w.resetReads() }

func (c *runleaseContender) reads() ([]time.Duration, []int) { return c.w.reads() }

func (c *runleaseContender) close() error {
	err := c.raw.Close()
	if c.pool != nil {
		derr := drop(c.pool, "DROP TABLE IF EXISTS "+pgx.Identifier{c.table}.Sanitize())
		c.pool.Close()
		err = errors.Join(err, derr)
	}
	if c.dir != "" {
		err = errors.Join(err, os.RemoveAll(c.dir))
	}
	return err
}
