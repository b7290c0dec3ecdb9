// Command mutate measures how strong runlease's own tests are: it plants
// each bug of its catalog (mutations.go) in turn, runs the tests expected
// to catch it, and reports whether they did.
//
//	go run ./internal/mutate              # every mutation
//	go run ./internal/mutate -list        # the catalog
//	go run ./internal/mutate -run 'slot' -v
//
// A mutation never touches the working tree: the mutated file is written to
// a temporary directory and handed to the go command with -overlay. The
// tests of each mutation are first run on the real code (the baseline), so
// that a test that fails anyway is never counted as catching a bug. A
// mutated build that does not compile is reported as an invalid mutation:
// it proves nothing. The program exits with status 1 when any mutation is
// missed or invalid (a known gap of the catalog is reported but does not
// fail), and 2 when the baseline fails or the catalog cannot be applied.
//
// Postgres mutations need RUNLEASE_TEST_POSTGRES, as the tests do; without
// it they are skipped and listed as such.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// envPostgres names the test server, as internal/pgtest reads it.
const envPostgres = "RUNLEASE_TEST_POSTGRES"

// defaultTimeout bounds one mutation's test run when its entry sets none.
const defaultTimeout = 3 * time.Minute

func main() {
	runFlag := flag.String("run", "", "run only the mutations whose name matches this regular expression")
	list := flag.Bool("list", false, "list the catalog and exit")
	verbose := flag.Bool("v", false, "print the go command's and the tests' output as they run")
	baseline := flag.Bool("baseline", true, "first run each mutation's tests on the real code")
	timeout := flag.Duration("timeout", 0, "override every mutation's test timeout")
	testsFlag := flag.String("tests", "", "keep only the tests whose name matches this regular expression (such as '^TestSimulation' to see what the simulations alone catch), and only the mutations that have one")
	flag.Parse()

	sel, err := selectMutations(catalog, *runFlag)
	if err == nil && *testsFlag != "" {
		sel, err = narrowTests(sel, *testsFlag)
	}
	if err != nil {
		fatalf(2, "%v", err)
	}
	if *list {
		printList(os.Stdout, sel)
		return
	}
	root, err := moduleRoot()
	if err != nil {
		fatalf(2, "%v", err)
	}
	r := &runner{root: root, verbose: *verbose, timeout: *timeout, postgres: os.Getenv(envPostgres) != ""}
	os.Exit(r.runAll(sel, *baseline))
}

// selectMutations returns the mutations whose name matches pattern (all
// when it is empty).
func selectMutations(all []mutation, pattern string) ([]mutation, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("-run: %v", err)
	}
	var out []mutation
	for _, m := range all {
		if re.MatchString(m.Name) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-run %q matches no mutation (see -list)", pattern)
	}
	return out, nil
}

// narrowTests keeps, of each mutation in ms, the tests whose name matches
// pattern, and drops the mutations left with none.
func narrowTests(ms []mutation, pattern string) ([]mutation, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("-tests: %v", err)
	}
	var out []mutation
	for _, m := range ms {
		var keep []string
		for _, name := range m.Tests {
			if re.MatchString(name) {
				keep = append(keep, name)
			}
		}
		if len(keep) > 0 {
			m.Tests = keep
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-tests %q matches no test of the selected mutations", pattern)
	}
	return out, nil
}

func printList(w io.Writer, ms []mutation) {
	for _, m := range ms {
		fmt.Fprintf(w, "%s\t%s\n", m.Name, m.File)
		fmt.Fprintf(w, "    breaks: %s\n", m.Breaks)
		fmt.Fprintf(w, "    tests:  %s\n", strings.Join(m.testCommand(), " "))
		if m.Gap != "" {
			fmt.Fprintf(w, "    known gap: %s\n", m.Gap)
		}
	}
}

// moduleRoot returns the directory of the main module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run inside the runlease module")
	}
	return filepath.Dir(gomod), nil
}

func fatalf(code int, format string, a ...any) {
	fmt.Fprintf(os.Stderr, "mutate: "+format+"\n", a...)
	os.Exit(code)
}

// Outcomes of one mutation.
const (
	caught   = "caught"
	missed   = "MISSED"
	invalid  = "INVALID"
	knownGap = "known gap"
	skipped  = "skipped"
)

type result struct {
	m       mutation
	outcome string
	secs    float64
	detail  string // the first failing test, or why the outcome is what it is
}

type runner struct {
	root     string
	verbose  bool
	timeout  time.Duration
	postgres bool
}

// runAll runs the baseline and then every mutation, one at a time, prints
// the table and returns the exit status.
func (r *runner) runAll(ms []mutation, baseline bool) int {
	start := time.Now()
	// Check every snippet before spending minutes on builds.
	var runnable []mutation
	var results []result
	for _, m := range ms {
		switch {
		case m.Postgres && !r.postgres:
			results = append(results, result{m: m, outcome: skipped, detail: "needs " + envPostgres})
		default:
			if _, err := m.apply(r.root); err != nil {
				results = append(results, result{m: m, outcome: invalid, detail: err.Error()})
				continue
			}
			runnable = append(runnable, m)
		}
	}
	if baseline && len(runnable) > 0 {
		if err := r.baseline(runnable); err != nil {
			fmt.Fprintf(os.Stderr, "mutate: the tests fail on the real code, so no mutation can be judged:\n%v\n", err)
			return 2
		}
	}
	for i, m := range runnable {
		fmt.Fprintf(os.Stderr, "[%d/%d] %s ...", i+1, len(runnable), m.Name)
		res := r.runOne(m)
		fmt.Fprintf(os.Stderr, " %s (%.0fs)\n", res.outcome, res.secs)
		results = append(results, res)
	}
	order := map[string]int{}
	for i, m := range ms {
		order[m.Name] = i
	}
	slices.SortFunc(results, func(a, b result) int { return order[a.m.Name] - order[b.m.Name] })
	return report(os.Stdout, results, time.Since(start))
}

// report prints the table and the summary, and returns the exit status.
func report(w io.Writer, results []result, wall time.Duration) int {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MUTATION\tRESULT\tSECS\tFIRST FAILING TEST / NOTE")
	count := map[string]int{}
	for _, res := range results {
		count[res.outcome]++
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\n", res.m.Name, res.outcome, res.secs, res.detail)
	}
	tw.Flush()
	judged := len(results) - count[skipped]
	fmt.Fprintf(w, "\ncaught %d of %d (missed %d, invalid %d, known gaps %d, skipped %d) in %s\n",
		count[caught], judged, count[missed], count[invalid], count[knownGap], count[skipped],
		wall.Round(time.Second))
	if count[missed] > 0 || count[invalid] > 0 {
		return 1
	}
	return 0
}

// baseline runs, on the real code, the tests of every mutation: once per
// package and environment, with the union of their -run patterns.
func (r *runner) baseline(ms []mutation) error {
	type group struct {
		m mutation // the package, flags and environment of the group, and all their tests
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, m := range ms {
		key := fmt.Sprint(m.Pkg, m.Short, m.Env)
		g := byKey[key]
		if g == nil {
			g = &group{m: m}
			g.m.Tests = nil
			byKey[key] = g
			groups = append(groups, g)
		}
		for _, name := range m.Tests {
			if !slices.Contains(g.m.Tests, name) {
				g.m.Tests = append(g.m.Tests, name)
			}
		}
	}
	var errs []error
	for _, g := range groups {
		m := g.m
		m.Timeout = max(m.Timeout, 10*time.Minute)
		fmt.Fprintf(os.Stderr, "baseline %s %s ...", m.Pkg, strings.Join(m.Env, " "))
		start := time.Now()
		out, err := r.test(m, nil)
		fmt.Fprintf(os.Stderr, " %.0fs\n", time.Since(start).Seconds())
		if err == nil && noTests(out) {
			err = errors.New("-run matches no test")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %v\n%s", strings.Join(m.testCommand(), " "), err, tail(out, 40)))
		}
	}
	return errors.Join(errs...)
}

// runOne plants m and runs its tests.
func (r *runner) runOne(m mutation) (res result) {
	start := time.Now()
	res.m = m
	defer func() { res.secs = time.Since(start).Seconds() }()
	src, err := m.apply(r.root)
	if err != nil {
		res.outcome, res.detail = invalid, err.Error()
		return res
	}
	dir, err := os.MkdirTemp("", "runlease-mutate-")
	if err != nil {
		res.outcome, res.detail = invalid, err.Error()
		return res
	}
	defer os.RemoveAll(dir)
	mutated := filepath.Join(dir, filepath.Base(m.File))
	overlay := filepath.Join(dir, "overlay.json")
	spec, _ := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(r.root, filepath.FromSlash(m.File)): mutated},
	})
	if err := os.WriteFile(mutated, src, 0o644); err != nil {
		res.outcome, res.detail = invalid, err.Error()
		return res
	}
	if err := os.WriteFile(overlay, spec, 0o644); err != nil {
		res.outcome, res.detail = invalid, err.Error()
		return res
	}
	out, err := r.test(m, &testRun{dir: dir, overlay: overlay})
	var be *buildError
	switch {
	case err != nil && errors.As(err, &be):
		res.outcome, res.detail = invalid, "does not build: "+firstLine(be.out)
	case noTests(out):
		res.outcome, res.detail = invalid, "-run matches no test"
	case err == nil && m.Gap != "":
		res.outcome, res.detail = knownGap, m.Gap
	case err == nil:
		res.outcome, res.detail = missed, "every test passed"
	default:
		res.outcome, res.detail = caught, firstFailure(out, err)
		if m.Gap != "" {
			res.detail += " (listed as a known gap: remove its Gap)"
		}
	}
	return res
}

// noTests reports whether a test binary's output says -run matched nothing.
func noTests(out []byte) bool {
	return bytes.Contains(out, []byte("testing: warning: no tests to run"))
}

// testRun is where a mutated build is made.
type testRun struct {
	dir, overlay string
}

type buildError struct{ out []byte }

func (e *buildError) Error() string { return "build failed:\n" + string(e.out) }

// test builds m's test binary (with the overlay of tr, when not nil) and
// runs m's tests with it. It returns the tests' output, and an error when
// the build or the tests failed.
func (r *runner) test(m mutation, tr *testRun) ([]byte, error) {
	dir := ""
	if tr != nil {
		dir = tr.dir
	} else {
		var err error
		if dir, err = os.MkdirTemp("", "runlease-mutate-base-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	}
	bin := filepath.Join(dir, "pkg.test")
	build := []string{"test", "-c", "-o", bin, "-vet=off", "-ldflags=-s -w"}
	if tr != nil {
		build = append(build, "-overlay", tr.overlay)
	}
	build = append(build, m.Pkg)
	cmd := exec.Command("go", build...)
	cmd.Dir = r.root
	if out, err := cmd.CombinedOutput(); err != nil {
		if r.verbose {
			os.Stderr.Write(out)
		}
		return nil, &buildError{out}
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, &buildError{[]byte(m.Pkg + " has no tests")}
	}

	timeout := m.Timeout
	if timeout == 0 {
		timeout = defaultTimeout
	}
	if r.timeout > 0 {
		timeout = r.timeout
	}
	args := []string{"-test.run=" + m.Run(), "-test.count=1", "-test.failfast", "-test.timeout=" + timeout.String()}
	if m.Short {
		args = append(args, "-test.short")
	}
	// The test binary's own timeout panics with a stack; this one is the
	// backstop for a binary that stops answering altogether.
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, bin, args...)
	run.Dir = filepath.Join(r.root, filepath.FromSlash(m.Pkg))
	run.Env = append(os.Environ(), m.Env...)
	run.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	run.Stdout, run.Stderr = &out, &out
	if r.verbose {
		w := io.MultiWriter(&out, os.Stderr)
		run.Stdout, run.Stderr = w, w
	}
	err := run.Run()
	if ctx.Err() != nil {
		return out.Bytes(), fmt.Errorf("killed after %v", timeout+time.Minute)
	}
	return out.Bytes(), err
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// firstFailure names the first failing test in out: the deepest subtest of
// the first top-level test that failed, or what ended the binary.
func firstFailure(out []byte, err error) string {
	s := string(out)
	if strings.Contains(s, "panic: test timed out") {
		return "timeout: " + firstLine([]byte(s[strings.Index(s, "panic: test timed out"):]))
	}
	name := ""
	for _, m := range failLine.FindAllStringSubmatch(s, -1) {
		switch {
		case name == "":
			name = m[1]
		case strings.HasPrefix(m[1], name+"/"):
			name = m[1]
		}
	}
	if name != "" {
		return name
	}
	if i := strings.Index(s, "panic: "); i >= 0 {
		return firstLine([]byte(s[i:]))
	}
	return fmt.Sprintf("test binary failed (%v): %s", err, lastLine(out))
}

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return truncate(line, 120)
		}
	}
	return truncate(s, 120)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return truncate(strings.TrimSpace(lines[len(lines)-1]), 120)
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
