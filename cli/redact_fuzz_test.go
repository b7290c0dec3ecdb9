package cli

import (
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// FuzzPostgresNameHidesThePassword checks the names and the redaction
// against pgx's own parser: for any DSN pgx parses with a password of at
// least four bytes, the store name never contains the password, and
// neither does anything printed after the command line named the DSN,
// whether the DSN appears whole, quoted as a usage error quotes it, or the
// password alone.
//
// Run it with: go test -run '^$' -fuzz '^FuzzPostgresNameHidesThePassword$' -fuzztime 30s ./cli
func FuzzPostgresNameHidesThePassword(f *testing.F) {
	for _, tc := range trickyDSNs {
		f.Add(tc.dsn, "runlease_meta")
	}
	f.Add(secretDSN, "ops.leases")
	f.Add(secretKV, "t")
	f.Add("postgres://u:p@ss@h/d", "runlease_meta")
	f.Add("postgres://u@h/d?password=xxxxx&sslmode=disable", "xxxx")
	f.Add("host=h user=abcd password=abcd dbname=abcd", "abcd")
	f.Fuzz(func(t *testing.T, dsn, table string) {
		if readsFiles(dsn) {
			t.Skip("names a file for pgx to read")
		}
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil || len(cfg.Password) < 4 {
			return
		}
		pw := cfg.Password
		if name := postgresName(dsn, table); strings.Contains(name, pw) {
			t.Fatalf("postgresName(%q, %q) = %q holds the password %q", dsn, table, name, pw)
		}
		c := newCLI(t.Context(), nil, nil, nil)
		c.getenv = func(string) string { return "" }
		c.collectSecrets([]string{"status", "--postgres", dsn})
		for _, text := range []string{
			dsn,
			"unexpected argument " + strconv.Quote(dsn),
			"the server said " + pw + " to " + dsn,
		} {
			if out := c.redact(text); strings.Contains(out, pw) {
				t.Fatalf("redact(%q) = %q holds the password %q", text, out, pw)
			}
		}
	})
}

// readsFiles reports whether dsn may name a file for pgx's parser to read
// (a certificate, a password file, a service file), which a fuzzer could
// point at a device that never ends.
func readsFiles(dsn string) bool {
	s := strings.ToLower(dsn)
	if d, err := url.QueryUnescape(s); err == nil {
		s += " " + d
	}
	for _, w := range []string{"cert", "key", "file", "service", "/dev"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}
