package runleaseotel

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/areev/runlease"
	"go.opentelemetry.io/otel/metric"
)

// Lease states, the values of runlease.lease.state, in the order counted.
var leaseStates = [...]string{"live", "expired", "released", "corrupt"}

// storeGauges reads the store at collection time for the observable
// instruments.
type storeGauges struct {
	m          *Metrics
	leaseCount metric.Int64ObservableUpDownCounter
	slotCount  metric.Int64ObservableUpDownCounter
	slotMax    metric.Int64ObservableUpDownCounter
	reg        metric.Registration
	closeOnce  sync.Once
	closeErr   error

	// token is held by the one scan in flight: a channel rather than a
	// mutex so that a collection waiting for another's scan gives up when
	// its own context ends. It guards last and lastAt.
	token  chan struct{}
	last   *snapshot
	lastAt time.Time
}

// snapshot is what one scan of the store found.
type snapshot struct {
	leases [len(leaseStates)]int64
	held   map[string]int64 // live slots per reported scope name
	broken map[string]int64 // corrupt slot rows per reported scope name
}

// newStoreGauges creates the observable instruments and registers the
// callback that reads m's store.
func newStoreGauges(meter metric.Meter, m *Metrics) (*storeGauges, error) {
	g := &storeGauges{m: m, token: make(chan struct{}, 1)}
	var err error
	if g.leaseCount, err = meter.Int64ObservableUpDownCounter("runlease.lease.count",
		metric.WithUnit("{lease}"),
		metric.WithDescription("Lease rows in the store, by state, read at collection time.")); err != nil {
		return nil, err
	}
	if g.slotCount, err = meter.Int64ObservableUpDownCounter("runlease.slot.count",
		metric.WithUnit("{slot}"),
		metric.WithDescription("Live slots held per scope, and corrupt slot rows that block theirs, read at collection time.")); err != nil {
		return nil, err
	}
	if g.slotMax, err = meter.Int64ObservableUpDownCounter("runlease.slot.max",
		metric.WithUnit("{slot}"),
		metric.WithDescription("The limit of each scope this host claims, as passed to WithScopes.")); err != nil {
		return nil, err
	}
	if g.reg, err = meter.RegisterCallback(g.collect, g.leaseCount, g.slotCount, g.slotMax); err != nil {
		return nil, err
	}
	return g, nil
}

// close unregisters the callback, once.
func (g *storeGauges) close() error {
	g.closeOnce.Do(func() { g.closeErr = g.reg.Unregister() })
	return g.closeErr
}

// collect observes one snapshot of the store. On a fault or a timeout it
// observes nothing and returns the error, which the SDK hands to
// OpenTelemetry's error handler; the other instruments are still collected.
func (g *storeGauges) collect(ctx context.Context, obs metric.Observer) error {
	snap, err := g.snapshot(ctx)
	if err != nil {
		return fmt.Errorf("runleaseotel: reading the store for runlease.lease.count and runlease.slot.count: %w", err)
	}
	m := g.m
	for i, state := range leaseStates {
		obs.ObserveInt64(g.leaseCount, snap.leases[i], m.set("", LeaseStateKey.String(state)))
	}
	for _, scope := range m.scopes.all() {
		obs.ObserveInt64(g.slotCount, snap.held[scope], m.set("", ScopeKey.String(scope), SlotStateKey.String("held")))
		obs.ObserveInt64(g.slotCount, snap.broken[scope], m.set("", ScopeKey.String(scope), SlotStateKey.String("corrupt")))
	}
	limits := map[string]int64{}
	for _, sc := range m.o.limits {
		limits[m.scopes.name(sc.Name())] += int64(sc.Limit())
	}
	for scope, limit := range limits {
		obs.ObserveInt64(g.slotMax, limit, m.set("", ScopeKey.String(scope)))
	}
	return nil
}

// snapshot scans the store, or returns the last scan when it is younger
// than WithMinScanInterval.
func (g *storeGauges) snapshot(ctx context.Context) (*snapshot, error) {
	select {
	case g.token <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-g.token }()
	o := g.m.o
	if g.last != nil && o.minScan > 0 && time.Since(g.lastAt) < o.minScan {
		return g.last, nil
	}
	ctx, cancel := context.WithTimeout(ctx, o.collectTimeout)
	defer cancel()
	snap, err := g.scan(ctx)
	if err != nil {
		return nil, err
	}
	g.last, g.lastAt = snap, time.Now()
	return snap, nil
}

// scan reads every lease row and every slot row once.
func (g *storeGauges) scan(ctx context.Context) (*snapshot, error) {
	o := g.m.o
	leases, err := runlease.Leases(ctx, o.store, o.readOpts...)
	if err != nil {
		return nil, err
	}
	slots, err := runlease.Occupancy(ctx, o.store, o.readOpts...)
	if err != nil {
		return nil, err
	}
	snap := &snapshot{held: map[string]int64{}, broken: map[string]int64{}}
	for _, l := range leases {
		snap.leases[stateIndex(l)]++
	}
	for _, s := range slots {
		scope := g.m.scopes.name(s.Scope) // "" for a key without a scope: _OTHER
		if s.Corrupt {
			snap.broken[scope]++
		} else {
			snap.held[scope]++
		}
	}
	return snap, nil
}

// stateIndex is the index in leaseStates of l's state.
func stateIndex(l runlease.LeaseInfo) int {
	switch {
	case l.Corrupt:
		return 3
	case l.Released:
		return 2
	case l.Live:
		return 0
	}
	return 1
}

// scopeNames bounds the values of runlease.scope: the first max names
// admitted are reported as themselves, the rest as "_OTHER". It is safe
// for concurrent use.
type scopeNames struct {
	mu       sync.Mutex
	max      int
	named    int // names admitted as themselves
	admitted map[string]bool
	order    []string // admitted names, and _OTHER once used, sorted
}

// newScopeNames admits the names of first, in order.
func newScopeNames(max int, first []runlease.Scope) *scopeNames {
	s := &scopeNames{max: max, admitted: map[string]bool{}}
	for _, sc := range first {
		s.name(sc.Name())
	}
	return s
}

// name returns how scope is reported, admitting it if there is room.
func (s *scopeNames) name(scope string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admitted[scope] {
		return scope
	}
	if scope == "" || scope == other || s.named >= s.max {
		s.admit(other)
		return other
	}
	s.named++
	s.admit(scope)
	return scope
}

// admit adds name to the reported names. s.mu is held.
func (s *scopeNames) admit(name string) {
	if s.admitted[name] {
		return
	}
	s.admitted[name] = true
	i, _ := slices.BinarySearch(s.order, name)
	s.order = slices.Insert(s.order, i, name)
}

// all returns every name reported so far, sorted.
func (s *scopeNames) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}
