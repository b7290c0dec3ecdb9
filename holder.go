package runlease

import (
	"os"
	"strconv"
	"strings"
)

// DefaultNodeID returns an identity for this process: the host name, a slash
// and the process id, such as "worker-7/4121".
//
// The host name is taken from $HOSTNAME, else $COMPUTERNAME, else the
// operating system's host name, else "node". The pid alone is not enough:
// two containers of one service both run as pid 1, and a holder string that
// two drivers share would let the second re-enter the first's live lease.
func DefaultNodeID() string {
	host := os.Getenv("HOSTNAME")
	if host == "" {
		host = os.Getenv("COMPUTERNAME")
	}
	if host == "" {
		host, _ = os.Hostname()
	}
	if host == "" {
		host = "node"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

// HolderFor returns the holder string of one driver: principal, '#', node.
// An empty node means [DefaultNodeID].
//
// A '#' or '\' inside principal or node is escaped with a backslash, so two
// different (principal, node) pairs never give the same holder string:
// HolderFor("a#b", "c") is `a\#b#c` and HolderFor("a", "b#c") is `a#b\#c`.
// Names without those characters give exactly "principal#node".
func HolderFor(principal, node string) string {
	if node == "" {
		node = DefaultNodeID()
	}
	return escapeHolderPart(principal) + "#" + escapeHolderPart(node)
}

// ParseHolder splits a holder string made by [HolderFor] into its principal
// and node. ok is false when h was not made by HolderFor.
func ParseHolder(h string) (principal, node string, ok bool) {
	var b strings.Builder
	escaped := false
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case escaped:
			if c != '#' && c != '\\' {
				return "", "", false
			}
			b.WriteByte(c)
			escaped = false
		case c == '\\':
			escaped = true
		case c == '#':
			if ok {
				return "", "", false // a second unescaped '#'
			}
			principal, ok = b.String(), true
			b.Reset()
		default:
			b.WriteByte(c)
		}
	}
	if !ok || escaped {
		return "", "", false
	}
	return principal, b.String(), true
}

func escapeHolderPart(s string) string {
	if !strings.ContainsAny(s, `#\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 4)
	for i := 0; i < len(s); i++ {
		if s[i] == '#' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
