package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease/internal/benchkit"
)

// dbosContender admits through a DBOS Transact v1.9.0 queue whose worker
// and global concurrency are the limit: a claim is a workflow enqueued on
// it, admitted when its body starts; the body holds until the harness
// releases it. Its system database is a fresh schema of the server.
type dbosContender struct {
	label  string
	pool   *pgxpool.Pool
	trip   *benchkit.TripCounter
	schema string
	ctx    dbos.Context
	queue  dbos.Queue
	seq    atomic.Int64
	stop   chan struct{}

	mu   sync.Mutex
	jobs map[string]*dbosJob
}

type dbosJob struct {
	started chan struct{} // receives once the body runs
	release chan struct{} // closed to let the body return
}

func newDBOS(ctx context.Context, dsn string, limit int, poll time.Duration, label string) (*dbosContender, error) {
	c := &dbosContender{label: label, trip: &benchkit.TripCounter{}, jobs: map[string]*dbosJob{}, stop: make(chan struct{})}
	pool, err := benchkit.OpenCountedPool(ctx, dsn, 0, c.trip)
	if err != nil {
		return nil, err
	}
	c.pool = pool
	c.schema = "admissionbench_dbos_" + randHex()
	dctx, err := dbos.NewContext(ctx, dbos.Config{
		AppName:        "admissionbench",
		SystemDBPool:   pool,
		DatabaseSchema: c.schema,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		c.dropSchema()
		pool.Close()
		return nil, err
	}
	c.ctx = dctx
	dbos.RegisterWorkflow(dctx, c.hold, dbos.WithWorkflowName("admissionbench-hold"))
	opts := []dbos.QueueOption{dbos.WithWorkerConcurrency(limit), dbos.WithGlobalConcurrency(limit)}
	if poll > 0 {
		opts = append(opts, dbos.WithQueueBasePollingInterval(poll))
	}
	q, err := dbos.RegisterQueue(dctx, "admissionbench", opts...)
	if err != nil {
		c.close()
		return nil, err
	}
	c.queue = q
	if err := dbos.Launch(dctx); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// hold is the workflow: it tells its claimant it runs, and holds its unit
// of the queue's concurrency until released.
func (c *dbosContender) hold(ctx dbos.Context, id string) (int, error) {
	c.mu.Lock()
	j := c.jobs[id]
	c.mu.Unlock()
	if j == nil {
		return 0, nil
	}
	j.started <- struct{}{}
	select {
	case <-j.release:
	case <-c.stop:
	}
	return 0, nil
}

func (c *dbosContender) name() string     { return c.label }
func (c *dbosContender) trips() int64     { return c.trip.Load() }
func (c *dbosContender) tripUnit() string { return "round trips" }

func (c *dbosContender) admit(ctx context.Context, w int, ahead bool, queued func()) (func(context.Context) error, error) {
	id := fmt.Sprintf("w%d-%d", w, c.seq.Add(1))
	j := &dbosJob{started: make(chan struct{}, 1), release: make(chan struct{})}
	c.mu.Lock()
	c.jobs[id] = j
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.jobs, id)
		c.mu.Unlock()
	}
	// Lower numbers go first; the probes rank ahead of the backlog.
	prio := uint(2)
	if ahead {
		prio = 1
	}
	_, err := dbos.RunWorkflow(c.ctx, c.hold, id, dbos.WithQueue(c.queue), dbos.WithWorkflowID(id), dbos.WithPriority(prio))
	if err != nil {
		close(j.release)
		forget()
		return nil, err
	}
	if queued != nil {
		queued()
	}
	select {
	case <-j.started:
	case <-ctx.Done():
		close(j.release)
		forget()
		return nil, ctx.Err()
	}
	return func(context.Context) error {
		close(j.release)
		forget()
		return nil
	}, nil
}

func (c *dbosContender) dropSchema() error {
	return drop(c.pool, "DROP SCHEMA IF EXISTS "+pgx.Identifier{c.schema}.Sanitize()+" CASCADE")
}

func (c *dbosContender) close() error {
	close(c.stop)
	var err error
	if c.ctx != nil {
		err = dbos.Shutdown(c.ctx, 10*time.Second)
	}
	err = errors.Join(err, c.dropSchema())
	c.pool.Close()
	return err
}
