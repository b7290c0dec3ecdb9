package cli

import (
	"fmt"

	"github.com/areev/runlease"
)

const schemaHelp = `
Schema prints the statement that creates the Postgres store's table, for
migration tools: the one a driver runs when the table is absent. The key
column is text COLLATE "C" (byte order, which range scans rely on) and the
value column text, never jsonb (which would rewrite rows and break
compare-and-swap on the exact text). Give --table for a table other than
runlease_meta; schema.table names one in a schema.
`

func (c *cli) schema(args []string) error {
	var table string
	fs := c.newFlags("schema", "[--table NAME]", schemaHelp)
	fs.StringVar(&table, "table", runlease.DefaultPostgresTable, "the table's `NAME`, optionally schema.table")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("schema", "unexpected argument %q", pos[0])
	}
	ddl, err := runlease.PostgresSchema(table)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "%s;\n", ddl)
	return err
}
