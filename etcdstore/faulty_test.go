package etcdstore_test

// The faulty store of the conformance suite: a store whose client reaches
// the cluster only through a proxy in front of one member. A fault before
// the write applies cuts the proxy off, so the write waits for a connection
// that never comes until its context ends, and nothing is sent; a fault
// after it applies forwards the request and drops the connection before the
// reply, once the server has had time to apply it.

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/connectivity"

	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/etcdstore/internal/etcdtest"
	"github.com/areev/runlease/storetest"
)

// applyTime is how long a proxied request is given to apply before its
// connection is dropped; generous, as the race detector slows the server.
const applyTime = 300 * time.Millisecond

// cutWait is how long a write waits for a connection, cut off, before the
// fault ends its context.
const cutWait = 200 * time.Millisecond

func faultyStore(t *testing.T) storetest.FaultyStore {
	c := requireCluster(t)
	proxy, err := etcdtest.NewProxy(c.Member(0))
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.URL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	s := storeOn(t, client, etcdstore.WithPrefix(fmt.Sprintf("test/%d/", prefixes.Add(1))))

	var mu sync.Mutex
	var timer *time.Timer
	inject := func(f storetest.Fault) {
		mu.Lock()
		defer mu.Unlock()
		if timer != nil {
			timer.Stop()
			timer = nil
		}
		switch f.Kind {
		case storetest.NoFault:
			proxy.Heal()
		case storetest.FaultBeforeApply:
			proxy.Cut()
			waitNotReady(client)
			if f.Cancel != nil {
				timer = time.AfterFunc(cutWait, f.Cancel)
			}
		case storetest.FaultAfterApply:
			proxy.DropAfterRequest(applyTime)
		}
	}
	return storetest.FaultyStore{Store: s, Inject: inject}
}

// waitNotReady waits until the client has seen its connection drop, so the
// next call cannot go out on it.
func waitNotReady(client *clientv3.Client) {
	conn := client.ActiveConnection()
	deadline := time.Now().Add(2 * time.Second)
	for conn.GetState() == connectivity.Ready && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
