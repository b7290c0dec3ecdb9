package runlease_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// optFixture is what one call of the options table runs against: a store,
// a lease held on a run of its own with slots claimed through it, and a
// fresh run id for calls that acquire or claim.
type optFixture struct {
	s     *runlease.SQLiteStore
	lease *runlease.Lease
	slots *runlease.Slots
	info  runlease.LeaseInfo // the lease's row, read by Peek
	fresh string
}

// optScopes is a scope wide enough for every claim of the table.
var optScopes = []runlease.Scope{runlease.NamedScope("opts", 1000)}

// An optCase is one option of the package, with a valid value, and the
// name a refusal gives it.
type optCase struct {
	name string
	opt  func(f *optFixture) runlease.Option
}

var everyOption = []optCase{
	{"WithTTL", func(*optFixture) runlease.Option { return runlease.WithTTL(time.Minute) }},
	{"WithClock", func(*optFixture) runlease.Option { return runlease.WithClock(time.Now) }},
	{"WithWaitPoll", func(*optFixture) runlease.Option { return runlease.WithWaitPoll(time.Second) }},
	{"KeepInterval", func(*optFixture) runlease.Option { return runlease.KeepInterval(time.Second) }},
	{"KeepMargin", func(*optFixture) runlease.Option { return runlease.KeepMargin(time.Second) }},
	{"KeepSlots", func(f *optFixture) runlease.Option { return runlease.KeepSlots(f.slots) }},
	{"KeepSlotsStrict", func(f *optFixture) runlease.Option { return runlease.KeepSlotsStrict(f.slots) }},
	{"WithHooks", func(*optFixture) runlease.Option { return runlease.WithHooks(runlease.Hooks{}) }},
	{"WithLogger", func(*optFixture) runlease.Option { return runlease.WithLogger(slog.New(slog.DiscardHandler)) }},
	{"WithPriority", func(*optFixture) runlease.Option { return runlease.WithPriority(1) }},
	{"WithFairShare", func(*optFixture) runlease.Option { return runlease.WithFairShare("team", 2) }},
}

// refusedAs is the name a refusal gives an option: the two forms of
// KeepSlots are one option.
func refusedAs(opt string) string {
	if opt == "KeepSlotsStrict" {
		return "KeepSlots"
	}
	return opt
}

// An optCall is one call of the package that takes options, and the
// options its documentation says it takes.
type optCall struct {
	name  string
	takes []string
	call  func(ctx context.Context, f *optFixture, opts ...runlease.Option) error
}

var (
	takesAcquire = []string{"WithTTL", "WithClock", "WithHooks", "WithLogger"}
	takesClaim   = append(slices.Clip(takesAcquire), "WithPriority", "WithFairShare")
	takesKeep    = []string{"KeepInterval", "KeepMargin", "KeepSlots", "KeepSlotsStrict", "WithHooks", "WithLogger"}
	takesClock   = []string{"WithClock"}
)

// keepAndStop runs Keep and stops the keeper it made.
func keepAndStop(k *runlease.Keeper, err error) error {
	if k != nil {
		k.Stop()
	}
	return err
}

var everyOptionCall = []optCall{
	{"Acquire", takesAcquire, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.Acquire(ctx, f.s, f.fresh, "B", opts...)
		return err
	}},
	{"AcquireWait", append(slices.Clip(takesAcquire), "WithWaitPoll"), func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.AcquireWait(ctx, f.s, f.fresh, "B", opts...)
		return err
	}},
	{"ClaimSlots", takesClaim, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.ClaimSlots(ctx, f.s, f.fresh, optScopes, opts...)
		return err
	}},
	{"ClaimSlotsWait", append(slices.Clip(takesClaim), "WithWaitPoll"), func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.ClaimSlotsWait(ctx, f.s, f.fresh, optScopes, opts...)
		return err
	}},
	{"Lease.ClaimSlots", []string{"WithPriority", "WithFairShare"}, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := f.lease.ClaimSlots(ctx, []runlease.Scope{runlease.NamedScope("more", 1000)}, opts...)
		return err
	}},
	{"Lease.ClaimSlotsWait", []string{"WithPriority", "WithFairShare", "WithWaitPoll"}, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := f.lease.ClaimSlotsWait(ctx, []runlease.Scope{runlease.NamedScope("more", 1000)}, opts...)
		return err
	}},
	{"Keep", takesKeep, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		return keepAndStop(runlease.Keep(ctx, f.lease, opts...))
	}},
	{"Renewer.Keep", takesKeep, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		r := &runlease.Renewer{}
		defer r.Close()
		return keepAndStop(r.Keep(ctx, f.lease, opts...))
	}},
	{"Peek", takesClock, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.Peek(ctx, f.s, f.lease.RunID(), opts...)
		return err
	}},
	{"Leases", takesClock, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.Leases(ctx, f.s, opts...)
		return err
	}},
	{"Occupancy", takesClock, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.Occupancy(ctx, f.s, opts...)
		return err
	}},
	{"Queues", takesClock, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.Queues(ctx, f.s, opts...)
		return err
	}},
	{"ExplainSlots", []string{"WithClock", "WithPriority", "WithFairShare"}, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.ExplainSlots(ctx, f.s, f.fresh, optScopes, opts...)
		return err
	}},
	{"ForceRelease", takesClock, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		return runlease.ForceRelease(ctx, f.s, f.info, opts...)
	}},
	{"ForceReleaseOutcome", takesClock, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.ForceReleaseOutcome(ctx, f.s, f.info, opts...)
		return err
	}},
	{"Prune", takesClock, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.Prune(ctx, f.s, time.Hour, opts...)
		return err
	}},
	{"PruneCandidates", takesClock, func(ctx context.Context, f *optFixture, opts ...runlease.Option) error {
		_, err := runlease.PruneCandidates(ctx, f.s, time.Hour, opts...)
		return err
	}},
}

// TestEveryCallAppliesOrRefusesEveryOption runs every call that takes
// options with every option: a call takes exactly the options it
// documents, and refuses every other with RUN-E001, naming the call (a
// Renewer's Keep is Keep) and the option, before anything is written,
// rather than ignore it.
func TestEveryCallAppliesOrRefusesEveryOption(t *testing.T) {
	t.Parallel()
	for _, c := range everyOptionCall {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			s := newSQLite(t)
			for i, o := range everyOption {
				f := &optFixture{s: s, fresh: fmt.Sprintf("fresh-%d", i)}
				var err error
				f.lease, err = runlease.Acquire(ctx, s, fmt.Sprintf("held-%d", i), "A")
				require.NoError(t, err)
				f.slots, err = f.lease.ClaimSlots(ctx, optScopes)
				require.NoError(t, err)
				f.info, err = runlease.Peek(ctx, s, f.lease.RunID())
				require.NoError(t, err)
				before := rows(t, s)

				err = c.call(ctx, f, o.opt(f))
				if slices.Contains(c.takes, o.name) {
					assert.NoError(t, err, "%s takes %s", c.name, o.name)
					continue
				}
				require.ErrorIs(t, err, runlease.ErrInvalidArgument, "%s must refuse %s, not ignore it", c.name, o.name)
				assert.Equal(t, runlease.CodeInvalidArgument, runlease.Code(err))
				assert.Contains(t, err.Error(), strings.TrimPrefix(c.name, "Renewer.")+" does not take "+refusedAs(o.name))
				assert.Equal(t, before, rows(t, s), "%s refused %s after writing", c.name, o.name)
			}
		})
	}
}

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

func (h logTo) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h logTo) WithGroup(string) slog.Handler { return h }

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
