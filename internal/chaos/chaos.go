// Package chaos runs runlease's fault-injection tests across real processes.
// Children (the test binary again, in a role: internal/proctest) drive
// leases and slots on a shared store (a Postgres table, an etcd key prefix:
// each test passes an [Opener]) and stream every event they see to the
// parent as JSON lines, stamped with the machine's CLOCK_MONOTONIC
// ([history.Mono]), which every process reads alike. The
// parent pauses them (SIGSTOP, then SIGCONT) and kills them (SIGKILL, then a
// replacement) at random with an [Injector], and afterwards checks the
// histories with pure functions ([CheckFences], [CheckTrust],
// [CheckCheckpoints], [CheckDownstream], [CheckSlots]) whose ability to
// fail is tested on hand-made histories. The lease test itself,
// [LeaseTest], is shared by every store: only the opener, the downstream
// [Sink] and the reading of its final state differ.
//
// Every check is built to be sound: a violation it reports is a real one,
// whatever the timing. That is why events carry both ends of every call
// (a store call takes effect at one unknown instant inside it) and why the
// end of a holder's trust is recorded conservatively; each check's doc says
// how.
package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/areev/runlease"
)

// Event kinds a child prints.
const (
	KindStart   = "start"   // the child began driving (T0)
	KindGrant   = "grant"   // Acquire was called at T0 and returned at T1
	KindEnd     = "end"     // the holder stopped trusting at T0: loss seen or release begun
	KindCkpt    = "ckpt"    // a checkpoint write ran over [T0, T1] with result Res
	KindDown    = "down"    // a downstream write ran over [T0, T1] with result Res
	KindClaim   = "claim"   // ClaimSlots returned a slot (Key) at T1; the lease was acquired from T0
	KindErr     = "err"     // something no fault explains went wrong (Msg)
	KindRefused = "refused" // a slot competitor stopped; N counts its refused claims
	KindExit    = "exit"    // the child finished
)

// Results of a write.
const (
	ResOK      = "ok"      // applied
	ResLost    = "lost"    // refused by runlease: the lease was lost (RUN-E021)
	ResRefused = "refused" // refused by the downstream fence condition
	ResUnknown = "unknown" // failed; it may or may not have been applied
)

// Event is one line a child prints. Times are [history.Mono] nanoseconds.
type Event struct {
	Kind   string `json:"k"`
	Run    string `json:"run,omitempty"`
	Holder string `json:"h,omitempty"`
	Fence  uint64 `json:"f,omitempty"`
	Seq    int    `json:"seq,omitempty"`
	Key    string `json:"key,omitempty"`
	T0     int64  `json:"t0,omitempty"`
	T1     int64  `json:"t1,omitempty"`
	// Trust is the keeper's TrustedUntil at the time of the event, on the
	// Mono clock; 0 when the holder does not consult it.
	Trust int64 `json:"trust,omitempty"`
	// Cap ends a slot holder's belief early: the keeper's TrustedUntil as
	// it was before a renewal that failed to renew the slot (0: none).
	Cap int64  `json:"cap,omitempty"`
	Res string `json:"res,omitempty"`
	Msg string `json:"msg,omitempty"`
	N   int    `json:"n,omitempty"`
	// Keys are the slot rows of an admission or a release; Principal and
	// Scopes describe a queue competitor's wait.
	Keys      []string `json:"keys,omitempty"`
	Principal string   `json:"p,omitempty"`
	Scopes    []string `json:"scopes,omitempty"`

	// Which child printed the line, set by [Parse].
	Slot int `json:"-"`
	Gen  int `json:"-"`
}

// Emitter prints events as JSON lines, one write each, so that a line is
// either wholly in the pipe or not at all when the child is killed. It is
// safe for concurrent use.
type Emitter struct {
	mu sync.Mutex
	w  io.Writer
}

// NewEmitter returns an Emitter on w.
func NewEmitter(w io.Writer) *Emitter { return &Emitter{w: w} }

// Emit prints ev. A failed write is dropped: the parent is gone.
func (e *Emitter) Emit(ev Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(append(b, '\n'))
}

// Parse decodes the lines one child printed, skipping its "ready" line.
// A child that was killed may not have printed its last line in full
// (pipe writes of a line are atomic, so this is a safeguard): with killed
// set, an undecodable last line is dropped rather than reported.
func Parse(lines []string, slot, gen int, killed bool) ([]Event, error) {
	var out []Event
	for i, l := range lines {
		if l == "ready" {
			continue
		}
		var ev Event
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			if killed && i == len(lines)-1 {
				break
			}
			return nil, fmt.Errorf("child slot %d gen %d printed %q: %v", slot, gen, l, err)
		}
		ev.Slot, ev.Gen = slot, gen
		out = append(out, ev)
	}
	return out, nil
}

// Environment variables that configure a child.
const (
	EnvTable  = "RUNLEASE_CHAOS_TABLE"      // where every process's store keeps its rows: a table, a key prefix
	EnvDown   = "RUNLEASE_CHAOS_DOWNSTREAM" // the downstream (Sink) of the lease test: a table, a key prefix
	EnvSlot   = "RUNLEASE_CHAOS_SLOT"       // which child slot this process fills, from 0
	EnvGen    = "RUNLEASE_CHAOS_GEN"        // a number no other child of the test has
	EnvStopIn = "RUNLEASE_CHAOS_STOP_IN"    // how long to drive after being released
	// EnvBreak makes the tests run a deliberately broken holder and expect
	// the checks to catch it; see the Break constants.
	EnvBreak = "RUNLEASE_CHAOS_BREAK"
)

// Env is a child's configuration.
type Env struct {
	Table, Down string
	Slot, Gen   int
	StopIn      time.Duration
	// Extra are NAME=value pairs that the store's [Opener] reads itself
	// (such as the etcd endpoints), passed on as they are. A child does
	// not read them back into its Env.
	Extra []string
}

// Environ returns e as NAME=value pairs for proctest.Start.
func (e Env) Environ() []string {
	return append([]string{EnvTable + "=" + e.Table, EnvDown + "=" + e.Down,
		EnvSlot + "=" + strconv.Itoa(e.Slot), EnvGen + "=" + strconv.Itoa(e.Gen),
		EnvStopIn + "=" + e.StopIn.String()}, e.Extra...)
}

func envFromOS() (Env, error) {
	e := Env{Table: os.Getenv(EnvTable), Down: os.Getenv(EnvDown)}
	var err1, err2, err3 error
	e.Slot, err1 = strconv.Atoi(os.Getenv(EnvSlot))
	e.Gen, err2 = strconv.Atoi(os.Getenv(EnvGen))
	e.StopIn, err3 = time.ParseDuration(os.Getenv(EnvStopIn))
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return e, err
		}
	}
	return e, nil
}

// Run is what a child's body works with.
type Run struct {
	Env
	Store runlease.Store
	Down  Sink // the lease test's downstream; nil for a test with none
	Out   *Emitter
	// StopAt is when to stop starting work; Ctx ends well after it and
	// bounds every call, so that a child can never hang.
	StopAt time.Time
	Ctx    context.Context
}

// Sleep waits for d or the end of ctx, and reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Reason names why a holder stopped, for end events: "release" when it
// chose to, else the keeper's reason.
func Reason(err error) string {
	reasons := []struct {
		err  error
		name string
	}{
		{runlease.ErrTakenOver, "taken-over"},
		{runlease.ErrReleased, "released"},
		{runlease.ErrRowChanged, "row-changed"},
		{runlease.ErrTrustExpired, "trust-expired"},
		{runlease.ErrKeeperStopped, "stopped"},
	}
	if err == nil {
		return "release"
	}
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "error " + runlease.Code(err)
}
