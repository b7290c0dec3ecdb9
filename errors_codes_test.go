package runlease_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestErrorCodesAreUniqueAndDocumented reads every Code* constant of the
// package's source: no two errors may share a code (callers switch on them),
// and each must have its row in the README's table of error codes.
func TestErrorCodesAreUniqueAndDocumented(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	byCode := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			spec, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, id := range spec.Names {
				if !strings.HasPrefix(id.Name, "Code") || i >= len(spec.Values) {
					continue
				}
				lit, ok := spec.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				code, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				if !strings.HasPrefix(code, "RUN-E") {
					continue
				}
				if other, dup := byCode[code]; dup {
					t.Errorf("%s and %s share the code %s", other, id.Name, code)
				}
				byCode[code] = id.Name
			}
			return true
		})
	}
	require.NotEmpty(t, byCode)
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for code, name := range byCode {
		assert.Contains(t, string(readme), "| "+code+" |", "%s (%s) has no row in the README's error table", code, name)
	}
}
