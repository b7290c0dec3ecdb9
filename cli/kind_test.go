package cli

import (
	"context"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// liteKind is a StoreKind for the tests: --lite PATH opens the embedded
// store at PATH under another flag, as a module's store would be opened,
// and --lite-tag NAME is one of its further flags.
func liteKind(opened *[]string) StoreKind {
	return StoreKind{
		Flag:  "lite",
		Env:   "RUNLEASE_LITE",
		Usage: "a test store's `PATH`",
		Register: func(fs *flag.FlagSet) Opener {
			tag := fs.String("lite-tag", "plain", "a `NAME` for the store")
			return func(ctx context.Context, value string) (runlease.ClosableStore, string, error) {
				s, err := runlease.OpenSQLite(value)
				if err != nil {
					return nil, "", err
				}
				*opened = append(*opened, value+"/"+*tag)
				return s, "lite(" + *tag + ")", nil
			}
		},
	}
}

// runKinds runs a command line with kinds added and env as the
// environment.
func runKinds(t *testing.T, env map[string]string, kinds []StoreKind, args ...string) result {
	t.Helper()
	if env == nil {
		env = map[string]string{}
	}
	return session{env: env, kinds: kinds}.run(t, args...)
}

func TestStoreKind(t *testing.T) {
	t.Run("its flag opens its store on every command", func(t *testing.T) {
		path := newDB(t)
		var opened []string
		kinds := []StoreKind{liteKind(&opened)}
		r := runKinds(t, nil, kinds, "status", "--lite", path, "--lite-tag", "blue")
		require.Equal(t, exitCorrupt, r.code, r.stderr) // the seeded store holds a corrupt row
		assert.Contains(t, r.stdout, runLive)
		assert.Contains(t, r.stdout, "lite(blue)")
		assert.Equal(t, []string{path + "/blue"}, opened)

		r = runKinds(t, nil, kinds, "peek", runLive, "--lite", path)
		assert.Equal(t, exitHeld, r.code, r.stderr)
		r = runKinds(t, nil, kinds, "release", runLive, "--lite", path, "--force", "--yes")
		require.Equal(t, exitOK, r.code, r.stderr)
		r = runKinds(t, nil, kinds, "peek", runLive, "--lite", path)
		assert.Equal(t, exitFree, r.code, r.stderr)
		r = runKinds(t, nil, kinds, "prune", "--lite", path, "--older-than", "1h", "--yes")
		require.Equal(t, exitOK, r.code, r.stderr)
		r = runKinds(t, nil, kinds, "peek", runExpired, "--lite", path)
		assert.Equal(t, exitAbsent, r.code, "prune removed the row expired two hours ago: %s", r.stderr)
		assert.Len(t, opened, 6)
	})

	t.Run("serve shows its store by the name it gave", func(t *testing.T) {
		path := newDB(t)
		var opened []string
		srv := startServeIn(t, session{env: map[string]string{}, kinds: []StoreKind{liteKind(&opened)}}, "--lite", path)
		code, body := httpGet(t, srv.url, "")
		assert.Equal(t, 200, code)
		assert.Contains(t, body, "lite(plain)")
		assert.Contains(t, body, runLive)
		assert.Equal(t, exitOK, srv.stop().code)
	})

	t.Run("its environment variable names the store when no flag does", func(t *testing.T) {
		path := newDB(t)
		var opened []string
		kinds := []StoreKind{liteKind(&opened)}
		r := runKinds(t, map[string]string{"RUNLEASE_LITE": path}, kinds, "peek", runLive)
		assert.Equal(t, exitHeld, r.code, r.stderr)
		assert.Equal(t, []string{path + "/plain"}, opened)

		// A store flag, or $RUNLEASE_POSTGRES, wins over the variable.
		r = runKinds(t, map[string]string{"RUNLEASE_LITE": "/nonexistent/x.db"}, kinds, "peek", runLive, "--db", path)
		assert.Equal(t, exitHeld, r.code, r.stderr)
		assert.Len(t, opened, 1, "--db was opened, not the kind's store")
	})

	t.Run("the built-in stores are unchanged beside it", func(t *testing.T) {
		path := newDB(t)
		var opened []string
		r := runKinds(t, nil, []StoreKind{liteKind(&opened)}, "peek", runLive, "--db", path)
		assert.Equal(t, exitHeld, r.code, r.stderr)
		assert.Empty(t, opened)
	})

	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"with --db", nil, []string{"peek", "r", "--lite", "a.db", "--db", "b.db"}, "--db and --lite name two stores"},
		{"with --postgres", nil, []string{"peek", "r", "--lite", "a.db", "--postgres", "postgres://h/d"}, "--postgres and --lite name two stores"},
		{"with --table", nil, []string{"peek", "r", "--lite", "a.db", "--table", "t"}, "--table applies to a Postgres store"},
		{"empty", nil, []string{"peek", "r", "--lite", ""}, "--lite needs a value"},
		{"its further flag alone", nil, []string{"peek", "r", "--lite-tag", "x"}, "--lite-tag applies to the store of --lite"},
		{"a bad timeout", nil, []string{"peek", "r", "--lite", "a.db", "--timeout", "0s"}, "--timeout 0s"},
		{"two variables", map[string]string{"RUNLEASE_LITE": "a.db", "RUNLEASE_LITE2": "b.db"}, []string{"peek", "r"}, "$RUNLEASE_LITE and $RUNLEASE_LITE2 name two stores"},
	} {
		t.Run("a usage error: "+tc.name, func(t *testing.T) {
			var opened []string
			second := liteKind(&opened)
			second.Flag, second.Env = "lite2", "RUNLEASE_LITE2"
			second.Register = func(fs *flag.FlagSet) Opener {
				return liteKind(&opened).Register(flag.NewFlagSet("x", flag.ContinueOnError))
			}
			r := runKinds(t, tc.env, []StoreKind{liteKind(&opened), second}, tc.args...)
			assert.Equal(t, exitUsage, r.code, r.stderr)
			assert.Contains(t, r.stderr, tc.want)
			assert.Empty(t, opened, "nothing is opened on a usage error")
		})
	}

	t.Run("an invalid kind is refused before any command runs", func(t *testing.T) {
		for _, k := range []StoreKind{
			{Flag: "db", Register: liteKind(new([]string)).Register},
			{Flag: "Etcd", Register: liteKind(new([]string)).Register},
			{Flag: "etcd"},
		} {
			r := runKinds(t, nil, []StoreKind{k}, "peek", "r", "--db", "x.db")
			assert.Equal(t, exitUsage, r.code, k.Flag)
			assert.Contains(t, r.stderr, "store kind", k.Flag)
		}
		twice := liteKind(new([]string))
		r := runKinds(t, nil, []StoreKind{twice, twice}, "help")
		assert.Equal(t, exitUsage, r.code)
		assert.Contains(t, r.stderr, "--lite is taken")
	})

	t.Run("help names its flag and variable", func(t *testing.T) {
		r := runKinds(t, nil, []StoreKind{liteKind(new([]string))}, "help")
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.Contains(t, r.stdout, "--lite PATH\n")
		assert.Contains(t, r.stdout, "a test store's PATH (default $RUNLEASE_LITE)")
		r = runKinds(t, nil, []StoreKind{liteKind(new([]string))}, "peek", "--help")
		assert.Contains(t, r.stdout+r.stderr, "-lite-tag")
	})
}

// TestStoreKindsCannotTakeACommandsFlag checks builtinFlags against the
// flags the commands define: a StoreKind taking one of them would make a
// command's flag set panic.
func TestStoreKindsCannotTakeACommandsFlag(t *testing.T) {
	seen := 0
	c := newCLI(t.Context(), strings.NewReader(""), io.Discard, io.Discard)
	for name, fs := range c.flagSets() {
		fs.VisitAll(func(f *flag.Flag) {
			assert.True(t, builtinFlags[f.Name], "%s --%s is not in builtinFlags", name, f.Name)
			seen++
		})
	}
	assert.Greater(t, seen, 20, "the flags of the commands were found")
}
