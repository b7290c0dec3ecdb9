package runlease_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// lockDocPackages are the directories whose locks CONCURRENCY.md's lock
// table must list, and the prefix their locks are named with there. A
// directory that does not exist is skipped.
var lockDocPackages = []struct{ dir, prefix string }{
	{".", ""},
	{filepath.Join("internal", "wakeup"), "wakeup."},
}

// TestConcurrencyDocListsEveryLock checks that CONCURRENCY.md's lock table
// has one row for every sync.Mutex and sync.RWMutex of the library's code,
// and none for a lock that is gone. A lock is named Type.field for a
// struct field (an embedded one is named by its type, Mutex or RWMutex),
// var.field for a field of a package-level var's struct, var for a
// package-level var of its own, and Func.var (Recv.Func.var for a method)
// for a local variable.
func TestConcurrencyDocListsEveryLock(t *testing.T) {
	inCode := map[string]string{} // lock → file
	for _, p := range lockDocPackages {
		if _, err := os.Stat(p.dir); err != nil {
			continue
		}
		files, err := filepath.Glob(filepath.Join(p.dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			for _, name := range locksIn(t, file) {
				inCode[p.prefix+name] = filepath.ToSlash(file)
			}
		}
	}
	if len(inCode) == 0 {
		t.Fatal("found no lock in the code: the scan is broken")
	}
	if testing.Verbose() {
		for _, name := range slices.Sorted(maps.Keys(inCode)) {
			t.Logf("lock %s (%s)", name, inCode[name])
		}
	}

	doc, err := os.ReadFile("CONCURRENCY.md")
	if err != nil {
		t.Fatal(err)
	}
	inDoc, err := lockTableRows(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	var missing, stale []string
	for name, file := range inCode {
		if _, ok := inDoc[name]; !ok {
			missing = append(missing, name+" ("+file+")")
		}
	}
	for name := range inDoc {
		if _, ok := inCode[name]; !ok {
			stale = append(stale, name)
		}
	}
	slices.Sort(missing)
	slices.Sort(stale)
	for _, m := range missing {
		t.Errorf("lock %s is not in CONCURRENCY.md's lock table", m)
	}
	for _, s := range stale {
		t.Errorf("CONCURRENCY.md's lock table lists %s, which is no lock in the code", s)
	}
	for name, file := range inCode {
		if got := inDoc[name]; got != "" && got != file {
			t.Errorf("CONCURRENCY.md's lock table puts %s in %s; it is in %s", name, got, file)
		}
	}
}

// TestLocksInFindsEveryForm checks the scan of TestConcurrencyDocListsEveryLock
// on each way a lock can be declared.
func TestLocksInFindsEveryForm(t *testing.T) {
	src := `package p

import (
	"sync"
	s2 "sync"
)

type A struct {
	mu   sync.Mutex
	rw   *sync.RWMutex
	a, b sync.Mutex
	sync.Mutex
	*s2.RWMutex
	in   struct{ mu sync.Mutex }
	n    int
}

type B struct{ mu s2.Mutex }

var pkgVar = struct {
	mu sync.Mutex
	m  map[string]int
}{m: map[string]int{}}

var typed struct{ mu sync.RWMutex }

var (
	plain sync.Mutex
	lit   = sync.Mutex{}
	ptr   = &sync.RWMutex{}
	other int
)

func f() {
	var mu sync.Mutex
	rw := new(sync.RWMutex)
	x := sync.Mutex{}
	_, _, _ = &mu, rw, &x
}

func (a *A) m() {
	var mu sync.Mutex
	_ = &mu
}
`
	file := filepath.Join(t.TempDir(), "p.go")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got := locksIn(t, file)
	slices.Sort(got)
	want := []string{"A.Mutex", "A.RWMutex", "A.a", "A.b", "A.in.mu", "A.m.mu", "A.mu", "A.rw",
		"B.mu", "f.mu", "f.rw", "f.x", "lit", "pkgVar.mu", "plain", "ptr", "typed.mu"}
	if !slices.Equal(got, want) {
		t.Errorf("locks found:\n%v\nwant:\n%v", got, want)
	}
}

// lockTableRows returns the locks named by the rows of the table under the
// heading "## Locks" of doc, each with the file its second column names.
func lockTableRows(doc string) (map[string]string, error) {
	lines := strings.Split(doc, "\n")
	start := slices.Index(lines, "## Locks")
	if start < 0 {
		return nil, errorString(`CONCURRENCY.md has no "## Locks" heading`)
	}
	rows := map[string]string{}
	inTable := false
	for _, line := range lines[start+1:] {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break // the table ended
			}
			if strings.HasPrefix(line, "#") {
				break
			}
			continue
		}
		if !inTable { // the header row
			inTable = true
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		name := strings.Trim(strings.TrimSpace(cells[0]), "`")
		if strings.Trim(name, "-: ") == "" { // the separator row
			continue
		}
		if _, twice := rows[name]; twice {
			return nil, errorString("CONCURRENCY.md's lock table lists " + name + " twice")
		}
		file := ""
		if len(cells) > 1 {
			file = strings.Trim(strings.TrimSpace(cells[1]), "`")
		}
		rows[name] = file
	}
	if len(rows) == 0 {
		return nil, errorString(`CONCURRENCY.md's "## Locks" table has no rows`)
	}
	return rows, nil
}

type errorString string

func (e errorString) Error() string { return string(e) }

// locksIn returns the names of the locks declared in file.
func locksIn(t *testing.T, file string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	syncNames := map[string]bool{} // what the file calls package sync
	for _, imp := range f.Imports {
		if path, _ := strconv.Unquote(imp.Path.Value); path == "sync" {
			name := "sync"
			if imp.Name != nil {
				name = imp.Name.Name
			}
			syncNames[name] = true
		}
	}
	if len(syncNames) == 0 {
		return nil
	}
	isLock := func(e ast.Expr) (string, bool) {
		if star, ok := e.(*ast.StarExpr); ok {
			e = star.X
		}
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok || !syncNames[pkg.Name] || (sel.Sel.Name != "Mutex" && sel.Sel.Name != "RWMutex") {
			return "", false
		}
		return sel.Sel.Name, true
	}
	var names []string
	// fields adds the locks among the fields of st, and of the structs
	// nested in it, named under prefix.
	var fields func(prefix string, st *ast.StructType)
	fields = func(prefix string, st *ast.StructType) {
		for _, fld := range st.Fields.List {
			if inner, ok := fld.Type.(*ast.StructType); ok {
				for _, n := range fld.Names {
					fields(prefix+n.Name+".", inner)
				}
				continue
			}
			typ, ok := isLock(fld.Type)
			if !ok {
				continue
			}
			if len(fld.Names) == 0 {
				names = append(names, prefix+typ) // embedded
			}
			for _, n := range fld.Names {
				names = append(names, prefix+n.Name)
			}
		}
	}
	// decl adds the locks of a type or var declaration, named under prefix.
	decl := func(prefix string, gd *ast.GenDecl) {
		for _, spec := range gd.Specs {
			switch s := spec.(type) {
			case *ast.TypeSpec:
				if st, ok := s.Type.(*ast.StructType); ok {
					fields(prefix+s.Name.Name+".", st)
				}
			case *ast.ValueSpec:
				for i, n := range s.Names {
					switch {
					case s.Type != nil:
						if _, ok := isLock(s.Type); ok {
							names = append(names, prefix+n.Name)
						} else if st, ok := s.Type.(*ast.StructType); ok {
							fields(prefix+n.Name+".", st)
						}
					case i < len(s.Values):
						v := s.Values[i]
						if u, ok := v.(*ast.UnaryExpr); ok && u.Op == token.AND {
							v = u.X
						}
						if lit, ok := v.(*ast.CompositeLit); ok {
							if _, ok := isLock(lit.Type); ok {
								names = append(names, prefix+n.Name)
							} else if st, ok := lit.Type.(*ast.StructType); ok {
								fields(prefix+n.Name+".", st)
							}
						}
					}
				}
			}
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.GenDecl:
			decl("", d)
		case *ast.FuncDecl:
			if d.Body == nil {
				continue
			}
			prefix := d.Name.Name + "."
			if d.Recv != nil && len(d.Recv.List) > 0 {
				recv := d.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if idx, ok := recv.(*ast.IndexExpr); ok { // a generic receiver
					recv = idx.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					prefix = id.Name + "." + prefix
				}
			}
			ast.Inspect(d.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.DeclStmt:
					if gd, ok := n.Decl.(*ast.GenDecl); ok {
						decl(prefix, gd)
					}
				case *ast.AssignStmt:
					if n.Tok != token.DEFINE {
						break
					}
					for i, rhs := range n.Rhs {
						if u, ok := rhs.(*ast.UnaryExpr); ok && u.Op == token.AND {
							rhs = u.X
						}
						if call, ok := rhs.(*ast.CallExpr); ok && len(call.Args) == 1 {
							if fn, ok := call.Fun.(*ast.Ident); ok && fn.Name == "new" {
								rhs = &ast.CompositeLit{Type: call.Args[0]}
							}
						}
						lit, ok := rhs.(*ast.CompositeLit)
						if !ok || i >= len(n.Lhs) {
							continue
						}
						id, ok := n.Lhs[i].(*ast.Ident)
						if !ok {
							continue
						}
						if _, ok := isLock(lit.Type); ok {
							names = append(names, prefix+id.Name)
						} else if st, ok := lit.Type.(*ast.StructType); ok {
							fields(prefix+id.Name+".", st)
						}
					}
				}
				return true
			})
		}
	}
	return names
}
