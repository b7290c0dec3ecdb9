package runlease

import "context"

// scanMany scans every prefix, in one call when the store can.
func scanMany(ctx context.Context, s Store, prefixes ...string) ([][]Row, error) {
	if m, ok := s.(MultiScanner); ok {
		return m.MetaScanMany(ctx, prefixes)
	}
	return scanEach(ctx, s, prefixes)
}

// scanEach scans every prefix, one MetaScan after another.
func scanEach(ctx context.Context, s Store, prefixes []string) ([][]Row, error) {
	out := make([][]Row, len(prefixes))
	for i, p := range prefixes {
		rows, err := s.MetaScan(ctx, p)
		if err != nil {
			return nil, err
		}
		out[i] = rows
	}
	return out, nil
}
