package runlease

import (
	"context"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The kinds of store a [Target] names.
const (
	TargetSQLite   = "sqlite"   // the embedded store: OpenSQLite or OpenSQLiteReadOnly
	TargetPostgres = "postgres" // the shared store: OpenPostgres
)

var (
	_ ClosableStore = (*SQLiteStore)(nil)
	_ ClosableStore = (*PostgresStore)(nil)
)

// Target names a built-in store, as [ParseTarget] reads it from one string.
// The zero Target names no store; fill one in by hand only with the fields
// of its Kind.
type Target struct {
	// Kind is TargetSQLite or TargetPostgres.
	Kind string
	// Path is the embedded store's file, or ":memory:".
	Path string
	// ReadOnly opens the embedded store with OpenSQLiteReadOnly: no writer
	// lock, no writes, never created.
	ReadOnly bool
	// DSN is the Postgres connection string as pgx reads it, without the
	// parameters runlease takes for itself (table, create_table).
	DSN string
	// Table is the Postgres table (see [WithTable]).
	Table string
	// CreateTable creates the Postgres table when it is absent (see
	// [WithCreateTable]). ParseTarget sets it unless the target says
	// create_table=false.
	CreateTable bool
}

// Open opens the built-in store that target names, as [ParseTarget] reads
// it: "sqlite:runs.db", "sqlite::memory:", "file:runs.db?mode=ro",
// "postgres://user@host/db?table=leases", or "host=h dbname=d".
// The caller closes the store.
//
// ctx bounds the Postgres connection and the table's check; an embedded
// store opens a local file and is not interrupted, so ctx is checked only
// before it starts (and its error returned as is).
//
// On failure nothing is left open, and the error matches
// [ErrInvalidArgument] for a target that does not parse (its message
// names what is wrong and never quotes a password), [ErrStoreLocked],
// [ErrSchemaMismatch], or [ErrStorage]: a Postgres server that could not be
// reached (the message names the host and port), or a file that is not a
// SQLite database or, opened read-only, not a runlease store.
func Open(ctx context.Context, target string) (ClosableStore, error) {
	t, err := ParseTarget(target)
	if err != nil {
		return nil, err
	}
	return t.Open(ctx)
}

// targetForms is how a refused target is told what to write.
const targetForms = `want sqlite:PATH, file:PATH[?mode=ro], postgres://USER@HOST:PORT/DATABASE[?table=NAME], ` +
	`or key=value pairs such as "host=H dbname=D table=NAME"`

// ParseTarget reads a store's target:
//
//   - "sqlite:PATH" is the embedded store at PATH, taken literally up to a
//     '?', which begins parameters; "sqlite::memory:" is a private
//     in-memory store.
//   - "file:PATH" is a SQLite URI: PATH is percent-decoded, and may start
//     with "//" and an empty or "localhost" authority.
//   - Both take one parameter, mode: mode=ro opens read-only (Target.ReadOnly),
//     mode=rwc (the default) opens for writing, creating the store.
//   - "postgres://…" and "postgresql://…" URLs and libpq key=value strings
//     are Postgres DSNs, with everything pgx accepts (pool_ settings too).
//     Two parameters are runlease's and are taken out before pgx sees the
//     DSN: table=NAME (default [DefaultPostgresTable]) and
//     create_table=false (default true).
//
// The DSN is parsed as pgx parses it, with the PG* environment's defaults,
// so a DSN that ParseTarget accepts does not fail to parse at Open. Any
// other text, an unknown parameter or a bad table name is refused with an
// error matching [ErrInvalidArgument]; the message says which part is
// wrong and never quotes the DSN or its password.
func ParseTarget(target string) (Target, error) {
	switch {
	case target == "":
		return Target{}, invalidArg("target", "empty; %s", targetForms)
	case strings.HasPrefix(target, "sqlite:"):
		return parseSQLiteTarget(target[len("sqlite:"):], false)
	case strings.HasPrefix(target, "file:"):
		return parseSQLiteTarget(target[len("file:"):], true)
	case strings.HasPrefix(target, "postgres://"), strings.HasPrefix(target, "postgresql://"):
		return parsePostgresTarget(target, true)
	}
	if scheme, _, ok := strings.Cut(target, "://"); ok && isScheme(scheme) {
		return Target{}, invalidArg("target", "scheme %q is not a built-in store; %s", scheme, targetForms)
	}
	if key, _, ok := strings.Cut(target, "="); ok && strings.TrimSpace(key) != "" {
		return parsePostgresTarget(target, false)
	}
	// Not quoted: a misplaced argument may be a password.
	return Target{}, invalidArg("target", "neither a SQLite path nor a Postgres DSN; %s", targetForms)
}

// isScheme reports whether s is a URL scheme, such as "mysql".
func isScheme(s string) bool {
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return false
		}
	}
	return s != ""
}

func parseSQLiteTarget(rest string, uri bool) (Target, error) {
	path, query, hasQuery := strings.Cut(rest, "?")
	if uri {
		if p, ok := strings.CutPrefix(path, "//"); ok {
			authority, tail, _ := strings.Cut(p, "/")
			if authority != "" && authority != "localhost" {
				return Target{}, invalidArg("target", "file: URI names host %q; only a local file can be opened", authority)
			}
			path = "/" + tail
		}
		p, err := url.PathUnescape(path)
		if err != nil {
			return Target{}, invalidArg("target", "file: path %q: %v", path, err)
		}
		path = p
	}
	if path == "" {
		return Target{}, invalidArg("target", "no PATH: want sqlite:runs.db or sqlite::memory:")
	}
	t := Target{Kind: TargetSQLite, Path: path}
	if !hasQuery {
		return t, nil
	}
	params, err := url.ParseQuery(query)
	if err != nil {
		return Target{}, invalidArg("target", "parameters of %q: %v", path, err)
	}
	for key, vals := range params {
		switch {
		case key != "mode":
			return Target{}, invalidArg("target", "unknown parameter %q for a SQLite store; it takes mode=ro or mode=rwc", key)
		case len(vals) != 1:
			return Target{}, invalidArg("target", "mode given %d times", len(vals))
		case vals[0] == "ro":
			t.ReadOnly = true
		case vals[0] != "rwc":
			return Target{}, invalidArg("target", "mode=%q: want ro, or rwc (the default, which creates a missing store)", vals[0])
		}
	}
	return t, nil
}

func parsePostgresTarget(dsn string, isURL bool) (Target, error) {
	clean, params, err := takeParams(dsn, isURL)
	if err != nil {
		return Target{}, err
	}
	t := Target{Kind: TargetPostgres, DSN: clean, Table: DefaultPostgresTable, CreateTable: true}
	if v, ok := params["table"]; ok {
		t.Table = v
	}
	if v, ok := params["create_table"]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Target{}, invalidArg("target", "create_table=%q: want true or false", v)
		}
		t.CreateTable = b
	}
	if _, err := pgTableIdent(t.Table); err != nil {
		return Target{}, err
	}
	if _, err := pgxpool.ParseConfig(clean); err != nil {
		return Target{}, dsnError(clean, err)
	}
	return t, nil
}

// runleaseParams are the DSN parameters that runlease takes for itself;
// pgx would send them to the server as settings.
var runleaseParams = map[string]bool{"table": true, "create_table": true}

// takeParams removes runlease's parameters from dsn, leaving every other
// byte as it was, and returns their values. A DSN that does not tokenize is
// returned whole, for pgx to report.
func takeParams(dsn string, isURL bool) (string, map[string]string, error) {
	params := map[string]string{}
	add := func(key, val string) error {
		if _, dup := params[key]; dup {
			return invalidArg("target", "parameter %s given twice", key)
		}
		params[key] = val
		return nil
	}
	if isURL {
		base, query, ok := strings.Cut(dsn, "?")
		if !ok {
			return dsn, params, nil
		}
		query, frag, hasFrag := strings.Cut(query, "#")
		var kept []string
		for _, part := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(part, "=")
			key, kerr := url.QueryUnescape(k)
			val, verr := url.QueryUnescape(v)
			if kerr != nil || verr != nil || !runleaseParams[key] {
				kept = append(kept, part)
				continue
			}
			if err := add(key, val); err != nil {
				return "", nil, err
			}
		}
		out := base
		if len(kept) > 0 {
			out += "?" + strings.Join(kept, "&")
		}
		if hasFrag {
			out += "#" + frag
		}
		return out, params, nil
	}
	var b strings.Builder
	for _, p := range kvPairs(dsn) {
		if p.key == "" {
			return dsn, params, nil // does not tokenize: pgx says why
		}
		if !runleaseParams[p.key] {
			b.WriteString(dsn[p.start:p.end])
			continue
		}
		if err := add(p.key, p.val); err != nil {
			return "", nil, err
		}
	}
	return strings.TrimSpace(b.String()), params, nil
}

// kvPair is one key=value pair of a libpq connection string: dsn[start:end]
// is its text with the blanks before it. A pair with an empty key ends a
// string that does not tokenize.
type kvPair struct {
	key, val   string
	start, end int
}

// kvPairs splits a libpq key=value string as pgx and libpq do: a value is
// either quoted with single quotes, or runs to the next blank; a backslash
// escapes the next byte in both.
func kvPairs(s string) []kvPair {
	var out []kvPair
	i := 0
	for {
		j := i
		for j < len(s) && isBlank(s[j]) {
			j++
		}
		if j == len(s) {
			return out
		}
		eq := strings.IndexByte(s[j:], '=')
		if eq < 0 {
			return append(out, kvPair{})
		}
		key := strings.TrimSpace(s[j : j+eq])
		k := j + eq + 1
		for k < len(s) && isBlank(s[k]) {
			k++
		}
		end, quoted := k, k < len(s) && s[k] == '\''
		if quoted {
			end++
		}
		var val strings.Builder
		for ; end < len(s); end++ {
			c := s[end]
			if quoted && c == '\'' || !quoted && isBlank(c) {
				break
			}
			if c == '\\' && end+1 < len(s) {
				end++
				c = s[end]
			}
			val.WriteByte(c)
		}
		if quoted {
			if end == len(s) {
				return append(out, kvPair{})
			}
			end++ // the closing quote
		}
		if key == "" {
			return append(out, kvPair{})
		}
		out = append(out, kvPair{key: key, val: val.String(), start: i, end: end})
		i = end
	}
}

func isBlank(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}
