package runlease

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"sync"
)

// DefaultNodeID returns an identity for this process: the host name, a
// slash, the process id, a slash and a nonce of 16 lowercase hex digits,
// such as "worker-7/4121/9f86d081884c7d65".
//
// The host name is taken from $HOSTNAME, else $COMPUTERNAME, else the
// operating system's host name, else "node", each time DefaultNodeID is
// called. The nonce is 64 bits from crypto/rand, drawn once per process, so
// the result is stable for the life of the process and differs between any
// two processes. Host and pid alone are not enough: two containers of one
// Kubernetes pod, or compose replicas given one host name, share the host
// name and both run as pid 1, and a holder string that two drivers share
// would let the second re-enter the first's live lease.
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
	return host + "/" + strconv.Itoa(getpid()) + "/" + processNonce()
}

// getpid is os.Getpid, replaced in tests to play two containers that both
// run as pid 1.
var getpid = os.Getpid

// processNonce is this process's random part of [DefaultNodeID], drawn once.
// crypto/rand.Read does not fail: on a system without a random source the
// program crashes rather than hand out a predictable nonce.
var processNonce = sync.OnceValue(func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
})

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
