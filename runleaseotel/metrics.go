// Package runleaseotel provides OpenTelemetry metrics for runlease: it turns
// [runlease.Hooks] into counters and histograms of acquisitions, renewals
// and losses, and reads the store at collection time for gauges of leases by
// state and slots held per scope.
//
// It is a module of its own, so that programs using runlease without
// OpenTelemetry never download it. Metric names, units and attributes follow
// OpenTelemetry's naming conventions; the README lists them. Attribute
// values are bounded: run ids are never attributes unless [WithRunIDAttribute]
// asks for them, and scopes beyond [WithMaxScopes] are reported as "_OTHER".
//
//	m, err := runleaseotel.NewMetrics(otel.GetMeterProvider(), runleaseotel.WithStore(store))
//	if err != nil { … }
//	defer m.Close()
//	lease, err := runlease.Acquire(ctx, store, runID, holder, runlease.WithHooks(m.Hooks()))
//	keeper, err := runlease.Keep(ctx, lease) // reports through the same hooks
package runleaseotel

import (
	"errors"
	"fmt"
	"time"

	"github.com/areev/runlease"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the meter that Metrics creates.
const ScopeName = "github.com/areev/runlease/runleaseotel"

// Defaults of the options.
const (
	// DefaultCollectTimeout bounds the store reads of one collection when
	// no [WithCollectTimeout] option is given.
	DefaultCollectTimeout = 5 * time.Second
	// DefaultMaxScopes is how many distinct scope names are reported as
	// themselves when no [WithMaxScopes] option is given; later ones are
	// reported as "_OTHER".
	DefaultMaxScopes = 100
)

// Metrics records runlease's metrics on one meter. Its hooks feed the
// event instruments; with [WithStore] it also reads the store at every
// collection. A Metrics is safe for concurrent use; the zero value is not
// usable: make one with [NewMetrics].
type Metrics struct {
	o      options
	scopes *scopeNames

	acquireAttempts metric.Int64Counter
	acquireDuration metric.Float64Histogram
	renewDuration   metric.Float64Histogram
	renewTimeLeft   metric.Float64Histogram
	leasesLost      metric.Int64Counter
	slotsLost       metric.Int64Counter
	limitMismatches metric.Int64Counter

	store *storeGauges // nil without WithStore

	// The attribute sets of the common events, built once: a Keeper
	// reports every renewal, and most succeed. Nil with WithRunIDAttribute.
	plain, acquireOK, renewOK metric.MeasurementOption
}

// Option configures [NewMetrics].
type Option func(*options)

type options struct {
	store          runlease.Store
	readOpts       []runlease.Option
	collectTimeout time.Duration
	minScan        time.Duration
	maxScopes      int
	limits         []runlease.Scope
	runID          bool
	attrs          []attribute.KeyValue
}

// WithStore makes Metrics read store at every collection for the gauges
// runlease.lease.count, runlease.slot.count and runlease.slot.max. Each
// collection scans every lease row and every slot row once (see the
// README on the cost for large tables). readOpts are passed to
// [runlease.Leases] and [runlease.Occupancy]; only [runlease.WithClock]
// applies. Without WithStore, Metrics records the hooks' events only.
func WithStore(store runlease.Store, readOpts ...runlease.Option) Option {
	return func(o *options) { o.store, o.readOpts = store, readOpts }
}

// WithCollectTimeout bounds the store reads of one collection. The default
// is [DefaultCollectTimeout]. A collection that runs out of time, or meets a
// storage fault, reports no store gauges and returns the error to the SDK,
// which passes it to OpenTelemetry's error handler. It must be positive.
func WithCollectTimeout(d time.Duration) Option {
	return func(o *options) { o.collectTimeout = d }
}

// WithMinScanInterval makes collections less than d after the last scan
// report that scan again rather than read the store, so that several readers
// (a Prometheus scrape and an OTLP push, say) or frequent scrapes cost one
// scan per d. The default, 0, scans at every collection. It must not be
// negative.
func WithMinScanInterval(d time.Duration) Option {
	return func(o *options) { o.minScan = d }
}

// WithMaxScopes bounds the runlease.scope attribute: the first n distinct
// scope names seen (those given to [WithScopes] first) are reported as
// themselves, and every later one as "_OTHER", so that per-principal scopes
// ([runlease.PrincipalScope]) cannot grow the number of series without
// bound. The default is [DefaultMaxScopes]. It must be at least 1.
func WithMaxScopes(n int) Option {
	return func(o *options) { o.maxScopes = n }
}

// WithScopes passes the scopes, and their limits, that this host claims:
// runlease.slot.max reports each limit, and runlease.slot.count reports each
// scope even while no slot of it is held. The limit is the host's
// configuration, not stored in the store, so only the operator can pass it.
func WithScopes(scopes ...runlease.Scope) Option {
	return func(o *options) { o.limits = append(o.limits, scopes...) }
}

// WithRunIDAttribute adds the run id, as runlease.run.id, to the event
// metrics (acquisitions, renewals, losses). Every run then makes series of
// its own, which most metric backends charge for and few can bear with many
// runs: use it only where runs are few and long-lived. The store gauges never
// carry run ids.
func WithRunIDAttribute() Option {
	return func(o *options) { o.runID = true }
}

// WithAttributes adds attrs to every measurement, for example to tell
// apart the stores of two Metrics that share a provider.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(o *options) { o.attrs = append(o.attrs, attrs...) }
}

// NewMetrics creates the instruments on a meter of provider named
// [ScopeName] and, with [WithStore], registers the callback that reads the
// store. It fails with an error matching [runlease.ErrInvalidArgument] for a
// nil provider or an invalid option, and with the SDK's error when an
// instrument cannot be created; it then registers nothing. Call Close to
// stop reading the store.
func NewMetrics(provider metric.MeterProvider, opts ...Option) (*Metrics, error) {
	o := options{collectTimeout: DefaultCollectTimeout, maxScopes: DefaultMaxScopes}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(provider); err != nil {
		return nil, err
	}
	m := &Metrics{o: o, scopes: newScopeNames(o.maxScopes, o.limits)}
	if !o.runID {
		m.plain = m.set("")
		m.acquireOK = m.set("", OutcomeKey.String("acquired"))
		m.renewOK = m.set("", OutcomeKey.String("renewed"))
	}
	meter := provider.Meter(ScopeName)
	if err := m.instruments(meter); err != nil {
		return nil, err
	}
	if o.store != nil {
		g, err := newStoreGauges(meter, m)
		if err != nil {
			return nil, err
		}
		m.store = g
	}
	return m, nil
}

// validate refuses a nil provider and out-of-range options.
func (o options) validate(provider metric.MeterProvider) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: runleaseotel: "+format, append([]any{runlease.ErrInvalidArgument}, a...)...)
	}
	switch {
	case provider == nil:
		return bad("nil MeterProvider (pass otel.GetMeterProvider() for the global one)")
	case o.collectTimeout <= 0:
		return bad("collect timeout %v is not positive", o.collectTimeout)
	case o.minScan < 0:
		return bad("min scan interval %v is negative", o.minScan)
	case o.maxScopes < 1:
		return bad("max scopes %d is below 1", o.maxScopes)
	}
	for _, sc := range o.limits {
		if sc.Name() == "" || sc.Limit() < 1 {
			return bad("scope %q with limit %d: make scopes with runlease.NamedScope and a positive limit", sc.Name(), sc.Limit())
		}
	}
	return nil
}

// Close stops reading the store at collection time. The hooks keep
// recording. Closing twice, or a Metrics without a store, does nothing.
func (m *Metrics) Close() error {
	if m.store == nil {
		return nil
	}
	return m.store.close()
}

// Seconds-valued bucket boundaries. Latencies use OpenTelemetry's
// recommended boundaries for durations; the trust time left spans runlease's
// TTLs, from MinTTL (5s) to MaxTTL (24h).
var (
	latencyBuckets  = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	timeLeftBuckets = []float64{0, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400}
)

// instruments creates the instruments the hooks record on.
func (m *Metrics) instruments(meter metric.Meter) error {
	var errs [7]error
	m.acquireAttempts, errs[0] = meter.Int64Counter("runlease.lease.acquire.attempts",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Acquire calls that got past argument checks, by outcome."))
	m.acquireDuration, errs[1] = meter.Float64Histogram("runlease.lease.acquire.duration",
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(latencyBuckets...),
		metric.WithDescription("How long Acquire took, by outcome."))
	m.renewDuration, errs[2] = meter.Float64Histogram("runlease.lease.renew.duration",
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(latencyBuckets...),
		metric.WithDescription("How long a Keeper's renewal attempt took, by outcome."))
	m.renewTimeLeft, errs[3] = meter.Float64Histogram("runlease.lease.renew.time_left",
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(timeLeftBuckets...),
		metric.WithDescription("How long the holder's trust window still had to run when a renewal attempt started."))
	m.leasesLost, errs[4] = meter.Int64Counter("runlease.lease.lost",
		metric.WithUnit("{lease}"),
		metric.WithDescription("Kept leases lost, by reason."))
	m.slotsLost, errs[5] = meter.Int64Counter("runlease.slot.lost",
		metric.WithUnit("{slot}"),
		metric.WithDescription("Kept slots lost, by scope and reason."))
	m.limitMismatches, errs[6] = meter.Int64Counter("runlease.slot.limit_mismatches",
		metric.WithUnit("{claim}"),
		metric.WithDescription("Slot claims that found live slots at or above this host's limit for a scope."))
	return errors.Join(errs[:]...)
}
