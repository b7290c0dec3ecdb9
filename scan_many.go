package runlease

import "context"

// MultiScanner is an optional capability of a Store: several MetaScans in
// one call, which a networked store sends in one round trip. A claim of
// slots reads a scope's slot rows and its queue with it, so that the queue
// costs a claim no round trip of its own. Both built-in stores implement
// it.
type MultiScanner interface {
	// MetaScanMany returns, for each prefix, what MetaScan of it returns.
	// It is not a snapshot: each scan is linearizable on its own. More than
	// [MaxScanMany] prefixes, or an invalid one, is refused with
	// [ErrInvalidArgument] before anything is read.
	MetaScanMany(ctx context.Context, prefixes []string) ([][]Row, error)
}

// MaxScanMany is the most prefixes one MetaScanMany call may take.
const MaxScanMany = 16

// CheckPrefixes returns an [ErrInvalidArgument] error when prefixes is not
// a list MetaScanMany accepts, and nil otherwise.
func CheckPrefixes(prefixes []string) error {
	if len(prefixes) > MaxScanMany {
		return invalidArg("prefixes", "%d prefixes; the limit is %d", len(prefixes), MaxScanMany)
	}
	for _, p := range prefixes {
		if err := CheckPrefix(p); err != nil {
			return err
		}
	}
	return nil
}

// scanMany scans every prefix, in one call when the store can.
func scanMany(ctx context.Context, s Store, prefixes ...string) ([][]Row, error) {
	if m, ok := s.(MultiScanner); ok {
		return m.MetaScanMany(ctx, prefixes)
	}
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
