package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EnvBin names an environment variable that may point at the directory of
// PostgreSQL's server programs (initdb, pg_ctl) for [StartCluster]. Without
// it, StartCluster looks in /usr/lib/postgresql/*/bin, newest first, then in
// PATH.
const EnvBin = "RUNLEASE_TEST_PG_BIN"

// ctlTimeout bounds each initdb and pg_ctl run.
const ctlTimeout = 2 * time.Minute

// Cluster is a private PostgreSQL server that one test owns, so that it may
// stop, crash and restart it; the shared test server is never touched. It
// listens on a free port of 127.0.0.1 and on a Unix socket in its own
// directory, trusts every local connection, and is stopped and deleted when
// the test ends. Its methods fail the test on error and must be called from
// the test's goroutine.
type Cluster struct {
	t     testing.TB
	bin   string   // the directory of initdb and pg_ctl
	dir   string   // the cluster's directory: data, socket and log
	runAs []string // the command prefix that runs a program as the server's OS user
	port  int
	extra string // server options beyond serverOptions' own
}

// StartCluster creates and starts a private cluster for t. Like every
// Postgres test it skips unless RUNLEASE_TEST_POSTGRES is set; it then fails
// t when the server programs are missing. When the test runs as root, the
// server runs as the OS user postgres, since PostgreSQL refuses to run as
// root.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	c := newCluster(t, "")
	c.initdb()
	c.Start()
	return c
}

// newCluster makes the directory and port of a cluster with no data yet,
// started with the extra server options given.
func newCluster(t testing.TB, extra string) *Cluster {
	t.Helper()
	DSN(t)
	c := &Cluster{t: t, bin: serverBin(t), extra: extra}
	dir, err := os.MkdirTemp("", "runlease-pg-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c.dir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root needs the OS user postgres to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		c.runAs = []string{"runuser", "-u", "postgres", "--"}
	}
	c.port = freePort(t)
	t.Cleanup(func() {
		// Immediate: the data is thrown away, so there is nothing to flush.
		c.ctl(true, "stop", "-m", "immediate")
	})
	return c
}

// initdb creates the cluster's data directory.
func (c *Cluster) initdb() {
	c.t.Helper()
	c.run("initdb", "-D", c.data(), "-A", "trust", "-U", "runlease", "-E", "UTF8", "--locale=C", "--no-sync")
}

// DSN returns a DSN for the cluster's database postgres, over TCP.
func (c *Cluster) DSN() string {
	return fmt.Sprintf("postgres://runlease@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", c.port)
}

// Start starts the stopped server and waits until it accepts connections.
func (c *Cluster) Start() {
	c.t.Helper()
	c.ctl(false, "start", "-l", c.log(), "-o", c.serverOptions())
}

// Stop stops the server at once (pg_ctl -m immediate): every backend exits
// without finishing its work and connections drop, as in a crash; the next
// Start recovers from the write-ahead log.
func (c *Cluster) Stop() {
	c.t.Helper()
	c.ctl(false, "stop", "-m", "immediate")
}

// Restart stops the server at once, as Stop does, starts it again and waits
// until it accepts connections.
func (c *Cluster) Restart() {
	c.t.Helper()
	c.ctl(false, "restart", "-m", "immediate", "-l", c.log(), "-o", c.serverOptions())
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) log() string  { return filepath.Join(c.dir, "server.log") }

func (c *Cluster) serverOptions() string {
	return fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=30 -c shared_buffers=16MB %s",
		c.port, c.dir, c.extra)
}

// ctl runs pg_ctl with args and waits for it to finish (-w). With quiet, a
// failure is ignored, as when a cleanup stops a server that is down.
func (c *Cluster) ctl(quiet bool, args ...string) {
	c.t.Helper()
	args = append([]string{"-D", c.data(), "-w", "-t", "60"}, args...)
	if err := c.exec("pg_ctl", args...); err != nil && !quiet {
		c.t.Fatalf("pgtest: %v", err)
	}
}

func (c *Cluster) run(prog string, args ...string) {
	c.t.Helper()
	if err := c.exec(prog, args...); err != nil {
		c.t.Fatalf("pgtest: %v", err)
	}
}

func (c *Cluster) exec(prog string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	argv := append(slices.Clone(c.runAs), filepath.Join(c.bin, prog))
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	logTail, _ := os.ReadFile(c.log())
	if len(logTail) > 2000 {
		logTail = logTail[len(logTail)-2000:]
	}
	return fmt.Errorf("%s: %v\n%s\nserver log (tail):\n%s", strings.Join(argv, " "), err, out, logTail)
}

// serverBin finds the directory of initdb and pg_ctl, and fails t when there
// is none.
func serverBin(t testing.TB) string {
	t.Helper()
	var dirs []string
	if d := os.Getenv(EnvBin); d != "" {
		dirs = append(dirs, d)
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(found, func(a, b string) int { return versionOf(b) - versionOf(a) })
	dirs = append(dirs, found...)
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	t.Fatalf("pgtest: initdb and pg_ctl not found; install the PostgreSQL server or set %s", EnvBin)
	return ""
}

// versionOf returns the major version in /usr/lib/postgresql/<v>/bin.
func versionOf(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
