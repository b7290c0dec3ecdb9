package runlease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PostgresSchema returns the statement that creates the store's table, for
// migration tools: the one OpenPostgres runs when the table is absent. It
// fails with an error matching [ErrInvalidArgument] when table is not a name
// [WithTable] accepts.
func PostgresSchema(table string) (string, error) {
	id, err := pgTableIdent(table)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(pgSchema, id.Sanitize()), nil
}

func pgTableIdent(name string) (pgx.Identifier, error) {
	if name == "" {
		return nil, invalidArg("table", "empty")
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, invalidArg("table", "%q has %d dot-separated parts, want table or schema.table", name, len(parts))
	}
	for _, p := range parts {
		switch {
		case p == "":
			return nil, invalidArg("table", "%q has an empty part", name)
		case !utf8.ValidString(p):
			return nil, invalidArg("table", "%q is not valid UTF-8", name)
		case strings.IndexByte(p, 0) >= 0:
			return nil, invalidArg("table", "%q contains NUL", name)
		case len(p) > 63:
			return nil, invalidArg("table", "%q is %d bytes long, PostgreSQL names hold at most 63", p, len(p))
		}
	}
	return pgx.Identifier(parts), nil
}

// SchemaError reports that the store's table does not have the shape
// [PostgresSchema] gives it (which includes being a permanent table, in
// every partition: neither UNLOGGED nor TEMPORARY), or, with
// WithCreateTable(false), does not exist. The store never alters an existing table, so nothing was changed. It
// matches [ErrSchemaMismatch].
type SchemaError struct {
	Table   string // the table as given to WithTable
	Problem string // what is wrong, such as "column value has type jsonb, want text"
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("%s: table %q does not fit the store: %s", CodeSchemaMismatch, e.Table, e.Problem)
}

// Code returns [CodeSchemaMismatch].
func (e *SchemaError) Code() string { return CodeSchemaMismatch }

// Is reports whether target is [ErrSchemaMismatch].
func (e *SchemaError) Is(target error) bool { return target == ErrSchemaMismatch }

// prepareTable checks the table, creating it first when it is absent and
// create is set, and returns its schema-qualified name as resolved now.
func (s *PostgresStore) prepareTable(ctx context.Context, op, table string, create bool) (string, error) {
	for attempt := 0; ; attempt++ {
		rel, problems, err := s.inspect(ctx, op, table)
		switch {
		case err != nil:
			return "", err
		case rel.Kind != "" && len(problems) > 0:
			return "", &SchemaError{Table: s.table, Problem: strings.Join(problems, "; ")}
		case rel.Kind != "":
			return rel.Name, nil
		case !create:
			return "", &SchemaError{Table: s.table, Problem: "table does not exist (create it with the statement of PostgresSchema)"}
		case attempt == 3:
			return "", &SchemaError{Table: s.table, Problem: "table is not visible after creating it (check search_path)"}
		}
		err = s.do(ctx, op, "", true, func(c *pgx.Conn) error {
			_, err := sendUnnamed(ctx, c, pgStmt{pgPinDurable, nil}, pgStmt{fmt.Sprintf(pgSchema, table), nil})
			return err
		})
		// Two sessions that run CREATE TABLE IF NOT EXISTS at once can both
		// miss the other's uncommitted table; the loser then fails on a
		// catalog unique index (23505), or on the table's row type (42710,
		// duplicate_object), or as a duplicate table (42P07), once the
		// winner commits. The table exists by then, so look again.
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07" || pgErr.Code == "42710")) {
			return "", err
		}
	}
}

// pgRelationInfo is what pgRelation reads of a relation.
type pgRelationInfo struct {
	Kind, Persistence  string // "" when there is no such relation
	PartitionNotLogged bool
	Name               string
}

// inspect reads the relation that table names and what is wrong with it.
func (s *PostgresStore) inspect(ctx context.Context, op, table string) (pgRelationInfo, []string, error) {
	var rel pgRelationInfo
	var problems []string
	err := s.do(ctx, op, "", false, func(c *pgx.Conn) error {
		err := c.QueryRow(ctx, pgRelation, pgMode, table).Scan(&rel.Kind, &rel.Persistence, &rel.PartitionNotLogged, &rel.Name)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		rows, err := c.Query(ctx, pgColumns, pgMode, table)
		if err != nil {
			return err
		}
		cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pgColumn])
		problems = append(relationProblems(rel), shapeProblems(cols)...)
		return err
	})
	return rel, problems, err
}

// relationProblems says what is wrong with the relation itself: it must be
// a table whose rows survive a crash of the server and outlive the session.
func relationProblems(rel pgRelationInfo) []string {
	var p []string
	if rel.Kind != "r" && rel.Kind != "p" {
		p = append(p, fmt.Sprintf("relation is not a table (relkind %q)", rel.Kind))
	}
	switch rel.Persistence {
	case "u":
		p = append(p, "table is unlogged: a crash of the server empties it, and every run's fence would start again at 1 (ALTER TABLE … SET LOGGED)")
	case "t":
		p = append(p, "table is temporary: it belongs to one connection and goes with it, and it shadows a permanent table of the name")
	}
	if rel.PartitionNotLogged {
		p = append(p, "a partition of the table is unlogged or temporary: a crash of the server empties it, and fences would start again at 1")
	}
	return p
}

type pgColumn struct {
	Name, Type    string
	NotNull       bool
	Collation     string
	Deterministic bool
	PrimaryKey    bool
}

// shapeProblems says what is wrong with the table's columns.
func shapeProblems(cols []pgColumn) []string {
	var p []string
	seen := map[string]bool{}
	for _, c := range cols {
		seen[c.Name] = true
		switch {
		case c.Name != "key" && c.Name != "value":
			p = append(p, fmt.Sprintf("unexpected column %q", c.Name))
		case c.Type != "text":
			p = append(p, fmt.Sprintf("column %s has type %s, want text", c.Name, c.Type))
		case c.Name == "key" && c.Collation != "C" && c.Collation != "POSIX":
			p = append(p, fmt.Sprintf(`column key has collation %q, want "C"`, c.Collation))
		case c.Name == "value" && !c.Deterministic:
			p = append(p, fmt.Sprintf("column value has the nondeterministic collation %q", c.Collation))
		}
		if c.Name == "key" && !c.PrimaryKey {
			p = append(p, "column key is not the primary key")
		}
		if c.Name == "value" && !c.NotNull {
			p = append(p, "column value is not NOT NULL")
		}
	}
	for _, name := range []string{"key", "value"} {
		if !seen[name] {
			p = append(p, fmt.Sprintf("column %s is missing", name))
		}
	}
	return p
}
