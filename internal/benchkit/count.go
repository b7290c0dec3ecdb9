package benchkit

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/areev/runlease"
)

// TripCounter counts round trips on network connections: a write that
// follows a read (or is a connection's first) starts a new request, however
// many Write calls the request takes. Pipelined statements sent together
// count once, which is the point: that is one wait for the network and the
// server. It is safe for concurrent use.
type TripCounter struct{ n atomic.Int64 }

// Load returns the round trips counted so far.
func (c *TripCounter) Load() int64 { return c.n.Load() }

// Wrap returns conn with its round trips counted.
func (c *TripCounter) Wrap(conn net.Conn) net.Conn {
	cc := &countingConn{Conn: conn, c: c}
	cc.read.Store(true)
	return cc
}

// Dial wraps a dial function (such as pgconn.Config.DialFunc) so that every
// connection it makes is counted.
func (c *TripCounter) Dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return c.Wrap(conn), nil
	}
}

type countingConn struct {
	net.Conn
	c *TripCounter
	// read is set by a read and cleared by the next write. pgx may read on
	// a goroutine of its own while a large request is written, hence atomic.
	read atomic.Bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	if c.read.Swap(false) {
		c.c.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.read.Store(true)
	}
	return n, err
}

// CallCounter wraps a built-in store and counts its calls: the unit of
// "round trips" for the embedded store, which has no network. A batch,
// a notifying write and a multi-write each count as one call, as each is
// one statement or one transaction. It forwards every optional capability
// the built-in stores have (Batcher, Notifier, MultiCASer, MultiScanner,
// RangeReader, DeleteNotifier), so the library takes the same paths
// through it as through the store itself; the store must implement them
// all. It is safe for concurrent use.
type CallCounter struct {
	runlease.Store
	n atomic.Int64
}

// Interfaces the built-in SQLite store implements; CountCalls checks them.
type fullStore interface {
	runlease.Store
	runlease.Batcher
	runlease.Notifier
	runlease.MultiCASer
	runlease.RangeReader
}

var (
	_ runlease.Batcher     = (*CallCounter)(nil)
	_ runlease.Notifier    = (*CallCounter)(nil)
	_ runlease.MultiCASer  = (*CallCounter)(nil)
	_ runlease.RangeReader = (*CallCounter)(nil)
)

// CountCalls wraps s, which must implement Batcher, DeleteNotifier,
// MultiScanner, RangeReader and MultiCASer (both built-in stores do), and
// does not implement Clock (the SQLite store does not, and the wrapper
// would hide it).
func CountCalls(s runlease.Store) *CallCounter {
	if _, ok := s.(fullStore); !ok {
		panic("benchkit: CountCalls needs a store with every optional capability of the built-in stores")
	}
	if _, ok := s.(runlease.Clock); ok {
		panic("benchkit: CountCalls would hide the store's Clock")
	}
	return &CallCounter{Store: s}
}

// Load returns the calls counted so far.
func (c *CallCounter) Load() int64 { return c.n.Load() }

func (c *CallCounter) MetaGet(ctx context.Context, key string) (string, bool, error) {
	c.n.Add(1)
	return c.Store.MetaGet(ctx, key)
}

func (c *CallCounter) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	c.n.Add(1)
	return c.Store.MetaCAS(ctx, key, expected, value)
}

func (c *CallCounter) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	c.n.Add(1)
	return c.Store.MetaDelete(ctx, key, expected)
}

func (c *CallCounter) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	c.n.Add(1)
	return c.Store.MetaScan(ctx, prefix)
}

func (c *CallCounter) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	c.n.Add(1)
	return c.Store.(runlease.Batcher).MetaBatch(ctx, conds, ops)
}

func (c *CallCounter) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	c.n.Add(1)
	return c.Store.(runlease.Notifier).MetaCASNotify(ctx, key, expected, value)
}

func (c *CallCounter) Subscribe(key string) (<-chan struct{}, func()) {
	return c.Store.(runlease.Notifier).Subscribe(key)
}

func (c *CallCounter) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	c.n.Add(1)
	return c.Store.(runlease.MultiCASer).MetaCASMany(ctx, writes)
}

func (c *CallCounter) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	c.n.Add(1)
	return c.Store.(runlease.DeleteNotifier).MetaDeleteNotify(ctx, key, expected, wakeKey)
}

func (c *CallCounter) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	c.n.Add(1)
	return c.Store.(runlease.MultiScanner).MetaScanMany(ctx, prefixes)
}

// MetaRanges counts as one call, as MetaScanMany does: one round trip.
func (c *CallCounter) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	c.n.Add(1)
	return c.Store.(runlease.RangeReader).MetaRanges(ctx, ranges)
}
