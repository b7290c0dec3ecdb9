package pgtest

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
)

// skipped counts the tests of this test binary that DSN skipped.
var skipped atomic.Int64

// Main runs m, the tests of a package with Postgres tests, and afterwards
// says how many of them skipped for want of RUNLEASE_TEST_POSTGRES, so that
// a plain `go test ./...` does not report "ok" for tests that never ran
// without saying so. A passing package's output is hidden by the go
// command unless -v is given, so the line also goes to the terminal the
// tests were started from, when there is one; CI logs get it from the -v
// output, where .ci/run looks for it and fails.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if n := skipped.Load(); n > 0 {
		line := skipNotice(n, packageOf(os.Args[0]))
		fmt.Fprintln(os.Stderr, line)
		if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			io.WriteString(tty, line+"\n")
			tty.Close()
		}
	}
	os.Exit(code)
}

// skipNotice is the line Main prints for n skipped tests of pkg.
func skipNotice(n int64, pkg string) string {
	tests := "tests"
	if n == 1 {
		tests = "test"
	}
	return fmt.Sprintf("%s: %d Postgres %s skipped: set %s=%s to run them", pkg, n, tests, EnvDSN, ExampleDSN)
}

// packageOf names the package under test: the go command builds its test
// binary as the main package "<import path>.test". It falls back to the
// binary's name.
func packageOf(binary string) string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Path != "" {
		return strings.TrimSuffix(info.Path, ".test")
	}
	return filepath.Base(binary)
}
