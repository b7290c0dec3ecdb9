// Package etcdtest runs a real etcd cluster for tests: three members, each
// its own OS process on loopback ports, with data in a temporary directory.
// The server is built once from the module proxy (see internal/etcdbin) and
// cached under the user's cache directory, keyed by its version.
package etcdtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Version is the etcd server version the tests run; internal/etcdbin's
// go.mod requires it.
const Version = "v3.7.3"

// Members is how many members a cluster has unless [Options] say otherwise.
const Members = 3

// startTimeout bounds how long a cluster may take to become healthy.
const startTimeout = 90 * time.Second

// Cluster is a running etcd cluster. Its methods are safe for concurrent use.
type Cluster struct {
	bin     string
	dir     string
	opts    Options
	tls     *tls.Config // the clients', when the members serve TLS
	mu      sync.Mutex
	members []*member
}

type member struct {
	name       string
	clientURL  string
	peerURL    string
	dataDir    string
	cmd        *exec.Cmd
	exited     chan struct{}
	logPath    string
	initialSet string
}

// Binary returns the path of the etcd server, building it if the cache does
// not hold it yet.
func Binary() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "runlease-etcdtest", Version, "etcd")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	_, here, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("etcdtest: cannot locate internal/etcdbin")
	}
	src := filepath.Join(filepath.Dir(here), "..", "etcdbin")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	// Build to a name of our own and rename, so that test binaries
	// building at once never run a half-written file.
	tmp := fmt.Sprintf("%s.%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, ".")
	cmd.Dir = src
	// GOWORK=off: the server builds against its own go.mod alone, never
	// against a workspace that raises its dependencies.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("etcdtest: building etcd %s in %s: %v\n%s", Version, src, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// Options change how the members run.
type Options struct {
	// Fsync makes members sync their log to disk before they acknowledge,
	// as a production cluster does. Tests check semantics, not durability,
	// and leave it off, which makes them fast; benchmarks turn it on.
	Fsync bool
	// Members is how many members the cluster has; 0 means [Members].
	Members int
	// TLS, when not nil, makes the members serve clients over TLS with
	// these files, and require a client certificate the authority signed.
	TLS *TLS
}

// Start builds (or finds) the server and starts a cluster of [Members]
// members with data under dir, and waits until every member answers.
func Start(dir string) (*Cluster, error) { return StartWith(dir, Options{}) }

// StartWith is [Start] with options.
func StartWith(dir string, opts Options) (*Cluster, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, dir: dir, opts: opts}
	if c.opts.Members == 0 {
		c.opts.Members = Members
	}
	if c.opts.TLS != nil {
		if c.tls, err = c.opts.TLS.ClientConfig(); err != nil {
			return nil, err
		}
	}
	scheme := "http"
	if c.tls != nil {
		scheme = "https"
	}
	ports, err := freePorts(2 * c.opts.Members)
	if err != nil {
		return nil, err
	}
	var initial []string
	for i := range c.opts.Members {
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			clientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[2*i]),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
		}
		m.dataDir = filepath.Join(dir, m.name)
		m.logPath = filepath.Join(dir, m.name+".log")
		initial = append(initial, m.name+"="+m.peerURL)
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.initialSet = strings.Join(initial, ",")
		if err := c.startMember(m, "new"); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.waitHealthy(startTimeout); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Endpoints returns the client URLs of every member.
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.clientURL
	}
	return eps
}

func (c *Cluster) startMember(m *member, state string) error {
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := []string{
		"--name", m.name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", m.initialSet,
		"--initial-cluster-state", state,
		"--initial-cluster-token", "runlease-etcdtest",
		// A busy machine running the race detector stalls processes for
		// longer than the default 1 s election timeout.
		"--heartbeat-interval", "200",
		"--election-timeout", "3000",
		"--log-level", "warn",
	}
	if !c.opts.Fsync {
		args = append(args, "--unsafe-no-fsync")
	}
	if t := c.opts.TLS; t != nil {
		args = append(args, "--cert-file", t.ServerCert, "--key-file", t.ServerKey,
			"--trusted-ca-file", t.CA, "--client-cert-auth")
	}
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("etcdtest: starting %s: %w", m.name, err)
	}
	m.cmd, m.exited = cmd, make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(m.exited)
	}()
	return nil
}

func (c *Cluster) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, ep := range c.Endpoints() {
		for {
			err := c.ping(ep)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("etcdtest: member %s not healthy after %v: %v; logs in %s", ep, timeout, err, c.dir)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// ping makes a linearizable read through ep alone, which needs a leader.
func (c *Cluster) ping(ep string) error {
	cli, err := clientv3.New(c.config(ep))
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = cli.Get(ctx, "etcdtest/health")
	return err
}

// Stop stops every member and waits for its process to end.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.cmd == nil {
			continue
		}
		m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(10 * time.Second):
			m.cmd.Process.Kill()
			<-m.exited
		}
		m.cmd = nil
	}
}

// Client returns a new client of every member; the caller closes it.
func (c *Cluster) Client() (*clientv3.Client, error) {
	return clientv3.New(c.config(c.Endpoints()...))
}

// config is the configuration of a client of endpoints, with the client
// certificate when the members serve TLS.
func (c *Cluster) config(endpoints ...string) clientv3.Config {
	return clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: c.tls}
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Member returns the host:port of member i's client URL.
func (c *Cluster) Member(i int) string {
	_, hostPort, _ := strings.Cut(c.Endpoints()[i], "://")
	return hostPort
}
