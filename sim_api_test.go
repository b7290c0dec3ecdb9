package runlease_test

// This file is the simulation's only contact with the parts of the API
// that may change: option names, constructor signatures, hook shapes. The
// harness in internal/sim drives the library through sim.API alone.

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/sim"
)

// simAPI implements sim.API with the real library.
type simAPI struct{}

func (simAPI) Acquire(ctx context.Context, s runlease.Store, runID, holder string, ttl time.Duration) (sim.Lease, error) {
	l, err := runlease.Acquire(ctx, s, runID, holder, runlease.WithTTL(ttl))
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (simAPI) AcquireWait(ctx context.Context, s runlease.Store, runID, holder string, ttl, poll time.Duration) (sim.Lease, error) {
	l, err := runlease.AcquireWait(ctx, s, runID, holder, runlease.WithTTL(ttl), runlease.WithWaitPoll(poll))
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (simAPI) ClaimSlots(ctx context.Context, s runlease.Store, runID string, specs []sim.ScopeSpec, ttl time.Duration) (sim.Slots, error) {
	sl, err := runlease.ClaimSlots(ctx, s, runID, simScopes(specs), runlease.WithTTL(ttl))
	if err != nil {
		return nil, err
	}
	return simSlots{sl}, nil
}

func (simAPI) ClaimSlotsWait(ctx context.Context, s runlease.Store, l sim.Lease, runID string, specs []sim.ScopeSpec, w sim.WaitSpec) (sim.Slots, error) {
	opts := []runlease.Option{runlease.WithPriority(w.Priority), runlease.WithWaitPoll(w.Poll)}
	if w.Weight != 0 {
		opts = append(opts, runlease.WithFairShare(w.Principal, w.Weight))
	}
	var sl *runlease.Slots
	var err error
	if l != nil {
		sl, err = l.(*runlease.Lease).ClaimSlotsWait(ctx, simScopes(specs), opts...)
	} else {
		sl, err = runlease.ClaimSlotsWait(ctx, s, runID, simScopes(specs), append(opts, runlease.WithTTL(w.TTL))...)
	}
	if err != nil {
		return nil, err
	}
	return simSlots{sl}, nil
}

// simScopes turns the harness's scope specs into scopes, taken for their
// units when a spec names them.
func simScopes(specs []sim.ScopeSpec) []runlease.Scope {
	scopes := make([]runlease.Scope, len(specs))
	for i, sc := range specs {
		if p, ok := strings.CutPrefix(sc.Name, "principal:"); ok {
			scopes[i] = runlease.PrincipalScope(p, sc.Limit)
		} else {
			scopes[i] = runlease.NamedScope(sc.Name, sc.Limit)
		}
		if sc.Units > 0 {
			scopes[i] = scopes[i].Take(sc.Units)
		}
	}
	return scopes
}

func (simAPI) Prune(ctx context.Context, s runlease.Store, olderThan time.Duration) ([]string, error) {
	p, err := runlease.Prune(ctx, s, olderThan)
	return p.Leases, err
}

func (simAPI) NewRenewer() sim.Renewer { return &runlease.Renewer{} }

func (simAPI) Keep(ctx context.Context, r sim.Renewer, l sim.Lease, spec sim.KeepSpec) (sim.Keeper, error) {
	hooks := runlease.Hooks{
		Lost: func(ev runlease.LossEvent) { spec.Lost(ev.Err) },
		SlotsLost: func(ev runlease.SlotLossEvent) {
			spec.SlotsLost(ev.Err.RunID, ev.Err.Keys, ev.Err)
		},
	}
	if spec.Renewed != nil {
		hooks.Renewed = func(ev runlease.RenewEvent) { spec.Renewed(ev.Err) }
	}
	opts := []runlease.Option{runlease.WithHooks(hooks)}
	switch {
	case spec.Slots != nil && spec.Strict:
		opts = append(opts, runlease.KeepSlotsStrict(spec.Slots.(simSlots).s))
	case spec.Slots != nil:
		opts = append(opts, runlease.KeepSlots(spec.Slots.(simSlots).s))
	}
	if spec.TTL != 0 {
		opts = append(opts, runlease.WithTTL(spec.TTL))
	}
	lease := l.(*runlease.Lease)
	var k *runlease.Keeper
	var err error
	if r == nil {
		k, err = runlease.Keep(ctx, lease, opts...)
	} else {
		k, err = r.(*runlease.Renewer).Keep(ctx, lease, opts...)
	}
	if err != nil {
		return nil, err
	}
	return k, nil
}

func (simAPI) IsKeeperStopped(err error) bool { return errors.Is(err, runlease.ErrKeeperStopped) }

func (simAPI) SetJitter(draw func(n int64) int64) { runlease.SetJitterDraw(draw) }

// simSlots adapts *runlease.Slots to sim.Slots.
type simSlots struct{ s *runlease.Slots }

func (s simSlots) RunID() string                     { return s.s.RunID() }
func (s simSlots) Renew(ctx context.Context) error   { return s.s.Renew(ctx) }
func (s simSlots) Release(ctx context.Context) error { return s.s.Release(ctx) }
func (s simSlots) TrustedUntil() time.Time           { return s.s.TrustedUntil() }

func (s simSlots) Held() []sim.HeldSlot {
	var out []sim.HeldSlot
	for _, h := range s.s.Held() {
		out = append(out, sim.HeldSlot{Scope: h.Scope, Key: h.Key, Until: h.Until})
	}
	return out
}
