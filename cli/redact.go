package cli

import (
	"io"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/areev/runlease"
)

// Passwords never reach the terminal. A Postgres store is named from the
// configuration pgx parses out of its DSN (postgresName), never from the
// DSN's text. Every byte the command prints goes through a redactingWriter,
// which
//
//  1. replaces every DSN of the command line and of $RUNLEASE_POSTGRES,
//     where it appears whole (a usage error quotes a misplaced argument), by
//     its postgresName, or by a placeholder when pgx does not parse it;
//  2. rewrites the password part of anything else shaped like a DSN
//     (postgres://user:PASSWORD@…, password=PASSWORD);
//  3. removes every password found in those DSNs, above all the one pgx
//     parses, wherever it appears (a driver's error may quote it alone).

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

// collectSecrets remembers the DSNs and passwords of args and of the
// environment, before anything is printed: the password pgx parses (which
// may also come from $PGPASSWORD or a password file) in the spellings a URL
// or a quoted string would give it, and whatever the patterns find.
func (c *cli) collectSecrets(args []string) {
	var whole []string // old, new pairs for strings.NewReplacer
	for _, s := range append(args, c.getenv(envPostgres)) {
		cfg, err := pgconn.ParseConfig(s)
		switch {
		case err == nil && cfg.Password != "":
			p := cfg.Password
			c.secrets = append(c.secrets, p, url.PathEscape(p), url.QueryEscape(p), quoted(p))
			name := postgresName(s, runlease.DefaultPostgresTable)
			whole = append(whole, s, name, quoted(s), name)
		case err != nil && dsnLike(s):
			whole = append(whole, s, unparsedDSN, quoted(s), unparsedDSN)
		}
		for _, p := range dsnPasswords(s) {
			c.secrets = append(c.secrets, p, quoted(p))
		}
	}
	c.dsns = strings.NewReplacer(whole...)
}

// unparsedDSN stands for a DSN that pgx does not parse.
const unparsedDSN = "postgres (the DSN does not parse)"

// dsnLike reports whether s looks like a DSN that may hold a password: a
// postgres URL, or text that names a password.
func dsnLike(s string) bool {
	l := strings.ToLower(s)
	return strings.HasPrefix(l, "postgres://") || strings.HasPrefix(l, "postgresql://") || strings.Contains(l, "password")
}

// quoted is s as it appears inside the quotes of %q.
func quoted(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
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
	if c.dsns != nil {
		s = c.dsns.Replace(s)
	}
	s = userinfoPassword.ReplaceAllString(s, "${1}"+redacted+"${3}")
	s = keyPassword.ReplaceAllString(s, "${1}"+redacted)
	return maskSecrets(s, c.secrets)
}

// maskSecrets replaces every secret of at least minSecretLen bytes in s. A
// mask can join with the text around it into a secret again (a password
// "axx" in "aaxx"), so it repeats until none is left, and withholds s
// entirely if that does not settle.
func maskSecrets(s string, secrets []string) string {
	for range 4 {
		clean := true
		for _, p := range secrets {
			if len(p) >= minSecretLen && strings.Contains(s, p) {
				s, clean = strings.ReplaceAll(s, p, redacted), false
			}
		}
		if clean {
			return s
		}
	}
	return "(withheld: the text contains a password)"
}

// postgresName names the Postgres store of dsn, and its table unless it is
// the default, for messages and status's "store" field:
// postgres://USER@HOST:PORT[,HOST:PORT…]/DATABASE. It is built from the
// configuration pgx parses (so the PG* environment's defaults count, as
// they do when connecting), never by rewriting the DSN's text, which may
// spell a password in ways no pattern foresees. A password that happens to
// be part of the name (as the user name, say) is masked.
func postgresName(dsn, table string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "postgres (the DSN does not parse)"
	}
	name := runlease.Target{Kind: runlease.TargetPostgres, DSN: dsn}.String()
	if table != runlease.DefaultPostgresTable {
		name += " table " + table
	}
	return maskSecrets(name, []string{cfg.Password})
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
