//go:build linux

package chaos

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/history"
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

// Backend is what an [Opener] opened for a child.
type Backend struct {
	Store runlease.Store
	Down  Sink   // nil for a test that writes nothing downstream
	Close func() // releases Store and Down; nil when there is nothing to release
}

// Opener opens a child's store (and sink) from its Env and from the
// variables the parent passed in Env.Extra. ctx is the child's own, which
// ends well after its stop time: fine for the opening, and for anything
// that lives as long as the child.
type Opener func(ctx context.Context, env Env) (Backend, error)

// RunChild is the body of a chaos child: open the store with open, print
// "ready", wait for the parent to release it, then run body and print an
// exit event. It returns the process's exit code: 2 when the child could
// not be configured or the store not opened.
func RunChild(open Opener, body func(*Run)) int {
	env, err := envFromOS()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), env.StopIn+2*time.Minute)
	defer cancel()
	be, err := open(ctx, env)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		return 2
	}
	if be.Close != nil {
		defer be.Close()
	}
	fmt.Println("ready")
	proctest.WaitRelease()
	r := &Run{Env: env, Store: be.Store, Down: be.Down, Out: NewEmitter(os.Stdout), Ctx: ctx,
		StopAt: time.Now().Add(env.StopIn)}
	r.Out.Emit(Event{Kind: KindStart, T0: history.Mono()})
	body(r)
	r.Out.Emit(Event{Kind: KindExit, T0: history.Mono()})
	return 0
}
