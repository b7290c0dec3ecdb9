// Package cli is the runlease command as a library: cmd/runlease is
// cli.Main with the built-in stores, and a binary of another module adds
// its own stores with a [StoreKind] each (etcdstore/cmd/runlease adds
// --etcd). The commands, flags, output and exit statuses are those of
// "runlease help" and the README.
package cli
