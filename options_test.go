package runlease_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
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
