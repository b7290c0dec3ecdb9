package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
)

// DefaultPrefix is the prefix under which the store keeps its keys unless
// [WithPrefix] sets another.
const DefaultPrefix = "runlease/"

// DefaultMaxTxnOps is etcd's default limit on the operations of one Txn (the
// server's --max-txn-ops flag), and the store's unless [WithMaxTxnOps] sets
// another.
const DefaultMaxTxnOps = 128

// MinMaxTxnOps is the smallest limit [WithMaxTxnOps] accepts.
const MinMaxTxnOps = 2

// DefaultScanPage is how many rows one request of [Store.MetaScan] reads,
// unless [WithScanPage] sets another.
const DefaultScanPage = 500

// DefaultMaxRequestBytes is etcd's default limit on the size of one request
// (the server's --max-request-bytes flag, 1.5 MiB), and the store's unless
// [WithMaxRequestBytes] sets another.
const DefaultMaxRequestBytes = 3 << 19

// MinMaxRequestBytes is the smallest limit [WithMaxRequestBytes] accepts.
const MinMaxRequestBytes = 64 << 10

// Option configures a Store made by [New] or [Open].
type Option func(*options)

type options struct {
	prefix          string
	maxTxnOps       int
	maxRequestBytes int
	scanPage        int
	config          func(*clientv3.Config)
}

// WithPrefix sets the prefix of every key the store writes (default
// [DefaultPrefix]): runlease key k is etcd key prefix+k. Stores on one
// cluster with different prefixes do not see each other's rows. The prefix
// must pass [runlease.CheckPrefix].
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithMaxTxnOps sets the most operations one Txn may carry (default
// [DefaultMaxTxnOps], at least [MinMaxTxnOps]); set it to the cluster's
// --max-txn-ops. It bounds [Store.MetaBatch], which refuses larger batches,
// and the size of the Txns [Store.MetaCASMany] splits its writes into.
func WithMaxTxnOps(n int) Option { return func(o *options) { o.maxTxnOps = n } }

// WithMaxRequestBytes sets the size, in bytes, of the largest request the
// cluster accepts (default [DefaultMaxRequestBytes], at least
// [MinMaxRequestBytes]); set it to the cluster's --max-request-bytes. A
// write is one request whatever it carries: a fenced batch of two values of
// a MiB each, or a swap of a MiB value for another, is larger than etcd's
// default even though each value is within [runlease.MaxValueLen]. The
// store refuses a write larger than the limit before sending it, with an
// error that matches [runlease.ErrInvalidArgument], since no retry could
// make it fit, and [Store.MetaCASMany] splits its writes into Txns that fit.
func WithMaxRequestBytes(n int) Option { return func(o *options) { o.maxRequestBytes = n } }

// WithScanPage sets how many rows one request of [Store.MetaScan] reads
// (default [DefaultScanPage], at least 1). Every page is read at the same
// revision, so the pages form one snapshot.
func WithScanPage(n int) Option { return func(o *options) { o.scanPage = n } }

// WithConfig lets [Open] adjust the client's configuration (TLS, user name
// and password, timeouts) before it dials. [New] ignores it.
func WithConfig(fn func(*clientv3.Config)) Option { return func(o *options) { o.config = fn } }

func buildOptions(opts []Option) (options, error) {
	o := options{prefix: DefaultPrefix, maxTxnOps: DefaultMaxTxnOps, maxRequestBytes: DefaultMaxRequestBytes,
		scanPage: DefaultScanPage}
	for _, opt := range opts {
		opt(&o)
	}
	if err := runlease.CheckPrefix(o.prefix); err != nil {
		return o, err
	}
	if o.maxTxnOps < MinMaxTxnOps {
		return o, invalidArg("max txn ops %d is below the minimum %d", o.maxTxnOps, MinMaxTxnOps)
	}
	if o.maxRequestBytes < MinMaxRequestBytes {
		return o, invalidArg("max request bytes %d is below the minimum %d", o.maxRequestBytes, MinMaxRequestBytes)
	}
	if o.scanPage < 1 {
		return o, invalidArg("scan page %d is below 1", o.scanPage)
	}
	return o, nil
}

// invalidArg returns an error that matches [runlease.ErrInvalidArgument].
func invalidArg(format string, a ...any) error {
	return fmt.Errorf("%w: etcdstore: %s", runlease.ErrInvalidArgument, fmt.Sprintf(format, a...))
}

// Store is a [runlease.Store] on an etcd cluster. It is safe for concurrent
// use by many goroutines, and many Stores, in many processes, may share one
// cluster and prefix. Make one with [New] or [Open]; the zero value is not
// usable.
type Store struct {
	client *clientv3.Client
	kv     pb.KVClient // the raw stub, for writes: see txn
	owned  bool
	o      options
	secret string // the client's password, kept out of messages
	closed atomic.Bool

	watchMu sync.Mutex
	watches map[string]*keyWatch // by runlease key
	stopped bool
	wg      sync.WaitGroup
}

// New returns a Store that talks to etcd through client. The store never
// closes client: [Store.Close] only ends the store's watches. It fails with
// [runlease.ErrInvalidArgument] when an option is invalid or client is nil.
func New(client *clientv3.Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, invalidArg("nil client")
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	return &Store{client: client, kv: pb.NewKVClient(client.ActiveConnection()), o: o, secret: client.Password}, nil
}

// Open dials the cluster at endpoints and returns a Store that owns the
// client: [Store.Close] closes it. It makes one read to check that a member
// answers, and fails with a [*runlease.StorageError] when none does before
// ctx ends (the error then matches ctx's), or with
// [runlease.ErrInvalidArgument] when an option or the endpoint list is
// invalid. ctx bounds only Open, not the store.
func Open(ctx context.Context, endpoints []string, opts ...Option) (*Store, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if len(endpoints) == 0 {
		return nil, invalidArg("no endpoints")
	}
	cfg := clientv3.Config{Endpoints: endpoints, Context: context.WithoutCancel(ctx)}
	if o.config != nil {
		o.config(&cfg)
	}
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, &runlease.StorageError{Op: "Open", Err: redact(err, cfg.Password)}
	}
	s, err := New(client, opts...)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.owned = true
	if _, err := client.Get(ctx, s.o.prefix+"\x00", clientv3.WithCountOnly()); err != nil {
		client.Close()
		return nil, s.fault(ctx, "Open", "", false, false, err)
	}
	return s, nil
}

// Client returns the etcd client the store uses.
func (s *Store) Client() *clientv3.Client { return s.client }

// Prefix returns the prefix of the store's etcd keys.
func (s *Store) Prefix() string { return s.o.prefix }

// MaxTxnOps returns the most operations the store puts in one Txn.
func (s *Store) MaxTxnOps() int { return s.o.maxTxnOps }

// MaxRequestBytes returns the size of the largest request the store sends.
func (s *Store) MaxRequestBytes() int { return s.o.maxRequestBytes }

// Close ends the store's watches, waiting for their goroutines, and closes
// the client if [Open] made it. Calls after Close fail with
// [runlease.ErrStoreClosed]. Close is idempotent; it returns the client's
// error on closing, if any.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.stopWatches()
	if s.owned {
		if err := s.client.Close(); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return nil
}

// enter refuses a call on a closed store, or one whose ctx has ended (then
// nothing is sent and the outcome is known).
func (s *Store) enter(ctx context.Context, op, key string) error {
	if s.closed.Load() {
		return runlease.ErrStoreClosed
	}
	if err := ctx.Err(); err != nil {
		return &runlease.StorageError{Op: op, Key: key, Err: err}
	}
	return nil
}

var (
	_ runlease.Store          = (*Store)(nil)
	_ runlease.Batcher        = (*Store)(nil)
	_ runlease.MultiCASer     = (*Store)(nil)
	_ runlease.MultiScanner   = (*Store)(nil)
	_ runlease.RowNotifier    = (*Store)(nil)
	_ runlease.DeleteNotifier = (*Store)(nil)
)
