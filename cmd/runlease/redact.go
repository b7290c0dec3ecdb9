package main

import (
	"io"
	"net/url"
	"regexp"
	"strings"
)

// Passwords never reach the terminal. Every byte the command prints goes
// through a redactingWriter, which rewrites the password part of anything
// shaped like a DSN (postgres://user:PASSWORD@…, password=PASSWORD) and every
// password found up front in the command line and $RUNLEASE_POSTGRES,
// wherever it appears (a driver's error may quote it without its DSN).

const redacted = "xxxxx"

var (
	// userinfoPassword matches the password of a URL's userinfo, up to the
	// last '@' of the authority, as net/url reads it.
	userinfoPassword = regexp.MustCompile(`(://[^:/@\s]*:)([^/\s]+)(@)`)
	// keyPassword matches password=… in key=value DSNs and URL queries,
	// quoted or not.
	keyPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'"]+)`)
)

// minSecretLen is the shortest password replaced wherever it appears:
// replacing every "a" of a message would make it unreadable. Shorter ones
// are still removed from anything shaped like a DSN.
const minSecretLen = 3

// collectSecrets remembers the passwords of every DSN in args and in the
// environment, before anything is printed.
func (c *cli) collectSecrets(args []string) {
	for _, s := range append(args, c.getenv(envPostgres)) {
		c.secrets = append(c.secrets, dsnPasswords(s)...)
	}
}

// dsnPasswords returns the passwords in s, as written and decoded.
func dsnPasswords(s string) []string {
	var out []string
	add := func(p string) {
		out = append(out, p)
		if d, err := url.PathUnescape(p); err == nil && d != p {
			out = append(out, d)
		}
	}
	for _, m := range userinfoPassword.FindAllStringSubmatch(s, -1) {
		add(m[2])
	}
	for _, m := range keyPassword.FindAllStringSubmatch(s, -1) {
		p := m[2]
		if len(p) >= 2 && p[0] == '\'' && p[len(p)-1] == '\'' {
			p = strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(p[1 : len(p)-1])
		}
		add(p)
	}
	return out
}

// redact removes passwords from s.
func (c *cli) redact(s string) string {
	s = userinfoPassword.ReplaceAllString(s, "${1}"+redacted+"${3}")
	s = keyPassword.ReplaceAllString(s, "${1}"+redacted)
	for _, p := range c.secrets {
		if len(p) >= minSecretLen {
			s = strings.ReplaceAll(s, p, redacted)
		}
	}
	return s
}

// redactingWriter passes everything written through cli.redact.
type redactingWriter struct {
	w io.Writer
	c *cli
}

func (r *redactingWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(r.w, r.c.redact(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
