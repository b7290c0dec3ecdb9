package runlease_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

func TestHolderStringsNeverCollide(t *testing.T) {
	t.Parallel()
	assert.NotEqual(t, runlease.HolderFor("a#b", "c"), runlease.HolderFor("a", "b#c"))
	assert.NotEqual(t, runlease.HolderFor(`a\`, "b"), runlease.HolderFor("a", `\b`))
	assert.NotEqual(t, runlease.HolderFor(`a\#`, "b"), runlease.HolderFor(`a`, `#b`))
	assert.Equal(t, "billing#worker-1/7", runlease.HolderFor("billing", "worker-1/7"), "plain names stay as the reference writes them")

	parts := []string{"", "a", "#", `\`, `a#b`, `a\#b`, `\\#`, "##", "é#€"}
	seen := map[string][2]string{}
	for _, p := range parts {
		for _, n := range parts[1:] { // an empty node means the default node
			h := runlease.HolderFor(p, n)
			if prev, dup := seen[h]; dup {
				t.Fatalf("HolderFor(%q, %q) = HolderFor(%q, %q) = %q", p, n, prev[0], prev[1], h)
			}
			seen[h] = [2]string{p, n}
			gotP, gotN, ok := runlease.ParseHolder(h)
			require.True(t, ok, h)
			assert.Equal(t, [2]string{p, n}, [2]string{gotP, gotN}, "round trip of %q", h)
		}
	}
}

func TestParseHolderRefusesForeignStrings(t *testing.T) {
	t.Parallel()
	for _, h := range []string{"", "nohash", "a#b#c", `a\x#b`, `a#b\`} {
		_, _, ok := runlease.ParseHolder(h)
		assert.False(t, ok, "%q", h)
	}
}

func TestDefaultNodeID(t *testing.T) {
	pid := "/" + strconv.Itoa(os.Getpid()) + "/"
	nonce := regexp.MustCompile(`^[0-9a-f]{16}$`)
	for _, tc := range []struct {
		name, hostname, computername, want string
	}{
		{name: "HOSTNAME_comes_first", hostname: "pod-7", computername: "win-1", want: "pod-7"},
		{name: "COMPUTERNAME_without_HOSTNAME", computername: "win-1", want: "win-1"},
		{name: "the_OS_host_name_without_either", want: osHostname()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HOSTNAME", tc.hostname)
			t.Setenv("COMPUTERNAME", tc.computername)
			id := runlease.DefaultNodeID()
			rest, ok := strings.CutPrefix(id, tc.want+pid)
			require.True(t, ok, "%q starts with host/pid/", id)
			assert.Regexp(t, nonce, rest, "a 64-bit hex nonce follows")
			assert.Equal(t, id, runlease.DefaultNodeID(), "stable within the process")
			assert.Equal(t, "billing#"+id, runlease.HolderFor("billing", ""))
		})
	}
}

func osHostname() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "node"
	}
	return host
}
