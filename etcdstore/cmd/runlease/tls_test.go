package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/etcdstore/internal/etcdtest"
)

// TestEtcdTLS runs the commands against a member that serves clients over
// TLS only and requires a client certificate its authority signed.
func TestEtcdTLS(t *testing.T) {
	if cluster == nil {
		t.Skipf("no etcd cluster (set CI=true to make this a failure): %v", clusterErr)
	}
	dir := t.TempDir()
	files, err := etcdtest.NewTLS(dir)
	require.NoError(t, err)
	c, err := etcdtest.StartWith(filepath.Join(dir, "data"), etcdtest.Options{Members: 1, TLS: files})
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	https := c.Endpoints()[0]
	require.True(t, strings.HasPrefix(https, "https://"), https)
	hostPort := c.Member(0)

	// A lease through a client of the test's own, with the certificate.
	conf, err := files.ClientConfig()
	require.NoError(t, err)
	s, err := etcdstore.Open(t.Context(), []string{https}, etcdstore.WithConfig(func(cc *clientv3.Config) { cc.TLS = conf }))
	require.NoError(t, err)
	defer s.Close()
	_, err = runlease.Acquire(t.Context(), s, "live", "alice#n1", runlease.WithTTL(time.Minute))
	require.NoError(t, err)

	tlsFlags := []string{"--etcd-cacert", files.CA, "--etcd-cert", files.ClientCert, "--etcd-key", files.ClientKey}

	t.Run("the certificate files open the cluster", func(t *testing.T) {
		for _, ep := range []string{https, hostPort} {
			r := runCLI(t, append([]string{"peek", "live", "--etcd", ep}, tlsFlags...)...)
			assert.Equal(t, 0, r.code, "%s: %s", ep, r.stderr)
			assert.Contains(t, r.stdout, "alice#n1", ep)
		}
		r := runCLI(t, append([]string{"status", "--etcd", https, "--json"}, tlsFlags...)...)
		assert.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, `"run_id": "live"`)
	})

	t.Run("without a client certificate the member refuses", func(t *testing.T) {
		r := runCLI(t, "peek", "live", "--etcd", https, "--etcd-cacert", files.CA, "--timeout", "1s")
		assert.Equal(t, 1, r.code, r.stderr)
		assert.Contains(t, r.stderr, "RUN-E011")
	})

	t.Run("without the authority the member is not trusted", func(t *testing.T) {
		r := runCLI(t, "peek", "live", "--etcd", https, "--etcd-cert", files.ClientCert, "--etcd-key", files.ClientKey, "--timeout", "1s")
		assert.Equal(t, 1, r.code, r.stderr)
		assert.Contains(t, r.stderr, "RUN-E011")
	})

	t.Run("plain http to a TLS member fails", func(t *testing.T) {
		r := runCLI(t, "peek", "live", "--etcd", "http://"+hostPort, "--timeout", "1s")
		assert.Equal(t, 1, r.code, r.stderr)
	})

	t.Run("bad TLS input is a usage error that names the file, never its contents", func(t *testing.T) {
		notPEM := filepath.Join(dir, "not.pem")
		require.NoError(t, os.WriteFile(notPEM, []byte("secret-looking-bytes"), 0o600))
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--etcd", https, "--etcd-cert", files.ClientCert}, "--etcd-cert and --etcd-key go together"},
			{[]string{"--etcd", https, "--etcd-key", files.ClientKey}, "--etcd-cert and --etcd-key go together"},
			{[]string{"--etcd", https + ",127.0.0.1:1"}, "mixes https:// and plain"},
			{[]string{"--etcd", "http://" + hostPort, "--etcd-cacert", files.CA}, "plain http://"},
			{[]string{"--etcd", https, "--etcd-cacert", notPEM}, "holds no PEM certificate"},
			{[]string{"--etcd", https, "--etcd-cacert", filepath.Join(dir, "absent.pem")}, "--etcd-cacert"},
			{[]string{"--etcd", https, "--etcd-cert", files.ClientCert, "--etcd-key", notPEM}, "--etcd-key " + notPEM},
			{[]string{"--etcd-cacert", files.CA, "--db", "x.db"}, "--etcd-cacert applies to the store of --etcd"},
		} {
			r := runCLI(t, append([]string{"peek", "live"}, tc.args...)...)
			assert.Equal(t, 2, r.code, "%q: %s", tc.args, r.stderr)
			assert.Contains(t, r.stderr, tc.want, tc.args)
			assert.NotContains(t, r.stderr, "secret-looking-bytes", tc.args)
		}
	})
}
