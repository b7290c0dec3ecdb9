package runlease_test

import (
	"os"
	"strconv"
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
	pid := "/" + strconv.Itoa(os.Getpid())
	t.Setenv("HOSTNAME", "pod-7")
	t.Setenv("COMPUTERNAME", "win-1")
	assert.Equal(t, "pod-7"+pid, runlease.DefaultNodeID())
	assert.Equal(t, "billing#pod-7"+pid, runlease.HolderFor("billing", ""))

	t.Setenv("HOSTNAME", "")
	assert.Equal(t, "win-1"+pid, runlease.DefaultNodeID())

	t.Setenv("COMPUTERNAME", "")
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "node"
	}
	assert.Equal(t, host+pid, runlease.DefaultNodeID())
}
