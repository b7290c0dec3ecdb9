package etcdstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
)

// requestCounter counts the KV requests a client sends, by method.
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *requestCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if strings.HasPrefix(method, "/etcdserverpb.KV/") {
		c.mu.Lock()
		c.n[strings.TrimPrefix(method, "/etcdserverpb.KV/")]++
		c.mu.Unlock()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// take returns the counts so far and starts again from none.
func (c *requestCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// countedStore returns a store on a fresh prefix through a client whose
// KV requests are counted.
func countedStore(t *testing.T, opts ...etcdstore.Option) (*etcdstore.Store, *requestCounter) {
	t.Helper()
	c := &requestCounter{n: map[string]int{}}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   requireCluster(t).Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.intercept)},
	})
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	prefix := fmt.Sprintf("test/%d/", prefixes.Add(1))
	return storeOn(t, client, append([]etcdstore.Option{etcdstore.WithPrefix(prefix)}, opts...)...), c
}

// fillQueue writes n rows under p, ordered as their number, and rings p's
// bell, as a release of a slot of the scope whose queue p is does.
func fillQueue(t *testing.T, s *etcdstore.Store, p string, n int) []runlease.Row {
	t.Helper()
	var rows []runlease.Row
	for i := range n {
		rows = append(rows, runlease.Row{Key: fmt.Sprintf("%s%06d", p, i), Value: "v"})
	}
	for lo := 0; lo < n; lo += 100 {
		var writes []runlease.CASWrite
		for _, r := range rows[lo:min(lo+100, n)] {
			writes = append(writes, runlease.CASWrite{Key: r.Key, Value: r.Value})
		}
		swapped, err := s.MetaCASMany(t.Context(), writes)
		require.NoError(t, err)
		require.NotContains(t, swapped, false)
	}
	ok, err := s.MetaCAS(t.Context(), p+"ring", nil, "v")
	require.NoError(t, err)
	require.True(t, ok)
	deleted, err := s.MetaDeleteNotify(t.Context(), p+"ring", "v", p)
	require.NoError(t, err)
	require.True(t, deleted)
	return rows
}

// TestMetaRangesReadTheHeadsInOneRequest reads the heads of two queues of
// thousands of rows, whose prefixes have rung bells (the first key of each
// range, which is not a row): one Txn, nothing read on.
func TestMetaRangesReadTheHeadsInOneRequest(t *testing.T) {
	t.Parallel()
	s, c := countedStore(t)
	a := fillQueue(t, s, "runqueue:1:a:", 3000)
	b := fillQueue(t, s, "runqueue:1:b:", 1000)
	c.take()
	got, err := s.MetaRanges(t.Context(), []runlease.Range{
		{Prefix: "runqueue:1:a:", Limit: 8},
		{Prefix: "runqueue:1:b:", After: b[500].Key, Limit: 8},
		{Prefix: "runqueue:1:a:", After: a[2998].Key, Limit: 8},
		{Prefix: "runqueue:1:", Limit: 1},
	})
	require.NoError(t, err)
	assert.Equal(t, [][]runlease.Row{a[:8], b[501:509], a[2999:], a[:1]}, got)
	assert.Equal(t, map[string]int{"Txn": 1}, c.take(), "the heads cost one request")
}

// TestMetaRangesSmallPagesAndTxns reads ranges through stores that read one
// or two keys a request and put two requests in a Txn, among bells of the
// prefix and of rows inside it: each range is read on to its limit or its
// end, and the ranges are split across Txns of at most WithMaxTxnOps
// requests, yet each list is its range's.
func TestMetaRangesSmallPagesAndTxns(t *testing.T) {
	t.Parallel()
	for _, page := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("page=%d", page), func(t *testing.T) {
			t.Parallel()
			s, c := countedStore(t, etcdstore.WithScanPage(page), etcdstore.WithMaxTxnOps(etcdstore.MinMaxTxnOps))
			rows := fillQueue(t, s, "q/", 30)
			for i, wake := range []string{rows[0].Key, rows[1].Key, rows[2].Key, rows[10].Key, "q/000010 "} {
				k := fmt.Sprintf("ring/%d", i)
				ok, err := s.MetaCAS(t.Context(), k, nil, "v")
				require.NoError(t, err)
				require.True(t, ok)
				_, err = s.MetaDeleteNotify(t.Context(), k, "v", wake)
				require.NoError(t, err)
			}
			ranges := []runlease.Range{
				{Prefix: "q/", Limit: 1},
				{Prefix: "q/", Limit: 5},
				{Prefix: "q/"},
				{Prefix: "q/", After: rows[9].Key, Limit: 3},
				{Prefix: "q/", After: rows[28].Key, Limit: 3},
				{Prefix: "q/", After: "q/000010 ", Limit: 2},
				{Prefix: "", After: "q", Limit: 4},
				{Prefix: "ring/"},
				{Prefix: "q/", After: "r"},
			}
			c.take()
			got, err := s.MetaRanges(t.Context(), ranges)
			require.NoError(t, err)
			assert.Equal(t, [][]runlease.Row{
				rows[:1], rows[:5], rows, rows[10:13], rows[29:], rows[11:13], rows[:4], {}, {},
			}, got)
			// The last range lies past its prefix and is not sent.
			assert.Equal(t, 4, c.take()["Txn"], "8 requests, 2 a Txn")
		})
	}
}
