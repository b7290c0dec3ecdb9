// Command runlease is the operator's tool of the core module
// (github.com/areev/runlease/cmd/runlease) with one more store: an etcd
// cluster, named by --etcd ENDPOINTS or $RUNLEASE_ETCD, for status, peek,
// explain, serve, release, repair and prune.
//
//	go install github.com/areev/runlease/etcdstore/cmd/runlease@latest
//	runlease status --etcd 10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379
//	RUNLEASE_ETCD=10.0.0.1:2379 runlease peek run-42 --etcd-prefix fleet/
//	runlease status --etcd https://10.0.0.1:2379 --etcd-cacert ca.pem --etcd-cert ops.pem --etcd-key ops-key.pem
//
// It is built in the etcdstore module so that the core module's binary
// never carries the etcd client.
package main

import (
	"os"

	"github.com/areev/runlease/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], etcdKind())) }
