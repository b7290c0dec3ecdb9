package runlease_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestErrorCodesAreUniqueAndDocumented reads every Code* constant of the
// package's source: no two errors may share a code (callers switch on them),
// and each must have its row in the table of error codes, docs/errors.md.
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
	readme, err := os.ReadFile(filepath.Join("docs", "errors.md"))
	require.NoError(t, err)
	for code, name := range byCode {
		assert.Contains(t, string(readme), "| "+code+" |", "%s (%s) has no row in docs/errors.md", code, name)
	}
}

// sentinels lists the package's sentinels err matches.
func sentinels(err error) []string {
	var out []string
	for name, s := range map[string]error{
		"ErrInvalidArgument": runlease.ErrInvalidArgument, "ErrCorruptRow": runlease.ErrCorruptRow,
		"ErrFenceExhausted": runlease.ErrFenceExhausted, "ErrStoreLocked": runlease.ErrStoreLocked,
		"ErrStorage": runlease.ErrStorage, "ErrSchemaMismatch": runlease.ErrSchemaMismatch,
		"ErrStoreClosed": runlease.ErrStoreClosed, "ErrLeaseLost": runlease.ErrLeaseLost,
		"ErrConcurrencyLimit": runlease.ErrConcurrencyLimit, "ErrSlotLost": runlease.ErrSlotLost,
		"ErrConditionFailed": runlease.ErrConditionFailed, "ErrKeeperStopped": runlease.ErrKeeperStopped,
	} {
		if errors.Is(err, s) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// TestAnUnknownAcquisitionMatchesOneSentinel: errors.go promises
// "Every error returned by this package matches exactly one of them with
// errors.Is". An acquisition whose write may have landed on the last fence
// and whose read-back fails is an unknown outcome, matching ErrStorage
// alone, never ErrFenceExhausted ("refused: nothing was written"). A
// corrupt row read back is a refusal: whatever landed was overwritten.
func TestAnUnknownAcquisitionMatchesOneSentinel(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	t.Run("fence_exhausted", func(t *testing.T) {
		t.Parallel()
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		put(t, f.Store, "runlease:r2", `{"holder":"","fence":`+strconv.FormatUint(math.MaxUint64-1, 10)+`,"until_ms":0}`)
		f.Next(testkit.Fault{Apply: true},
			testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() { f.FailReads(1) }})
		_, err := runlease.Acquire(ctx, f, "r2", "B", runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
		require.Equal(t, []string{"ErrStorage"}, sentinels(err), "%v", err)
	})
	t.Run("corrupt_row", func(t *testing.T) {
		t.Parallel()
		// The re-entry's takeover lands, reply lost, and before it reads
		// the row back an operator's tool overwrites it with one that does
		// not parse.
		f, clk := &testkit.Faulty{Store: newSQLite(t)}, testkit.NewClock(epoch)
		_, err := runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		f.Next(testkit.Fault{Apply: true},
			testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS"), Then: func() {
				raw := get(t, f.Store, "runlease:r1")
				ok, err := f.Store.MetaCAS(ctx, "runlease:r1", &raw, "garbage")
				require.NoError(t, err)
				require.True(t, ok)
			}})
		_, err = runlease.Acquire(ctx, f, "r1", "A", runlease.WithClock(clk.Now))
		// The row read is not a lease's: whatever landed was overwritten,
		// so the refusal stands, and matches that sentinel alone.
		require.ErrorIs(t, err, runlease.ErrCorruptRow)
		require.NotErrorIs(t, err, runlease.ErrOutcomeUnknown)
		require.Equal(t, []string{"ErrCorruptRow"}, sentinels(err), "%v", err)
	})
}
