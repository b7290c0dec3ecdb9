package etcdstore_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/etcdstore/internal/etcdtest"
)

// cluster is the one cluster every test of this binary shares, each test
// under a key prefix of its own; nil when it could not be started outside CI.
var (
	cluster    *etcdtest.Cluster
	clusterErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "etcdstore-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// RUNLEASE_ETCD_FSYNC=1 runs the members as production does, for
	// benchmarks; tests leave it off and are faster for it.
	cluster, clusterErr = etcdtest.StartWith(dir, etcdtest.Options{Fsync: os.Getenv("RUNLEASE_ETCD_FSYNC") == "1"})
	if clusterErr != nil && os.Getenv("CI") == "true" {
		fmt.Fprintf(os.Stderr, "etcdstore tests: CI=true requires a real etcd cluster, and none could be started: %v\n", clusterErr)
		os.Exit(1)
	}
	code := m.Run()
	if cluster != nil {
		cluster.Stop()
	}
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// requireCluster returns the shared cluster, or skips t when there is none
// (outside CI only: TestMain fails the binary in CI).
func requireCluster(t testing.TB) *etcdtest.Cluster {
	t.Helper()
	if cluster == nil {
		t.Skipf("no etcd cluster (set CI=true to make this a failure): %v", clusterErr)
	}
	return cluster
}

var prefixes atomic.Int64

// newClient returns a client of every member, closed at cleanup.
func newClient(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := requireCluster(t).Client()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// newStore returns a store on a fresh prefix, through a client of its own.
func newStore(t testing.TB, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	prefix := fmt.Sprintf("test/%d/", prefixes.Add(1))
	return storeOn(t, newClient(t), append([]etcdstore.Option{etcdstore.WithPrefix(prefix)}, opts...)...)
}

// storeOn returns a store through client, closed at cleanup.
func storeOn(t testing.TB, client *clientv3.Client, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(client, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// reopen returns a second store on s's prefix, through a client of its own,
// as another node would have.
func reopen(t testing.TB, s *etcdstore.Store) *etcdstore.Store {
	t.Helper()
	return storeOn(t, newClient(t), etcdstore.WithPrefix(s.Prefix()), etcdstore.WithMaxTxnOps(s.MaxTxnOps()))
}
