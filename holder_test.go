package runlease_test

import (
	"fmt"
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

// holderSeeds are hostile (principal, node, principal, node) inputs: the
// separator and the escape character in every position, empty parts, a
// node that is the default's stand-in, multibyte text, NUL and invalid
// UTF-8.
var holderSeeds = [][4]string{
	{"billing", "worker-1/7", "billing", "worker-1/7"},
	{"a#b", "c", "a", "b#c"},
	{`a\`, "b", "a", `\b`},
	{`a\#`, "b", "a", "#b"},
	{"", "", "", "node"},
	{"#", "#", "##", ""},
	{`\`, `\\`, `\\`, `\`},
	{"é#€", "中\\😀", "é", "#€中\\😀"},
	{"a\x00b", "\x00", "a", "\x00b\x00"},
	{"\xff#", "\xfe", "\xff", "#\xfe"},
	{`a\#b#c`, `x#\`, `a\`, `#b#c`},
}

// FuzzHolderFor checks HolderFor against ParseHolder: every (principal,
// node) pair round-trips, two different pairs never give one holder string,
// names without '#' or '\' are written as they are, and whatever
// ParseHolder accepts, HolderFor writes back byte for byte. An empty node
// stands for DefaultNodeID, as HolderFor documents.
//
// Run it with: go test -run '^$' -fuzz '^FuzzHolderFor$' -fuzztime 30s .
func FuzzHolderFor(f *testing.F) {
	for _, s := range holderSeeds {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, p1, n1, p2, n2 string) {
		if err := holderProperty(runlease.HolderFor, runlease.ParseHolder, p1, n1, p2, n2); err != nil {
			t.Fatal(err)
		}
	})
}

// TestHolderPropertyRejectsNaiveHolders shows the fuzz property can fail:
// holders joined with '#' and no escaping collide on the seeds.
func TestHolderPropertyRejectsNaiveHolders(t *testing.T) {
	t.Parallel()
	join := func(p, n string) string { return p + "#" + effectiveNode(n) }
	split := func(h string) (string, string, bool) { return strings.Cut(h, "#") }
	var failures int
	for _, s := range holderSeeds {
		if holderProperty(join, split, s[0], s[1], s[2], s[3]) != nil {
			failures++
		}
	}
	require.Positive(t, failures, "the property accepted unescaped holders on every seed")
}

// holderProperty returns an error describing how holderFor and
// parseHolder break the rules of holder strings on two pairs, or nil.
func holderProperty(holderFor func(p, n string) string, parseHolder func(string) (string, string, bool), p1, n1, p2, n2 string) error {
	h1, h2 := holderFor(p1, n1), holderFor(p2, n2)
	n1, n2 = effectiveNode(n1), effectiveNode(n2)
	for _, c := range []struct{ p, n, h string }{{p1, n1, h1}, {p2, n2, h2}} {
		p, n, ok := parseHolder(c.h)
		if !ok || p != c.p || n != c.n {
			return fmt.Errorf("parse(holder(%q, %q) = %q) = %q, %q, %v", c.p, c.n, c.h, p, n, ok)
		}
		if !strings.ContainsAny(c.p+c.n, `#\`) && c.h != c.p+"#"+c.n {
			return fmt.Errorf("holder(%q, %q) = %q, want the plain principal#node", c.p, c.n, c.h)
		}
	}
	if (p1 != p2 || n1 != n2) && h1 == h2 {
		return fmt.Errorf("holder(%q, %q) = holder(%q, %q) = %q", p1, n1, p2, n2, h1)
	}
	for _, raw := range []string{p1, n1, p1 + "#" + n1, p1 + `\` + n1} {
		p, n, ok := parseHolder(raw)
		if ok && n != "" && holderFor(p, n) != raw {
			return fmt.Errorf("parse(%q) = %q, %q, which holder writes as %q", raw, p, n, holderFor(p, n))
		}
	}
	return nil
}

// effectiveNode is the node HolderFor uses for node.
func effectiveNode(node string) string {
	if node == "" {
		return runlease.DefaultNodeID()
	}
	return node
}
