package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/areev/runlease"
	"github.com/areev/runlease/cli"
	"github.com/areev/runlease/etcdstore"
)

// envPassword names the environment variable that holds the etcd user's
// password: a password is never a flag, which every user of the machine
// could read in the process list.
const envPassword = "RUNLEASE_ETCD_PASSWORD"

// etcdKind is the etcd store on the command line: --etcd ENDPOINTS, with
// --etcd-prefix and --etcd-user.
func etcdKind() cli.StoreKind {
	return cli.StoreKind{
		Flag:  "etcd",
		Env:   "RUNLEASE_ETCD",
		Usage: "an etcd cluster's `ENDPOINTS`, comma-separated (host:port or http://host:port)",
		Register: func(fs *flag.FlagSet) cli.Opener {
			prefix := fs.String("etcd-prefix", etcdstore.DefaultPrefix, "the etcd store's key `PREFIX`")
			user := fs.String("etcd-user", "", "the etcd `USER`, whose password is $"+envPassword)
			return func(ctx context.Context, value string) (runlease.ClosableStore, string, error) {
				return openEtcd(ctx, value, *prefix, *user, os.Getenv(envPassword))
			}
		},
	}
}

// openEtcd opens the etcd store at the comma-separated endpoints.
func openEtcd(ctx context.Context, endpoints, prefix, user, password string) (runlease.ClosableStore, string, error) {
	var eps []string
	for _, ep := range strings.Split(endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			eps = append(eps, ep)
		}
	}
	if len(eps) == 0 {
		return nil, "", fmt.Errorf("%w: --etcd %q names no endpoint", runlease.ErrInvalidArgument, endpoints)
	}
	if password != "" && user == "" {
		return nil, "", fmt.Errorf("%w: $%s is set but --etcd-user is not", runlease.ErrInvalidArgument, envPassword)
	}
	s, err := etcdstore.Open(ctx, eps, etcdstore.WithPrefix(prefix), etcdstore.WithConfig(func(c *clientv3.Config) {
		c.Username, c.Password = user, password
		c.Logger = zap.NewNop() // the command reports its own errors
	}))
	if err != nil {
		return nil, "", err
	}
	name := "etcd:" + strings.Join(eps, ",")
	if prefix != etcdstore.DefaultPrefix {
		name += " prefix " + prefix
	}
	return s, name, nil
}
