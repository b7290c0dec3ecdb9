package runlease

import (
	"context"
	"sort"
	"strings"
)

// readRanges reads every range, in one call when the store is a
// [RangeReader], and otherwise from a scan of each prefix (one call for
// them all when it is a [MultiScanner]), cut as MetaRanges cuts it.
func readRanges(ctx context.Context, s Store, ranges ...Range) ([][]Row, error) {
	if r, ok := s.(RangeReader); ok {
		return r.MetaRanges(ctx, ranges)
	}
	if err := CheckRanges(ranges); err != nil {
		return nil, err
	}
	prefixes := make([]string, len(ranges))
	for i, r := range ranges {
		prefixes[i] = r.Prefix
	}
	all, err := scanMany(ctx, s, prefixes...)
	if err != nil {
		return nil, err
	}
	for i, r := range ranges {
		all[i] = cutRange(all[i], r)
	}
	return all, nil
}

// cutRange keeps the rows of a prefix's scan that r reads: those after
// r.After, at most r.Limit of them. rows are in ascending key order.
func cutRange(rows []Row, r Range) []Row {
	if r.After != "" {
		i := sort.Search(len(rows), func(i int) bool { return strings.Compare(rows[i].Key, r.After) > 0 })
		rows = rows[i:]
	}
	if r.Limit > 0 && len(rows) > r.Limit {
		rows = rows[:r.Limit:r.Limit]
	}
	return rows
}
