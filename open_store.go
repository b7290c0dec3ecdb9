package runlease

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Open opens the store t names; see [Open] for what ctx bounds and what
// the errors match. A Target of an unknown Kind is refused with
// [ErrInvalidArgument].
func (t Target) Open(ctx context.Context) (ClosableStore, error) {
	switch t.Kind {
	case TargetSQLite:
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		open := OpenSQLite
		if t.ReadOnly {
			open = OpenSQLiteReadOnly
		}
		s, err := open(t.Path)
		if err != nil {
			return nil, t.sqliteOpenError(err)
		}
		return s, nil
	case TargetPostgres:
		s, err := OpenPostgres(ctx, t.DSN, WithTable(t.Table), WithCreateTable(t.CreateTable))
		if err != nil {
			return nil, t.postgresOpenError(err)
		}
		return s, nil
	}
	return nil, invalidArg("target", "kind %q: want %q or %q", t.Kind, TargetSQLite, TargetPostgres)
}

// String names the store for people, never with a password:
// "sqlite:PATH", or "postgres://USER@HOST:PORT/DATABASE" as pgx parses
// the DSN (with every host of a multi-host DSN), followed by
// "?table=NAME" when the table is not the default. It names a DSN that
// does not parse "postgres (the DSN does not parse)".
func (t Target) String() string {
	switch t.Kind {
	case TargetSQLite:
		return "sqlite:" + t.Path
	case TargetPostgres:
		name := pgServerName(t.DSN)
		if t.Table != "" && t.Table != DefaultPostgresTable {
			name += "?table=" + url.QueryEscape(t.Table)
		}
		return name
	}
	return "(no store)"
}

// pgServerName names the server of dsn from the configuration pgx parses,
// never from the DSN's text: postgres://USER@HOST:PORT[,HOST:PORT…]/DATABASE.
func pgServerName(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "postgres (the DSN does not parse)"
	}
	var hosts []string
	add := func(host string, port uint16) {
		switch {
		case strings.HasPrefix(host, "/"):
			host = url.PathEscape(host) // a socket directory, as libpq URIs write it
		case strings.Contains(host, ":"):
			host = "[" + host + "]"
		}
		if h := host + ":" + strconv.Itoa(int(port)); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	add(cfg.Host, cfg.Port)
	for _, f := range cfg.Fallbacks {
		add(f.Host, f.Port)
	}
	name := "postgres://" + url.User(cfg.User).String() + "@" + strings.Join(hosts, ",") + "/" + url.PathEscape(cfg.Database)
	if p := cfg.Password; p != "" {
		name = strings.ReplaceAll(name, p, "xxxxx")
	}
	return name
}

// openError is a store that could not be opened, told in the operator's
// terms. It unwraps to the store's own error, whose code it keeps.
type openError struct {
	msg string
	err error
}

func (e *openError) Error() string { return e.msg }
func (e *openError) Unwrap() error { return e.err }

// sqliteOpenError explains a file that SQLite cannot use as a store.
func (t Target) sqliteOpenError(err error) error {
	var e *sqlite.Error
	switch {
	case !errors.As(err, &e):
	case e.Code()&0xff == sqlite3.SQLITE_NOTADB:
		return &openError{err: err, msg: fmt.Sprintf("%s: %q is not a SQLite database, so not a runlease store "+
			"(SQLite: %s)", CodeStorage, t.Path, e.Error())}
	case t.ReadOnly && strings.Contains(e.Error(), "no such table: runlease_meta"):
		return &openError{err: err, msg: fmt.Sprintf("%s: %q is a SQLite database but not a runlease store: "+
			"it has no runlease_meta table", CodeStorage, t.Path)}
	}
	return err
}

// postgresOpenError names the server of a connection that failed, and
// folds pgx's message, which repeats the same line for every address and
// TLS mode it tried, to one line per distinct fault.
func (t Target) postgresOpenError(err error) error {
	var se *StorageError
	if !errors.As(err, &se) || errors.Is(err, ErrSchemaMismatch) {
		return err
	}
	what := "cannot open"
	if errors.Is(err, context.DeadlineExceeded) {
		what = "no answer in time from"
	}
	return &openError{err: err, msg: fmt.Sprintf("%s: %s Postgres at %s: %s",
		CodeStorage, what, pgServerName(t.DSN), foldLines(se.Err.Error()))}
}

// foldLines joins the lines of s, dropping repeated ones.
func foldLines(s string) string {
	var seen []string
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || slices.Contains(seen, line) {
			continue
		}
		seen = append(seen, line)
		if b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(line)
	}
	return b.String()
}

// dsnError reports a DSN that pgx does not parse: pgx's reason, without
// the DSN that pgx's message quotes and without anything the reason quotes
// from it, so that no password reaches the message. pgx's error stays
// reachable with errors.As.
func dsnError(dsn string, err error) error {
	arg := invalidArg("target", "the Postgres DSN does not parse: %s; %s", dsnReason(dsn, err), targetForms)
	return &dsnParseError{arg: arg, err: err}
}

// dsnReason is pgx's reason for refusing dsn, with nothing of the DSN in it.
func dsnReason(dsn string, err error) string {
	reason := "pgx cannot parse it"
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		c := *pe
		c.ConnString = ""
		reason = strings.TrimPrefix(c.Error(), "cannot parse ``: ")
		if inner := pe.Unwrap(); inner != nil {
			reason = strings.TrimSuffix(reason, " ("+inner.Error()+")")
			var ue *url.Error
			if errors.As(inner, &ue) {
				inner = ue.Err // url.Error quotes the whole URL
			}
			if detail := unquote(inner.Error()); detail != "" {
				reason += ": " + detail
			}
		}
	}
	for _, p := range dsnSecrets(dsn) {
		reason = strings.ReplaceAll(reason, p, "xxxxx")
	}
	return reason
}

// quotedText matches a double-quoted part of a message.
var quotedText = regexp.MustCompile(`\s*"(?:[^"\\]|\\.)*"`)

// unquote removes the quoted parts of a message about a DSN (a bad escape
// "%zz", a keyword before a missing "="): they are cut from its text, which
// may be part of a password.
func unquote(s string) string {
	s = strings.ReplaceAll(s, `"="`, "'='")
	return strings.TrimSpace(quotedText.ReplaceAllString(s, " …"))
}

var (
	urlPassword = regexp.MustCompile(`://[^:/@\s]*:([^/\s]+)@`)
	kvPassword  = regexp.MustCompile(`(?i)password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]+)`)
)

// dsnSecrets returns the passwords written in dsn, longest first, as text
// and decoded.
func dsnSecrets(dsn string) []string {
	var out []string
	for _, re := range []*regexp.Regexp{urlPassword, kvPassword} {
		for _, m := range re.FindAllStringSubmatch(dsn, -1) {
			p := strings.Trim(m[1], "'")
			out = append(out, p)
			if d, err := url.PathUnescape(p); err == nil && d != p {
				out = append(out, d)
			}
		}
	}
	out = slices.DeleteFunc(out, func(p string) bool { return len(p) < 3 })
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// dsnParseError is a refused DSN: an [*ArgumentError], which gives its
// text and code, and pgx's error.
type dsnParseError struct {
	arg error
	err error
}

func (e *dsnParseError) Error() string   { return e.arg.Error() }
func (e *dsnParseError) Unwrap() []error { return []error{e.arg, e.err} }
