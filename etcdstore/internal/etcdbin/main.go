// Command etcdbin is the etcd server, built from the module proxy so the
// etcdstore tests can run a real cluster without a system package. It is a
// module of its own so users of etcdstore never download the server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
