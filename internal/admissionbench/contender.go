package main

import (
	"context"
	"time"
)

// A contender admits runs into one scope of a fixed number of units, the
// way one system (or the least SQL that does the job) lets a user do it.
type contender interface {
	name() string
	// admit queues worker w's claim of one unit and returns once it holds
	// it, with the function that gives it back. ahead ranks the claim
	// ahead of every claim made with ahead false (the backlog scenario's
	// probes, which are admitted while the backlog stays queued). queued,
	// when not nil, is called once the claim is in the queue (or was
	// admitted without queueing).
	admit(ctx context.Context, w int, ahead bool, queued func()) (release func(context.Context) error, err error)
	// trips returns the round trips made so far on the contender's
	// sockets (for SQLite: calls to the store).
	trips() int64
	tripUnit() string
	close() error
}

// A refuser times one claim that is refused because every unit is held
// (the backlog scenario's "claim" column).
type refuser interface {
	refusedClaim(ctx context.Context) (time.Duration, error)
}

// A readTimer reports the store reads made by waiters other than the
// probes (wake-ups and polls), since the last reset.
type readTimer interface {
	resetReads()
	reads() (durs []time.Duration, rows []int)
}

type ctxKey int

const (
	keyRole ctxKey = iota
	keyQueued
)

// roles tag contexts so that the store wrapper can tell the probes' calls
// and the harness's own from the backlog's.
const (
	roleWorker  = "worker"
	roleProbe   = "probe"
	roleHarness = "harness"
)

func withRole(ctx context.Context, role string) context.Context {
	return context.WithValue(ctx, keyRole, role)
}

func roleOf(ctx context.Context) string {
	r, _ := ctx.Value(keyRole).(string)
	return r
}
