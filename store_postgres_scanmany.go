package runlease

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// readRows sends stmts, reads of (key, value) rows, as one message on one
// of the pool's connections, and returns the rows of each: the reads of
// MetaScanMany and MetaRanges, one round trip however many there are. op
// and key, the first read's prefix, name the call in a fault.
func (s *PostgresStore) readRows(ctx context.Context, op, key string, stmts []pgStmt) ([][]Row, error) {
	out := make([][]Row, len(stmts))
	err := s.do(ctx, op, key, false, func(c *pgx.Conn) error {
		res, err := send(ctx, c, stmts...)
		if err != nil {
			return err
		}
		for i := range stmts {
			out[i] = resultRows(res[i])
		}
		return nil
	})
	if err != nil {
		return nil, err
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
	return s.readRows(ctx, "MetaScanMany", prefixes[0], stmts)
}
