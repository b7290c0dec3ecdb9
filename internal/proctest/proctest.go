// Package proctest starts the running test binary again as a child process
// in a named role, so a test can put a second operating-system process
// against the same file or database: a second opener of an embedded store, a
// node that crashes while it holds a lease, a writer on another connection.
//
// A role is a function registered under a name. The parent starts a child
// with [Start]; the child is the same test binary, run with
// -test.run=^TestHelperProcess$ and the role's name in an environment
// variable, and its TestHelperProcess calls [Dispatch], which runs the role
// and exits the process with the role's exit code. The role talks to the
// parent through its standard output, one line at a time (the parent waits
// for a line with [Child.WaitLine]), through its exit code ([Child.Wait]) and
// through the environment variables the parent passed to Start.
//
// Each test package that uses proctest needs one entry point, and roles
// registered from any file of the test binary:
//
//	func TestHelperProcess(t *testing.T) { proctest.Dispatch(t) }
//
//	func init() { proctest.Register("hold-store", holdStore) }
//
//	func holdStore() int {
//		s, err := runlease.OpenSQLite(os.Getenv("STORE_PATH"))
//		if err != nil {
//			fmt.Fprintln(os.Stderr, err)
//			return 1
//		}
//		defer s.Close()
//		fmt.Println("ready")
//		proctest.WaitRelease() // until the parent calls Release, or dies
//		return 0
//	}
//
// and the parent side:
//
//	child := proctest.Start(t, "hold-store", "STORE_PATH="+path)
//	require.NoError(t, child.WaitLine("ready", 30*time.Second))
//	// … the store is now held by another process …
//	child.Kill() // SIGKILL: a crash, not a clean exit
//
// In the root package of runlease, TestHelperProcess lives in
// store_sqlite_test.go; other test files of that package register their
// roles and reuse it. A package with a TestMain may instead call [RunRole]
// first thing in TestMain.
//
// A child is killed when the test that started it ends, so a failing test
// leaves no process behind, and a child blocked in WaitRelease exits by
// itself if the parent dies.
package proctest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

const (
	// RoleEnv is the environment variable that tells a child its role.
	RoleEnv = "RUNLEASE_PROCTEST_ROLE"

	// EntryTest is the test function a child runs; it must call [Dispatch].
	EntryTest = "TestHelperProcess"

	// ExitUnknownRole is the exit code of a child asked to play a role that
	// no file of the test binary registered.
	ExitUnknownRole = 125
)

var (
	rolesMu sync.Mutex
	roles   = map[string]func() int{}
)

// Register makes fn the role called name. In a child started with that role,
// [Dispatch] or [RunRole] calls fn and exits the process with its result.
// Call Register from an init function or a package-level variable
// declaration, so every process of the test binary knows the same roles. It
// panics if name is empty or already registered, and returns name, so that
// `var roleHold = proctest.Register("hold", hold)` works.
func Register(name string, fn func() int) string {
	if name == "" || fn == nil {
		panic("proctest: Register needs a name and a function")
	}
	rolesMu.Lock()
	defer rolesMu.Unlock()
	if _, dup := roles[name]; dup {
		panic("proctest: role " + name + " registered twice")
	}
	roles[name] = fn
	return name
}

// Role returns the role this process was started to play, or "" when it is
// an ordinary test run rather than a child started by [Start].
func Role() string { return os.Getenv(RoleEnv) }

// RunRole runs this process's role, if it has one, and reports its exit
// code. ok is false in an ordinary test run. A role nobody registered is
// reported on standard error with the code [ExitUnknownRole].
//
//	func TestMain(m *testing.M) {
//		if code, ok := proctest.RunRole(); ok {
//			os.Exit(code)
//		}
//		os.Exit(m.Run())
//	}
func RunRole() (code int, ok bool) {
	name := Role()
	if name == "" {
		return 0, false
	}
	rolesMu.Lock()
	fn := roles[name]
	rolesMu.Unlock()
	if fn == nil {
		fmt.Fprintf(os.Stderr, "proctest: no role %q is registered in this test binary\n", name)
		return ExitUnknownRole, true
	}
	return fn(), true
}

// Dispatch is the body of the TestHelperProcess entry point. In a child it
// runs the role and exits the process with the role's code, so the testing
// package prints nothing after the role's own output; in an ordinary test
// run it skips t.
func Dispatch(t *testing.T) {
	code, ok := RunRole()
	if !ok {
		t.Skip("proctest entry point: runs only in a child started by proctest.Start")
	}
	os.Exit(code)
}

// WaitRelease blocks a child until its standard input is closed: the parent
// called [Child.Release], or the parent died. A role that holds something
// for the parent calls it, rather than blocking forever, so that an
// interrupted test run does not leave it running.
func WaitRelease() {
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// Child is a running child process started by [Start]. Its methods are safe
// for concurrent use.
type Child struct {
	role   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr SyncBuffer

	mu     sync.Mutex
	lines  []string      // every stdout line read so far
	next   int           // index of the first line WaitLine has not consumed
	more   chan struct{} // closed, and replaced, when a line arrives or stdout ends
	exited bool

	done    chan struct{} // closed once the process has exited and been reaped
	waitErr error         // cmd.Wait's result, set before done is closed
}

// Start runs the current test binary as a child playing role, with env
// ("NAME=value" pairs) added to this process's environment. It fails t at
// once if the process cannot be started, and kills the child when t ends if
// it is still running. The child's standard output is read line by line for
// [Child.WaitLine]; its standard error is kept for error messages.
func Start(t testing.TB, role string, env ...string) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.Command(exe, "-test.run=^"+EntryTest+"$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), RoleEnv+"="+role), env...)
	c := &Child{role: role, cmd: cmd, more: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = &c.stderr
	// Once the process has exited, stop waiting for its output after a
	// while even if a grandchild inherited the pipes.
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("proctest: stdout pipe for role %q: %v", role, err)
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatalf("proctest: stdin pipe for role %q: %v", role, err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("proctest: start role %q: %v", role, err)
	}
	go c.read(stdout)
	t.Cleanup(c.Kill)
	return c
}

// read collects stdout lines until the child closes stdout, then reaps the
// child. Wait must not run before the reads finish (os/exec's rule), which
// is why one goroutine does both.
func (c *Child) read(stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		c.mu.Lock()
		c.lines = append(c.lines, sc.Text())
		close(c.more)
		c.more = make(chan struct{})
		c.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, stdout) // a line too long for the scanner must not block the child
	c.waitErr = c.cmd.Wait()
	c.mu.Lock()
	c.exited = true
	close(c.more)
	c.mu.Unlock()
	close(c.done)
}

// Pid returns the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// WaitLine waits until the child prints want as a whole line, and consumes
// the lines up to and including it, so that a second WaitLine for the same
// text waits for its next occurrence. It returns an error, with the child's
// output so far, when timeout passes first or the child exits without
// printing want.
func (c *Child) WaitLine(want string, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		c.mu.Lock()
		for c.next < len(c.lines) {
			line := c.lines[c.next]
			c.next++
			if line == want {
				c.mu.Unlock()
				return nil
			}
		}
		exited, more := c.exited, c.more
		c.mu.Unlock()
		if exited {
			return fmt.Errorf("proctest: child %q (pid %d) exited (%v) without printing %q%s",
				c.role, c.Pid(), c.waitErr, want, c.output())
		}
		select {
		case <-more:
		case <-timer.C:
			return fmt.Errorf("proctest: child %q (pid %d) did not print %q within %v%s",
				c.role, c.Pid(), want, timeout, c.output())
		}
	}
}

// Lines returns every line the child has printed so far.
func (c *Child) Lines() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// Stderr returns what the child has written to its standard error so far.
func (c *Child) Stderr() string { return c.stderr.String() }

// Release closes the child's standard input, which ends [WaitRelease] in
// the child. It does not wait for the child to exit; see [Child.Wait].
func (c *Child) Release() { _ = c.stdin.Close() }

// Wait waits for the child to exit and returns its exit code, which is -1
// when a signal killed it. It returns an error, with the child's output,
// when timeout passes first or the process could not be waited for; the
// child is left running in the first case.
func (c *Child) Wait(timeout time.Duration) (code int, err error) {
	select {
	case <-c.done:
	case <-time.After(timeout):
		return -1, fmt.Errorf("proctest: child %q (pid %d) still running after %v%s",
			c.role, c.Pid(), timeout, c.output())
	}
	var exitErr *exec.ExitError
	if c.waitErr != nil && !errors.As(c.waitErr, &exitErr) {
		return -1, fmt.Errorf("proctest: wait for child %q: %w%s", c.role, c.waitErr, c.output())
	}
	return c.cmd.ProcessState.ExitCode(), nil
}

// Kill kills the child with SIGKILL (on Windows, TerminateProcess), the
// way a crash or an OOM kill ends a process: no deferred call, no cleanup
// in the child runs. It returns once the child has been reaped, so the
// operating system has released everything the child held, such as file
// locks. Killing a child that has already exited does nothing.
func (c *Child) Kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Kill()
	_ = c.stdin.Close()
	<-c.done
}

// output formats the child's output for an error message.
func (c *Child) output() string {
	return fmt.Sprintf("\nstdout: %q\nstderr:\n%s", c.Lines(), c.Stderr())
}

// SyncBuffer is a bytes.Buffer safe for one writer and many readers: what
// a child process or a command writes while a test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
