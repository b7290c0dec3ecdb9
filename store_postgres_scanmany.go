package runlease

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// sendRows sends stmts, reads of (key, value) rows, as one message, and
// returns the rows of each.
func sendRows(ctx context.Context, c *pgx.Conn, stmts []pgStmt) ([][]Row, error) {
	res, err := send(ctx, c, stmts...)
	if err != nil {
		return nil, err
	}
	out := make([][]Row, len(stmts))
	for i := range stmts {
		rows := make([]Row, 0, len(res[i].Rows))
		for _, r := range res[i].Rows {
			rows = append(rows, Row{Key: string(r[0]), Value: string(r[1])})
		}
		out[i] = rows
	}
	return out, nil
}

// MetaScanMany implements [MultiScanner]: the scans travel as statements of
// one message, so they cost one round trip.
func (s *PostgresStore) MetaScanMany(ctx context.Context, prefixes []string) ([][]Row, error) {
	if s.closed.Load() {
		return nil, ErrStoreClosed
	}
	if err := CheckPrefixes(prefixes); err != nil {
		return nil, err
	}
	if len(prefixes) == 0 {
		return [][]Row{}, nil
	}
	stmts := make([]pgStmt, len(prefixes))
	for i, p := range prefixes {
		stmts[i] = pgStmt{s.q.scanOpen, []any{p}}
		if end, ok := PrefixEnd(p); ok {
			stmts[i] = pgStmt{s.q.scan, []any{p, end}}
		}
	}
	out := make([][]Row, len(prefixes))
	err := s.do(ctx, "MetaScanMany", prefixes[0], false, func(c *pgx.Conn) error {
		var err error
		out, err = sendRows(ctx, c, stmts)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
