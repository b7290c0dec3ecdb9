package runlease_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// observed records what the hooks and the logger of a call were told.
type observed struct {
	mu    sync.Mutex
	hooks []string // the hooks called, by field name
	logs  []string // the messages logged
}

func (o *observed) saw(hook string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.hooks = append(o.hooks, hook)
}

// options returns WithHooks and WithLogger reporting to o.
func (o *observed) options() []runlease.Option {
	return []runlease.Option{
		runlease.WithHooks(runlease.Hooks{
			Acquired:      func(runlease.AcquireEvent) { o.saw("Acquired") },
			Renewed:       func(runlease.RenewEvent) { o.saw("Renewed") },
			Lost:          func(runlease.LossEvent) { o.saw("Lost") },
			SlotsLost:     func(runlease.SlotLossEvent) { o.saw("SlotsLost") },
			LimitMismatch: func(runlease.LimitMismatchEvent) { o.saw("LimitMismatch") },
			SlotsRequeued: func(runlease.RequeueEvent) { o.saw("SlotsRequeued") },
		}),
		runlease.WithLogger(slog.New(logTo{o})),
	}
}

func (o *observed) report() (hooks, logs []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.hooks...), append([]string(nil), o.logs...)
}

// logTo is a slog handler that records each message in an observed.
type logTo struct{ o *observed }

func (h logTo) Enabled(context.Context, slog.Level) bool { return true }
func (h logTo) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h logTo) WithGroup(string) slog.Handler            { return h }
func (h logTo) Handle(_ context.Context, r slog.Record) error {
	h.o.mu.Lock()
	defer h.o.mu.Unlock()
	h.o.logs = append(h.o.logs, r.Message)
	return nil
}

// aboveLimit leaves one live slot of scope "lim" numbered 2, above the
// limit of 2 the calls of the test claim with.
func aboveLimit(t *testing.T, s runlease.Store) []runlease.Scope {
	t.Helper()
	var held []*runlease.Slots
	for _, run := range []string{"h0", "h1", "h2"} {
		sl, err := runlease.ClaimSlots(t.Context(), s, run, []runlease.Scope{runlease.NamedScope("lim", 3)})
		require.NoError(t, err)
		held = append(held, sl)
	}
	for _, sl := range held[:2] {
		require.NoError(t, sl.Release(t.Context()))
	}
	return []runlease.Scope{runlease.NamedScope("lim", 2)}
}

// loseKept keeps lease, with opts, force-releases it as an operator would,
// and waits for the keeper to find the loss at its next renewal.
func loseKept(t *testing.T, s runlease.Store, lease *runlease.Lease, keep func(*runlease.Lease, ...runlease.Option) (*runlease.Keeper, error), opts ...runlease.Option) {
	t.Helper()
	k, err := keep(lease, append(opts, runlease.KeepInterval(time.Second))...)
	require.NoError(t, err)
	defer k.Stop()
	info, err := runlease.Peek(t.Context(), s, lease.RunID())
	require.NoError(t, err)
	require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
	<-k.Done()
	require.ErrorIs(t, k.Err(), runlease.ErrReleased)
}

// TestHooksAndLoggerReachEveryCallThatTakesThem gives WithHooks and
// WithLogger to every call that takes them, makes the call meet an event
// it reports, and checks that both were told: the calls that take them
// apply them (the others refuse them, TestEveryCallAppliesOrRefusesEveryOption).
// A claim through a lease reports to the hooks the lease was acquired with.
func TestHooksAndLoggerReachEveryCallThatTakesThem(t *testing.T) {
	t.Parallel()
	keep := func(t *testing.T) func(*runlease.Lease, ...runlease.Option) (*runlease.Keeper, error) {
		return func(l *runlease.Lease, opts ...runlease.Option) (*runlease.Keeper, error) {
			return runlease.Keep(t.Context(), l, opts...)
		}
	}
	for _, tc := range []struct {
		name      string
		run       func(t *testing.T, s runlease.Store, o *observed)
		wantHooks []string
		wantLog   string
	}{
		{"Acquire_and_the_keeper_of_its_lease", func(t *testing.T, s runlease.Store, o *observed) {
			l, err := runlease.Acquire(t.Context(), s, "r", "A", o.options()...)
			require.NoError(t, err)
			loseKept(t, s, l, keep(t))
		}, []string{"Acquired", "Lost"}, "runlease: lease lost; stop advancing the run"},
		{"AcquireWait_and_the_keeper_of_its_lease", func(t *testing.T, s runlease.Store, o *observed) {
			l, err := runlease.AcquireWait(t.Context(), s, "r", "A", o.options()...)
			require.NoError(t, err)
			loseKept(t, s, l, keep(t))
		}, []string{"Acquired", "Lost"}, "runlease: lease lost; stop advancing the run"},
		{"Keep", func(t *testing.T, s runlease.Store, o *observed) {
			l, err := runlease.Acquire(t.Context(), s, "r", "A")
			require.NoError(t, err)
			loseKept(t, s, l, keep(t), o.options()...)
		}, []string{"Lost"}, "runlease: lease lost; stop advancing the run"},
		{"Renewer.Keep", func(t *testing.T, s runlease.Store, o *observed) {
			l, err := runlease.Acquire(t.Context(), s, "r", "A")
			require.NoError(t, err)
			r := &runlease.Renewer{}
			defer r.Close()
			loseKept(t, s, l, func(l *runlease.Lease, opts ...runlease.Option) (*runlease.Keeper, error) {
				return r.Keep(t.Context(), l, opts...)
			}, o.options()...)
		}, []string{"Lost"}, "runlease: lease lost; stop advancing the run"},
		{"ClaimSlots", func(t *testing.T, s runlease.Store, o *observed) {
			_, err := runlease.ClaimSlots(t.Context(), s, "r", aboveLimit(t, s), o.options()...)
			require.NoError(t, err)
		}, []string{"LimitMismatch"}, "runlease: live slots at or above this host's limit; hosts disagree on the limit"},
		{"ClaimSlotsWait", func(t *testing.T, s runlease.Store, o *observed) {
			_, err := runlease.ClaimSlotsWait(t.Context(), s, "r", aboveLimit(t, s), o.options()...)
			require.NoError(t, err)
		}, []string{"LimitMismatch"}, "runlease: live slots at or above this host's limit; hosts disagree on the limit"},
		{"Lease.ClaimSlots_with_the_leases_own", func(t *testing.T, s runlease.Store, o *observed) {
			l, err := runlease.Acquire(t.Context(), s, "r", "A", o.options()...)
			require.NoError(t, err)
			_, err = l.ClaimSlots(t.Context(), aboveLimit(t, s))
			require.NoError(t, err)
		}, []string{"Acquired", "LimitMismatch"}, "runlease: live slots at or above this host's limit; hosts disagree on the limit"},
		{"Lease.ClaimSlotsWait_with_the_leases_own", func(t *testing.T, s runlease.Store, o *observed) {
			l, err := runlease.Acquire(t.Context(), s, "r", "A", o.options()...)
			require.NoError(t, err)
			_, err = l.ClaimSlotsWait(t.Context(), aboveLimit(t, s))
			require.NoError(t, err)
		}, []string{"Acquired", "LimitMismatch"}, "runlease: live slots at or above this host's limit; hosts disagree on the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				o := &observed{}
				tc.run(t, bubbleStore(t), o)
				hooks, logs := o.report()
				for _, h := range tc.wantHooks {
					assert.Contains(t, hooks, h)
				}
				assert.Contains(t, logs, tc.wantLog)
			})
		})
	}
}
