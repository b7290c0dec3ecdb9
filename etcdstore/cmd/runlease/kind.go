package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
// --etcd-prefix, --etcd-user and the TLS files --etcd-cacert, --etcd-cert
// and --etcd-key.
func etcdKind() cli.StoreKind {
	return cli.StoreKind{
		Flag:  "etcd",
		Env:   "RUNLEASE_ETCD",
		Usage: "an etcd cluster's `ENDPOINTS`, comma-separated (host:port, http://host:port or https://host:port)",
		Register: func(fs *flag.FlagSet) cli.Opener {
			var c etcdFlags
			fs.StringVar(&c.prefix, "etcd-prefix", etcdstore.DefaultPrefix, "the etcd store's key `PREFIX`")
			fs.StringVar(&c.user, "etcd-user", "", "the etcd `USER`, whose password is $"+envPassword)
			fs.StringVar(&c.caCert, "etcd-cacert", "", "verify the etcd members' certificates with the CA bundle in `FILE` (PEM; TLS)")
			fs.StringVar(&c.cert, "etcd-cert", "", "present the client certificate in `FILE` (PEM; TLS, with --etcd-key)")
			fs.StringVar(&c.key, "etcd-key", "", "the client certificate's private key, in `FILE` (PEM)")
			return func(ctx context.Context, value string) (runlease.ClosableStore, string, error) {
				c.password = os.Getenv(envPassword)
				return openEtcd(ctx, value, c)
			}
		},
	}
}

// etcdFlags are the etcd store's flags beyond --etcd.
type etcdFlags struct {
	prefix, user, password string
	caCert, cert, key      string
}

// openEtcd opens the etcd store at the comma-separated endpoints.
func openEtcd(ctx context.Context, endpoints string, f etcdFlags) (runlease.ClosableStore, string, error) {
	var eps []string
	for _, ep := range strings.Split(endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			eps = append(eps, ep)
		}
	}
	if len(eps) == 0 {
		return nil, "", fmt.Errorf("%w: --etcd %q names no endpoint", runlease.ErrInvalidArgument, endpoints)
	}
	if f.password != "" && f.user == "" {
		return nil, "", fmt.Errorf("%w: $%s is set but --etcd-user is not", runlease.ErrInvalidArgument, envPassword)
	}
	tlsConf, err := clientTLS(eps, f)
	if err != nil {
		return nil, "", err
	}
	s, err := etcdstore.Open(ctx, eps, etcdstore.WithPrefix(f.prefix), etcdstore.WithConfig(func(c *clientv3.Config) {
		c.Username, c.Password = f.user, f.password
		c.TLS = tlsConf
		c.Logger = zap.NewNop() // the command reports its own errors
	}))
	if err != nil {
		return nil, "", err
	}
	name := "etcd:" + strings.Join(eps, ",")
	if f.prefix != etcdstore.DefaultPrefix {
		name += " prefix " + f.prefix
	}
	return s, name, nil
}

// clientTLS returns the TLS configuration the flags ask for: nil for plain
// connections; else one that verifies the members against --etcd-cacert
// (the system's roots without it) and presents --etcd-cert when given. An
// https:// endpoint asks for TLS by itself. Mixing https:// and plain
// endpoints is refused: one cluster speaks one of the two.
func clientTLS(eps []string, f etcdFlags) (*tls.Config, error) {
	secure := 0
	for _, ep := range eps {
		if strings.HasPrefix(ep, "https://") {
			secure++
		}
	}
	switch {
	case secure > 0 && secure < len(eps):
		return nil, fmt.Errorf("%w: --etcd mixes https:// and plain endpoints", runlease.ErrInvalidArgument)
	case (f.cert == "") != (f.key == ""):
		return nil, fmt.Errorf("%w: --etcd-cert and --etcd-key go together", runlease.ErrInvalidArgument)
	case secure == 0 && f.caCert == "" && f.cert == "":
		return nil, nil
	}
	for _, ep := range eps {
		if strings.HasPrefix(ep, "http://") {
			return nil, fmt.Errorf("%w: --etcd %q is plain http://, but TLS files are given", runlease.ErrInvalidArgument, ep)
		}
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.caCert != "" {
		pem, err := os.ReadFile(f.caCert)
		if err != nil {
			return nil, fmt.Errorf("%w: --etcd-cacert: %v", runlease.ErrInvalidArgument, err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: --etcd-cacert %s holds no PEM certificate", runlease.ErrInvalidArgument, f.caCert)
		}
	}
	if f.cert != "" {
		// The key file's contents never reach a message: only its name and
		// the parser's complaint do.
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("%w: --etcd-cert %s with --etcd-key %s: %v", runlease.ErrInvalidArgument, f.cert, f.key, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}
