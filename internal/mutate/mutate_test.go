package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// root is the module root, seen from this package's directory.
const root = "../.."

// TestCatalogApplies checks, without building or running anything, that
// every mutation still applies to the library as it is: its old snippet
// occurs exactly once in its file, the mutated file still parses, and the
// tests it names exist. A library change that moves a snippet fails here,
// in the ordinary test run, rather than silently emptying the mutation run.
func TestCatalogApplies(t *testing.T) {
	names := map[string]bool{}
	tests := map[string]map[string]bool{} // package dir -> top-level tests
	for _, m := range catalog {
		t.Run(m.Name, func(t *testing.T) {
			if m.Name == "" || strings.ContainsAny(m.Name, " \t/") {
				t.Fatalf("name %q must be non-empty, without spaces or slashes", m.Name)
			}
			if names[m.Name] {
				t.Fatalf("name %q is used twice", m.Name)
			}
			names[m.Name] = true
			if m.Breaks == "" {
				t.Error("Breaks must say which promise the mutation breaks")
			}
			if m.Old == m.New {
				t.Error("New equals Old: nothing is planted")
			}
			src, err := m.apply(root)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := parser.ParseFile(token.NewFileSet(), m.File, src, parser.SkipObjectResolution); err != nil {
				t.Fatalf("the mutated %s does not parse: %v", m.File, err)
			}
			if len(m.Tests) == 0 {
				t.Fatal("Tests is empty")
			}
			dir := filepath.Join(root, filepath.FromSlash(m.Pkg))
			if tests[dir] == nil {
				tests[dir] = testFuncs(t, dir)
			}
			for _, name := range m.Tests {
				if !tests[dir][name] {
					t.Errorf("package %s has no test %s", m.Pkg, name)
				}
			}
		})
	}
}

// testFuncs returns the names of the top-level tests and fuzz targets of
// the package in dir.
func testFuncs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in %s: %v", dir, err)
	}
	out := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil &&
				(strings.HasPrefix(fn.Name.Name, "Test") || strings.HasPrefix(fn.Name.Name, "Fuzz")) {
				out[fn.Name.Name] = true
			}
		}
	}
	return out
}

func TestFirstFailure(t *testing.T) {
	out := []byte(`--- FAIL: TestLease (0.05s)
    --- FAIL: TestLease/re_entering_our_own_lease_is_fine (0.02s)
        lease_test.go:83: boom
    --- FAIL: TestLease/other (0.01s)
--- FAIL: TestKeeper (0.01s)
FAIL
`)
	if got, want := firstFailure(out, nil), "TestLease/re_entering_our_own_lease_is_fine"; got != want {
		t.Errorf("firstFailure = %q, want %q", got, want)
	}
	timeout := []byte("panic: test timed out after 3m0s\n\trunning tests:\n")
	if got := firstFailure(timeout, nil); !strings.HasPrefix(got, "timeout: ") {
		t.Errorf("firstFailure of a timeout = %q", got)
	}
}

// TestNarrowTests keeps the matching tests of each mutation and drops the
// mutations left with none.
func TestNarrowTests(t *testing.T) {
	ms := []mutation{{Name: "a", Tests: []string{"TestSimulation", "TestLease"}}, {Name: "b", Tests: []string{"TestSlots"}}}
	got, err := narrowTests(ms, "^TestSimulation$")
	if err != nil || len(got) != 1 || got[0].Name != "a" || len(got[0].Tests) != 1 || got[0].Tests[0] != "TestSimulation" {
		t.Fatalf("narrowTests = %+v, %v", got, err)
	}
	if len(ms[0].Tests) != 2 {
		t.Fatalf("narrowTests changed its input: %+v", ms[0])
	}
	if _, err := narrowTests(ms, "^TestNone$"); err == nil {
		t.Fatal("a pattern that matches no test must be an error")
	}
}
