package etcdstore

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/areev/runlease"
)

// MetaBatch implements [runlease.Batcher] as one Txn: each condition is a
// comparison (an absent key has CreateRevision 0, an equal value compares
// equal), each op a put or a delete. etcd limits the comparisons, and the
// operations, of one Txn (see [WithMaxTxnOps]); a batch is atomic, so it
// cannot be split, and one with more conditions or ops than that limit is
// refused before anything is sent, with an error that matches
// [runlease.ErrInvalidArgument], as [runlease.CheckBatch] refuses one over
// [runlease.MaxBatch]. So is a batch larger than the cluster accepts in one
// request ([WithMaxRequestBytes]): two values of a MiB each, for one.
func (s *Store) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	if err := runlease.CheckBatch(conds, ops); err != nil {
		return false, err
	}
	if len(conds) > s.o.maxTxnOps || len(ops) > s.o.maxTxnOps {
		return false, invalidArg("a batch of %d conditions and %d ops is over the %d operations etcd allows in one Txn (see WithMaxTxnOps)",
			len(conds), len(ops), s.o.maxTxnOps)
	}
	if err := s.enter(ctx, "MetaBatch", ""); err != nil {
		return false, err
	}
	req := &pb.TxnRequest{Compare: make([]*pb.Compare, len(conds)), Success: make([]*pb.RequestOp, len(ops))}
	for i, c := range conds {
		req.Compare[i] = s.cond(c)
	}
	for i, op := range ops {
		if op.Delete {
			req.Success[i] = s.del(op.Key)
		} else {
			req.Success[i] = s.put(op.Key, op.Value)
		}
	}
	resp, err := s.txn(ctx, "MetaBatch", "", req)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// MetaCASMany implements [runlease.MultiCASer]. Each write is a nested Txn,
// with its own comparison, inside one Txn without conditions, so every write
// applies or not on its own, in one round trip. etcd counts a nested Txn's
// operations against what its parent leaves of the limit, so one Txn carries
// at most [WithMaxTxnOps] − 1 writes, and no more bytes than
// [WithMaxRequestBytes]: more are sent as several Txns, one after another.
// When one of them fails after another applied, the error is labelled
// outcome unknown, since it speaks for every write. A write too large for
// a Txn of its own is refused, with an error that matches
// [runlease.ErrInvalidArgument], before anything is sent.
func (s *Store) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	if err := runlease.CheckCASMany(writes); err != nil {
		return nil, err
	}
	for _, w := range writes {
		if w.Expected != nil {
			if err := runlease.CheckValue(*w.Expected); err != nil {
				return nil, err
			}
		}
	}
	chunks, err := s.casChunks(writes)
	if err != nil {
		return nil, err
	}
	if err := s.enter(ctx, "MetaCASMany", ""); err != nil {
		return nil, err
	}
	swapped := make([]bool, 0, len(writes))
	for _, chunk := range chunks {
		got, err := s.casChunk(ctx, chunk)
		if err != nil {
			if se, ok := err.(*runlease.StorageError); ok && len(swapped) > 0 {
				se.Unknown = true // earlier chunks were applied
			}
			return nil, err
		}
		swapped = append(swapped, got...)
	}
	return swapped, nil
}

// casChunks splits writes, in order, into the Txns that carry them: each
// of at most WithMaxTxnOps − 1 writes and within the cluster's request
// size. It refuses a write that fits no Txn, so that nothing is sent.
func (s *Store) casChunks(writes []runlease.CASWrite) ([][]*pb.RequestOp, error) {
	var chunks [][]*pb.RequestOp
	var cur []*pb.RequestOp
	size, per, fits := 0, s.o.maxTxnOps-1, s.fits()
	for _, w := range writes {
		op := s.casOp(w)
		n := opSize(op)
		if n > fits {
			return nil, invalidArg("MetaCASMany: the write of %q takes %d bytes, over the %d bytes etcd accepts in one request (see WithMaxRequestBytes)",
				w.Key, n+requestEnvelope+len(s.client.Username), s.o.maxRequestBytes)
		}
		if len(cur) == per || size+n > fits {
			chunks, cur, size = append(chunks, cur), nil, 0
		}
		cur, size = append(cur, op), size+n
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks, nil
}

// casOp is one write of MetaCASMany: a nested Txn with its own comparison.
func (s *Store) casOp(w runlease.CASWrite) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
		Compare: []*pb.Compare{s.cond(runlease.Cond{Key: w.Key, Value: w.Expected})},
		Success: []*pb.RequestOp{s.put(w.Key, w.Value)},
	}}}
}

func (s *Store) casChunk(ctx context.Context, ops []*pb.RequestOp) ([]bool, error) {
	resp, err := s.txn(ctx, "MetaCASMany", "", &pb.TxnRequest{Success: ops})
	if err != nil {
		return nil, err
	}
	got := make([]bool, len(ops))
	for i, r := range resp.Responses {
		got[i] = r.GetResponseTxn().GetSucceeded()
	}
	return got, nil
}
