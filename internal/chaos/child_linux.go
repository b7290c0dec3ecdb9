//go:build linux

package chaos

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/proctest"
)

// The monotonic reading inside a time.Time counts from this process's
// start; Mono counts from the machine's boot. Both are CLOCK_MONOTONIC, so
// one pair of readings taken together converts between them.
var (
	baseTime = time.Now()
	baseMono = history.Mono()
)

// MonoOf converts t, which must carry a monotonic reading (as time.Now and
// a keeper's TrustedUntil do), to the [history.Mono] clock. It returns 0
// for the zero time.
func MonoOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return baseMono + int64(t.Sub(baseTime))
}

// Errorf emits an error event.
func (e *Emitter) Errorf(format string, a ...any) {
	e.Emit(Event{Kind: KindErr, T0: history.Mono(), Msg: fmt.Sprintf(format, a...)})
}

// RunChild is the body of a chaos child: open the store with a pool of
// conns connections, print "ready", wait for the parent to release it, then
// run body and print an exit event. It returns the process's exit code.
func RunChild(conns int32, body func(*Run)) int {
	env, err := envFromOS()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), env.StopIn+2*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(os.Getenv(pgtest.EnvDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		return 2
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		return 2
	}
	defer pool.Close()
	store, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(env.Table), runlease.WithCreateTable(false))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		return 2
	}
	defer store.Close()
	fmt.Println("ready")
	proctest.WaitRelease()
	r := &Run{Env: env, Store: store, Pool: pool, Out: NewEmitter(os.Stdout), Ctx: ctx,
		StopAt: time.Now().Add(env.StopIn)}
	r.Out.Emit(Event{Kind: KindStart, T0: history.Mono()})
	body(r)
	r.Out.Emit(Event{Kind: KindExit, T0: history.Mono()})
	return 0
}
