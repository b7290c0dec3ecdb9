// Command scale keeps many leases alive from one process on an etcd store,
// renewed in batches by one Renewer, and reports whether any was lost, the
// CPU it used and the memory each held lease costs; internal/scalekit of
// the core module does the measuring, as it does for Postgres. Without
// -endpoints it starts a private 3-member cluster on loopback ports (each
// member its own process, syncing to disk as in production) and stops it
// at the end:
//
//	cd etcdstore && go run ./internal/scale -leases 100000 -ttl 30s -duration 2m
//
// With -endpoints it uses that cluster, under a fresh prefix it deletes at
// the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/etcdstore/internal/etcdtest"
	"github.com/areev/runlease/internal/scalekit"
)

func main() {
	endpoints := flag.String("endpoints", "", "comma-separated client URLs of a cluster; empty: start one")
	scalekit.Main(func(cfg scalekit.Config) error { return run(*endpoints, cfg) })
}

func run(endpoints string, sc scalekit.Config) error {
	ctx := context.Background()
	var eps []string
	if endpoints == "" {
		dir, err := os.MkdirTemp("", "runlease-etcd-scale-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		c, err := etcdtest.StartWith(dir, etcdtest.Options{Fsync: true})
		if err != nil {
			return err
		}
		defer c.Stop()
		eps = c.Endpoints()
	} else {
		eps = strings.Split(endpoints, ",")
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer client.Close()
	var tok [6]byte
	_, _ = rand.Read(tok[:])
	prefix := "runlease-scale-" + hex.EncodeToString(tok[:]) + "/"
	defer client.Delete(context.Background(), prefix, clientv3.WithPrefix())
	store, err := etcdstore.New(client, etcdstore.WithPrefix(prefix))
	if err != nil {
		return err
	}
	defer store.Close()
	return scalekit.Measure(ctx, store, sc, os.Stdout)
}
