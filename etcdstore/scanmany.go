package etcdstore

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
)

// MetaScanMany implements [runlease.MultiScanner]: the first page of every
// prefix in one read-only Txn, so a claim or a waiter reads a scope's
// slots, queue and fair-share marks in one round trip, all at the Txn's
// revision; a prefix with more rows than a page ([WithScanPage]) is read on
// at that same revision, page by page, as MetaScan does.
func (s *Store) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	if err := runlease.CheckPrefixes(prefixes); err != nil {
		return nil, err
	}
	first := ""
	if len(prefixes) > 0 {
		first = prefixes[0]
	}
	if err := s.enter(ctx, "MetaScanMany", first); err != nil {
		return nil, err
	}
	if len(prefixes) == 0 {
		return nil, nil
	}
	for try := 0; ; try++ {
		out, err := s.scanManyAt(ctx, prefixes)
		if err == nil {
			return out, nil
		}
		if !isCompacted(err) || try >= maxScanRestarts {
			return nil, s.fault(ctx, "MetaScanMany", first, false, false, err)
		}
	}
}

func (s *Store) scanManyAt(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	ends := make([]string, len(prefixes))
	ops := make([]clientv3.Op, len(prefixes))
	for i, p := range prefixes {
		start, end := s.rangeOf(p)
		ends[i] = end
		ops[i] = clientv3.OpGet(start, clientv3.WithRange(end), clientv3.WithLimit(int64(s.o.scanPage)))
	}
	// A Txn without comparisons that only reads: linearizable, and retried
	// by the client like a Range when a member fails.
	resp, err := s.client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	out := make([][]runlease.Row, len(prefixes))
	for i, r := range resp.Responses {
		rr := r.GetResponseRange()
		rows := s.appendRows(nil, rr.Kvs)
		// As in scanAt: by the keys read, so a first page of bells alone
		// is read on from.
		if rr.More && len(rr.Kvs) > 0 {
			rest, err := s.scanAt(ctx, string(rr.Kvs[len(rr.Kvs)-1].Key)+"\x00", ends[i], resp.Header.Revision)
			if err != nil {
				return nil, err
			}
			rows = append(rows, rest...)
		}
		out[i] = rows
	}
	return out, nil
}
