package runleaseotel

import (
	"context"
	"errors"
	"strings"

	"github.com/areev/runlease"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Attribute keys.
const (
	// OutcomeKey is the outcome of an acquisition ("acquired", "refused",
	// "failed") or a renewal ("renewed", "lost", "failed").
	OutcomeKey = attribute.Key("runlease.outcome")
	// ErrorTypeKey is OpenTelemetry's error.type: the runlease error code
	// ("RUN-E011", …) of a failed attempt, or "_OTHER" for an error without
	// one. It is absent on success.
	ErrorTypeKey = attribute.Key("error.type")
	// ReasonKey is why a lease or slot was lost: "taken_over",
	// "row_changed", "released", "trust_expired", or "_OTHER".
	ReasonKey = attribute.Key("runlease.loss.reason")
	// ScopeKey is a slot scope's name, such as "mem" or "principal:alice",
	// bounded by [WithMaxScopes].
	ScopeKey = attribute.Key("runlease.scope")
	// LeaseStateKey is a lease row's state: "live", "expired", "released"
	// or "corrupt".
	LeaseStateKey = attribute.Key("runlease.lease.state")
	// SlotStateKey is a slot row's state: "held" or "corrupt".
	SlotStateKey = attribute.Key("runlease.slot.state")
	// RunIDKey is the run id, present only with [WithRunIDAttribute].
	RunIDKey = attribute.Key("runlease.run.id")
)

// other is OpenTelemetry's value for a value outside a known, bounded set.
const other = "_OTHER"

// Hooks returns the hooks that record m's event metrics. Pass them to
// [runlease.WithHooks] on Acquire, AcquireWait or ClaimSlots (a Keeper
// takes its lease's hooks unless given its own). runlease keeps one Hooks
// per call, so to keep hooks of your own as well, pass [Chain](m.Hooks(),
// yours). The hooks are quick and never block.
func (m *Metrics) Hooks() runlease.Hooks {
	return runlease.Hooks{
		Acquired:      m.acquired,
		Renewed:       m.renewed,
		Lost:          m.lost,
		SlotsLost:     m.slotsLostEvent,
		LimitMismatch: m.limitMismatch,
	}
}

// Chain returns hooks that call every field of each of hooks in turn, in
// the order given, skipping nil fields. A field nil in all of them is nil.
func Chain(hooks ...runlease.Hooks) runlease.Hooks {
	return runlease.Hooks{
		Acquired:      chain(hooks, func(h runlease.Hooks) func(runlease.AcquireEvent) { return h.Acquired }),
		Renewed:       chain(hooks, func(h runlease.Hooks) func(runlease.RenewEvent) { return h.Renewed }),
		Lost:          chain(hooks, func(h runlease.Hooks) func(runlease.LossEvent) { return h.Lost }),
		SlotsLost:     chain(hooks, func(h runlease.Hooks) func(runlease.SlotLossEvent) { return h.SlotsLost }),
		LimitMismatch: chain(hooks, func(h runlease.Hooks) func(runlease.LimitMismatchEvent) { return h.LimitMismatch }),
	}
}

// chain calls the field of each of hooks that field picks.
func chain[E any](hooks []runlease.Hooks, field func(runlease.Hooks) func(E)) func(E) {
	var fns []func(E)
	for _, h := range hooks {
		if f := field(h); f != nil {
			fns = append(fns, f)
		}
	}
	switch len(fns) {
	case 0:
		return nil
	case 1:
		return fns[0]
	}
	return func(e E) {
		for _, f := range fns {
			f(e)
		}
	}
}

// set builds the attribute set of one measurement: kvs, the run id when
// asked for, and the constant attributes.
func (m *Metrics) set(runID string, kvs ...attribute.KeyValue) metric.MeasurementOption {
	kvs = append(kvs, m.o.attrs...)
	if m.o.runID && runID != "" {
		kvs = append(kvs, RunIDKey.String(runID))
	}
	return metric.WithAttributeSet(attribute.NewSet(kvs...))
}

// attempt returns the attribute set of an attempt that ended with err:
// okSet (or outcome ok) on success, else the outcome classify names and
// the error type.
func (m *Metrics) attempt(runID string, err error, okSet metric.MeasurementOption, ok string,
	classify func(error) string) metric.MeasurementOption {
	switch {
	case err != nil:
		return m.set(runID, OutcomeKey.String(classify(err)), ErrorTypeKey.String(errorType(err)))
	case okSet != nil:
		return okSet
	}
	return m.set(runID, OutcomeKey.String(ok))
}

// errorType is err's runlease code, or "_OTHER".
func errorType(err error) string {
	if c := runlease.Code(err); c != "" {
		return c
	}
	return other
}

func (m *Metrics) acquired(e runlease.AcquireEvent) {
	set := m.attempt(e.RunID, e.Err, m.acquireOK, "acquired", func(err error) string {
		if errors.Is(err, runlease.ErrTakenOver) {
			return "refused" // a live lease of another holder
		}
		return "failed"
	})
	ctx := context.Background()
	m.acquireAttempts.Add(ctx, 1, set)
	m.acquireDuration.Record(ctx, e.Latency.Seconds(), set)
}

func (m *Metrics) renewed(e runlease.RenewEvent) {
	set := m.attempt(e.RunID, e.Err, m.renewOK, "renewed", func(err error) string {
		if errors.Is(err, runlease.ErrLeaseLost) {
			return "lost"
		}
		return "failed" // a fault, retried while the trust window lasts
	})
	plain := m.plain
	if plain == nil {
		plain = m.set(e.RunID)
	}
	ctx := context.Background()
	m.renewDuration.Record(ctx, e.Latency.Seconds(), set)
	m.renewTimeLeft.Record(ctx, e.TimeLeft.Seconds(), plain)
}

func (m *Metrics) lost(e runlease.LossEvent) {
	m.leasesLost.Add(context.Background(), 1, m.set(e.RunID, ReasonKey.String(lossReason(e.Err))))
}

func (m *Metrics) slotsLostEvent(e runlease.SlotLossEvent) {
	if e.Err == nil {
		return
	}
	reason := lossReason(e.Err)
	if e.Err.Cause == nil {
		reason = "taken_over" // as SlotLostError reads a missing cause
	}
	perScope := map[string]int64{}
	for _, key := range e.Err.Keys {
		perScope[m.scopes.name(scopeOfKey(key))]++
	}
	for scope, n := range perScope {
		m.slotsLost.Add(context.Background(), n, m.set(e.RunID, ScopeKey.String(scope), ReasonKey.String(reason)))
	}
}

func (m *Metrics) limitMismatch(e runlease.LimitMismatchEvent) {
	m.limitMismatches.Add(context.Background(), 1, m.set("", ScopeKey.String(m.scopes.name(e.Scope))))
}

// lossReason names the cause of a lost lease or slot.
func lossReason(err error) string {
	switch {
	case errors.Is(err, runlease.ErrTakenOver):
		return "taken_over"
	case errors.Is(err, runlease.ErrReleased):
		return "released"
	case errors.Is(err, runlease.ErrTrustExpired):
		return "trust_expired"
	case errors.Is(err, runlease.ErrRowChanged):
		return "row_changed"
	}
	return other
}

// scopeOfKey is the scope of a slot row's key, runslot:<scope>:<k>. A
// scope name may itself hold ':' (principal:alice), so the number is what
// follows the last one.
func scopeOfKey(key string) string {
	rest := strings.TrimPrefix(key, runlease.SlotPrefix)
	if i := strings.LastIndexByte(rest, ':'); i > 0 {
		return rest[:i]
	}
	return rest
}
