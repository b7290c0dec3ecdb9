package etcdstore

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
)

// MetaRanges implements [runlease.RangeReader]: every range as one Range
// request of a read-only Txn, so a claim or a waiter reads the heads of a
// scope's queue and its other prefixes in one round trip, all at the Txn's
// revision. Each request starts at the prefix or just after After,
// whichever is later, and asks for one row more than the limit: the bell
// of a scope's queue (bell.go) is the first key of its prefix and is not a
// row, and the spare row keeps it from costing a second request. When
// bells still leave a range short of its limit, or a range holds more rows
// than a page ([WithScanPage]), it is read on at that same revision, page
// by page, as MetaScan does; if that revision is compacted meanwhile, the
// call starts over.
func (s *Store) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	if err := runlease.CheckRanges(ranges); err != nil {
		return nil, err
	}
	first := ""
	if len(ranges) > 0 {
		first = ranges[0].Prefix
	}
	if err := s.enter(ctx, "MetaRanges", first); err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		out, err := s.rangesAt(ctx, ranges)
		if err == nil {
			return out, nil
		}
		if !isCompacted(err) || try >= maxScanRestarts {
			return nil, s.fault(ctx, "MetaRanges", first, false, false, err)
		}
	}
}

// etcdRange is one range of MetaRanges as etcd keys: [start, end), where
// end "\x00" is no end, and at most limit rows (0: all of them).
type etcdRange struct {
	start, end string
	limit      int
}

// rangeFrom returns r as etcd keys, and false when it holds no key.
func (s *Store) rangeFrom(r runlease.Range) (etcdRange, bool) {
	start, end := s.rangeOf(r.Prefix)
	if r.After != "" {
		// The least key greater than After: keys hold no NUL, so none
		// lies between the two (After's bell does, and is skipped).
		if a := s.o.prefix + r.After + "\x00"; a > start {
			start = a
		}
	}
	if end != "\x00" && start >= end {
		return etcdRange{}, false
	}
	return etcdRange{start: start, end: end, limit: r.Limit}, true
}

// request returns the Range request that reads on from start, at revision
// rev (0: the current one), having kept got rows of r.
func (s *Store) request(r etcdRange, start string, got int, rev int64) clientv3.Op {
	n := s.o.scanPage
	if r.limit > 0 {
		n = min(n, r.limit-got+1)
	}
	// etcd returns a range in ascending key order unless asked to sort
	// otherwise; a sort would make it read the whole range before the
	// limit, so none is asked for.
	opts := []clientv3.OpOption{clientv3.WithRange(r.end), clientv3.WithLimit(int64(n))}
	if rev != 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	return clientv3.OpGet(start, opts...)
}

// full reports whether rows are all that r reads.
func (r etcdRange) full(rows []runlease.Row) bool { return r.limit > 0 && len(rows) >= r.limit }

func (s *Store) rangesAt(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	out := make([][]runlease.Row, len(ranges))
	var (
		asked []int // the index of each request's range
		ers   []etcdRange
		ops   []clientv3.Op
	)
	for i, r := range ranges {
		out[i] = []runlease.Row{}
		er, ok := s.rangeFrom(r)
		if !ok {
			continue
		}
		asked = append(asked, i)
		ers = append(ers, er)
		ops = append(ops, s.request(er, er.start, 0, 0))
	}
	// A Txn without comparisons that only reads: linearizable, and retried
	// by the client like a Range when a member fails. Its requests are
	// read at one revision, which is where each range reads on. A cluster
	// that takes fewer requests a Txn than there are ranges gets several.
	for lo := 0; lo < len(ops); lo += s.o.maxTxnOps {
		hi := min(lo+s.o.maxTxnOps, len(ops))
		resp, err := s.client.Txn(ctx).Then(ops[lo:hi]...).Commit()
		if err != nil {
			return nil, err
		}
		for j, r := range resp.Responses {
			i := asked[lo+j]
			out[i], err = s.readOn(ctx, ers[lo+j], r.GetResponseRange(), resp.Header.Revision)
			if err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// readOn returns the rows of r, whose first page is rr, read on at
// revision rev until r is full or has no more keys.
func (s *Store) readOn(ctx context.Context, r etcdRange, rr *pb.RangeResponse, rev int64) ([]runlease.Row, error) {
	rows := s.appendRows([]runlease.Row{}, rr.Kvs)
	// As in scanAt: paged by the keys read, so a page of bells alone is
	// read on from.
	for !r.full(rows) && rr.More && len(rr.Kvs) > 0 {
		next := string(rr.Kvs[len(rr.Kvs)-1].Key) + "\x00"
		page, err := s.client.Do(ctx, s.request(r, next, len(rows), rev))
		if err != nil {
			return nil, err
		}
		rr = (*pb.RangeResponse)(page.Get())
		rows = s.appendRows(rows, rr.Kvs)
	}
	if r.full(rows) {
		rows = rows[:r.limit:r.limit]
	}
	return rows, nil
}

var _ runlease.RangeReader = (*Store)(nil)
