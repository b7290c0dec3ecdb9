package runlease

import (
	"context"
	"sort"
	"strings"
)

// Range is one ordered read of [RangeReader]: at most Limit rows whose key
// starts with Prefix and is greater than After, in ascending byte order of
// key. After "" starts at the first key of the prefix; Limit 0 reads every
// row the range holds (a MetaScan of Prefix, cut at After).
type Range struct {
	Prefix string
	After  string
	Limit  int
}

// RangeReader is an optional capability of a Store: ordered reads of the
// first rows of several prefixes, in one call that a networked store sends
// in one round trip. The admission queue keeps a waiter's rank in its key,
// so the head of a queue is the first rows of its prefix: with this, a
// claim or a wake-up reads only the head, and costs the same behind a
// queue of ten entries or of a hundred thousand. Without it the library
// reads the whole prefix and keeps the head itself (correct, and as slow
// as the queue is long). Both built-in stores and the etcd store implement
// it.
type RangeReader interface {
	// MetaRanges returns, for each range, its rows: what MetaScan of
	// the range's prefix returns, without the keys up to and including
	// After, and cut after Limit rows when Limit is positive. It is not a
	// snapshot: each range is linearizable on its own. More than
	// [MaxScanMany] ranges, an invalid prefix or after key, or a negative
	// limit is refused with [ErrInvalidArgument] before anything is read.
	MetaRanges(ctx context.Context, ranges []Range) ([][]Row, error)
}

// CheckRanges returns an [ErrInvalidArgument] error when ranges is not a
// list MetaRanges accepts, and nil otherwise.
func CheckRanges(ranges []Range) error {
	if len(ranges) > MaxScanMany {
		return invalidArg("ranges", "%d ranges; the limit is %d", len(ranges), MaxScanMany)
	}
	for _, r := range ranges {
		if err := CheckPrefix(r.Prefix); err != nil {
			return err
		}
		if len(r.After) > MaxKeyLen {
			return invalidArg("after", "%d bytes long, the limit is %d", len(r.After), MaxKeyLen)
		}
		if err := checkText("after", r.After); err != nil {
			return err
		}
		if r.Limit < 0 {
			return invalidArg("limit", "%d is negative", r.Limit)
		}
	}
	return nil
}

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
