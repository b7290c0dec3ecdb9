package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/areev/runlease"
	"github.com/areev/runlease/cli"
	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/etcdstore/internal/etcdtest"
)

// cluster is the 3-member cluster the tests share, each under a prefix of
// its own.
var (
	cluster    *etcdtest.Cluster
	clusterErr error
	prefixes   atomic.Int64
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "etcd-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cluster, clusterErr = etcdtest.Start(dir)
	if clusterErr != nil && os.Getenv("CI") == "true" {
		fmt.Fprintf(os.Stderr, "CI=true requires a real etcd cluster, and none could be started: %v\n", clusterErr)
		os.Exit(1)
	}
	code := m.Run()
	if cluster != nil {
		cluster.Stop()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one command line did.
type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(t.Context(), args, strings.NewReader(""), &out, &errb, etcdKind())
	return result{code, out.String(), errb.String()}
}

// seeded returns the endpoints and prefix of a store holding a live lease
// "live" (with a slot in scope "mem"), an expired one "old" that ended two
// hours ago, and a released one "done".
func seeded(t *testing.T) (endpoints, prefix string) {
	t.Helper()
	if cluster == nil {
		t.Skipf("no etcd cluster (set CI=true to make this a failure): %v", clusterErr)
	}
	// A prefix of its own each time, so that -count=N runs on a cluster
	// that still holds the rows of the runs before.
	prefix = fmt.Sprintf("cli/%s/%d/", strings.ReplaceAll(t.Name(), "/", "_"), prefixes.Add(1))
	s, err := etcdstore.Open(t.Context(), cluster.Endpoints(), etcdstore.WithPrefix(prefix))
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	_, err = runlease.Acquire(ctx, s, "live", "alice#n1", runlease.WithTTL(time.Minute))
	require.NoError(t, err)
	_, err = runlease.ClaimSlots(ctx, s, "live", []runlease.Scope{runlease.MemScope(2)}, runlease.WithTTL(time.Minute))
	require.NoError(t, err)
	past := runlease.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) })
	_, err = runlease.Acquire(ctx, s, "old", "bob#n2", runlease.WithTTL(time.Minute), past)
	require.NoError(t, err)
	done, err := runlease.Acquire(ctx, s, "done", "bob#n2")
	require.NoError(t, err)
	require.NoError(t, done.Release(ctx))
	return strings.Join(cluster.Endpoints(), ","), prefix
}

func TestEtcdFlag(t *testing.T) {
	t.Run("status reads every lease and slot", func(t *testing.T) {
		eps, prefix := seeded(t)
		r := runCLI(t, "status", "--etcd", eps, "--etcd-prefix", prefix, "--json")
		require.Equal(t, 0, r.code, r.stderr)
		var doc struct {
			Store  string `json:"store"`
			Leases []struct {
				RunID  string `json:"run_id"`
				State  string `json:"state"`
				Holder string `json:"holder"`
			} `json:"leases"`
			Scopes []struct {
				Scope string `json:"scope"`
				Used  int    `json:"used"`
			} `json:"scopes"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
		assert.Equal(t, "etcd:"+eps+" prefix "+prefix, doc.Store)
		states := map[string]string{}
		for _, l := range doc.Leases {
			states[l.RunID] = l.State
		}
		assert.Equal(t, map[string]string{"live": "live", "old": "expired", "done": "released"}, states)
		require.Len(t, doc.Scopes, 1)
		assert.Equal(t, "mem", doc.Scopes[0].Scope)
		assert.Equal(t, 1, doc.Scopes[0].Used)
	})

	t.Run("peek, release and prune act on the cluster", func(t *testing.T) {
		eps, prefix := seeded(t)
		store := []string{"--etcd", eps, "--etcd-prefix", prefix}
		r := runCLI(t, append([]string{"peek", "live"}, store...)...)
		assert.Equal(t, 0, r.code, "held: %s", r.stderr)
		r = runCLI(t, append([]string{"release", "live", "--force", "--yes"}, store...)...)
		require.Equal(t, 0, r.code, r.stderr)
		r = runCLI(t, append([]string{"peek", "live"}, store...)...)
		assert.Equal(t, 3, r.code, "free after the release: %s", r.stderr)
		r = runCLI(t, append([]string{"prune", "--older-than", "1h", "--yes"}, store...)...)
		require.Equal(t, 0, r.code, r.stderr)
		r = runCLI(t, append([]string{"peek", "old"}, store...)...)
		assert.Equal(t, 4, r.code, "the row that ended two hours ago is pruned: %s", r.stderr)

		s, err := etcdstore.Open(t.Context(), cluster.Endpoints(), etcdstore.WithPrefix(prefix))
		require.NoError(t, err)
		defer s.Close()
		l, err := runlease.Acquire(t.Context(), s, "live", "carol#n3")
		require.NoError(t, err)
		assert.EqualValues(t, 2, l.Fence(), "a force release keeps the fence")
	})

	t.Run("$RUNLEASE_ETCD names the cluster when no flag does", func(t *testing.T) {
		eps, prefix := seeded(t)
		t.Setenv("RUNLEASE_ETCD", eps)
		r := runCLI(t, "peek", "live", "--etcd-prefix", prefix)
		assert.Equal(t, 0, r.code, r.stderr)
		r = runCLI(t, "peek", "live", "--etcd-prefix", "elsewhere/")
		assert.Equal(t, 4, r.code, "another prefix is another store: %s", r.stderr)
	})

	t.Run("a cluster that does not answer is reported within --timeout", func(t *testing.T) {
		r := runCLI(t, "status", "--etcd", "127.0.0.1:1", "--timeout", "1s")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, r.stderr, "nothing answered within --timeout 1s")
		assert.Contains(t, r.stderr, "RUN-E011")
	})

	t.Run("a user logs in with the password of the environment, never printed", func(t *testing.T) {
		eps, prefix := seeded(t)
		enableAuth(t, "root", "hunter2-secret")
		t.Setenv(envPassword, "hunter2-secret")
		r := runCLI(t, "peek", "live", "--etcd", eps, "--etcd-prefix", prefix, "--etcd-user", "root")
		assert.Equal(t, 0, r.code, r.stderr)
		assert.NotContains(t, r.stdout+r.stderr, "hunter2-secret")

		t.Setenv(envPassword, "")
		r = runCLI(t, "peek", "live", "--etcd", eps, "--etcd-prefix", prefix, "--timeout", "3s")
		assert.Equal(t, 1, r.code, "without the user, the cluster refuses: %s", r.stderr)
		t.Setenv(envPassword, "wrong-hunter3")
		r = runCLI(t, "peek", "live", "--etcd", eps, "--etcd-prefix", prefix, "--etcd-user", "root", "--timeout", "3s")
		assert.Equal(t, 1, r.code, r.stderr)
		assert.Contains(t, r.stderr, "RUN-E011")
		assert.NotContains(t, r.stdout+r.stderr, "wrong-hunter3")
	})

	t.Run("bad input is a usage error", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			env  string
			want string
		}{
			{[]string{"status", "--etcd", " , "}, "", "names no endpoint"},
			{[]string{"status", "--etcd", "127.0.0.1:1", "--etcd-prefix", "bad\x00prefix"}, "", "prefix"},
			{[]string{"status", "--etcd", "127.0.0.1:1", "--db", "x.db"}, "", "--db and --etcd name two stores"},
			{[]string{"status", "--etcd-prefix", "p/", "--db", "x.db"}, "", "--etcd-prefix applies to the store of --etcd"},
			{[]string{"status", "--etcd", "127.0.0.1:1"}, "pw", "--etcd-user is not"},
		} {
			t.Setenv(envPassword, tc.env)
			r := runCLI(t, tc.args...)
			assert.Equal(t, 2, r.code, "%q: %s", tc.args, r.stderr)
			assert.Contains(t, r.stderr, tc.want, tc.args)
		}
	})
}

// enableAuth turns authentication on for the cluster, with user as its
// root, until t ends.
func enableAuth(t *testing.T, user, password string) {
	t.Helper()
	c, err := cluster.Client()
	require.NoError(t, err)
	defer c.Close()
	ctx := t.Context()
	_, err = c.UserAdd(ctx, user, password)
	require.NoError(t, err)
	_, err = c.UserGrantRole(ctx, user, "root")
	require.NoError(t, err)
	_, err = c.AuthEnable(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), Username: user, Password: password,
			DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		require.NoError(t, err)
		defer c.Close()
		ctx := context.Background()
		_, err = c.AuthDisable(ctx)
		require.NoError(t, err)
		_, err = c.UserDelete(ctx, user)
		require.NoError(t, err)
	})
}

// TestEtcdFlagLeavesOtherStoresAlone runs the binary's built-in stores, so
// that adding --etcd changes nothing for them.
func TestEtcdFlagLeavesOtherStoresAlone(t *testing.T) {
	path := t.TempDir() + "/runs.db"
	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	_, err = runlease.Acquire(context.Background(), s, "r", "h")
	require.NoError(t, err)
	require.NoError(t, s.Close())
	r := runCLI(t, "peek", "r", "--db", path)
	assert.Equal(t, 0, r.code, r.stderr)
	r = runCLI(t, "help")
	assert.Contains(t, r.stdout, "--etcd ENDPOINTS")
	assert.Contains(t, r.stdout, "$RUNLEASE_ETCD")
}

// TestVersionAndCompletionOfTheEtcdBuild checks that the binary built with
// --etcd prints its module version and completes its etcd flags.
func TestVersionAndCompletionOfTheEtcdBuild(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := runCLI(t, args...)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `^runlease (v\d+\.\d+\.\d+\S*|\(devel\)) go\S+\n$`, r.stdout)
	}
	r := runCLI(t, "help")
	assert.Regexp(t, `(?m)^  version\s+print the module version`, r.stdout)
	assert.Regexp(t, `(?m)^  completion\s+print a bash or zsh script`, r.stdout)
	r = runCLI(t, "completion", "bash")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^\tstatus\) flags='.*--etcd --etcd-cacert --etcd-cert --etcd-key --etcd-prefix --etcd-user `, r.stdout)
}
