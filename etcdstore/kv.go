package etcdstore

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/areev/runlease"
)

// maxScanRestarts is how often MetaScan starts over when the revision it
// reads at is compacted between two of its pages.
const maxScanRestarts = 5

// MetaGet implements [runlease.Store] with one linearizable read.
func (s *Store) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if err := runlease.CheckKey(key); err != nil {
		return "", false, err
	}
	if err := s.enter(ctx, "MetaGet", key); err != nil {
		return "", false, err
	}
	resp, err := s.client.Get(ctx, s.o.prefix+key)
	if err != nil {
		return "", false, s.fault(ctx, "MetaGet", key, false, false, err)
	}
	if len(resp.Kvs) == 0 {
		return "", false, nil
	}
	return string(resp.Kvs[0].Value), true, nil
}

// MetaCAS implements [runlease.Store] with one Txn: create-if-absent compares
// the key's CreateRevision with 0, a swap compares its value.
func (s *Store) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := checkWrite(key, expected, value); err != nil {
		return false, err
	}
	if err := s.enter(ctx, "MetaCAS", key); err != nil {
		return false, err
	}
	req := &pb.TxnRequest{
		Compare: []*pb.Compare{s.cond(runlease.Cond{Key: key, Value: expected})},
		Success: []*pb.RequestOp{s.put(key, value)},
	}
	resp, err := s.txn(ctx, "MetaCAS", key, req)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// MetaCASNotify implements [runlease.Notifier]. Every write to a key wakes
// its watchers, so it is MetaCAS.
func (s *Store) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return s.MetaCAS(ctx, key, expected, value)
}

// MetaDelete implements [runlease.Store] with one Txn comparing the value.
func (s *Store) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if err := checkWrite(key, &expected, ""); err != nil {
		return false, err
	}
	if err := s.enter(ctx, "MetaDelete", key); err != nil {
		return false, err
	}
	req := &pb.TxnRequest{
		Compare: []*pb.Compare{s.cond(runlease.IfEquals(key, expected))},
		Success: []*pb.RequestOp{s.del(key)},
	}
	resp, err := s.txn(ctx, "MetaDelete", key, req)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// MetaScan implements [runlease.Store] as a key range read in pages of
// [WithScanPage] rows. Every page after the first is read at the first's
// revision, so the result is one snapshot however many pages it takes; if
// that revision is compacted midway, the scan starts over.
func (s *Store) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	if err := runlease.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	if err := s.enter(ctx, "MetaScan", prefix); err != nil {
		return nil, err
	}
	start, end := s.rangeOf(prefix)
	for try := 0; ; try++ {
		rows, err := s.scanAt(ctx, start, end, 0)
		if err == nil {
			return rows, nil
		}
		if !isCompacted(err) || try >= maxScanRestarts {
			return nil, s.fault(ctx, "MetaScan", prefix, false, false, err)
		}
	}
}

// rangeOf returns the etcd keys [start, end) of the rows under prefix.
func (s *Store) rangeOf(prefix string) (start, end string) {
	full := s.o.prefix + prefix
	if full == "" {
		return "\x00", "\x00" // every key
	}
	return full, clientv3.GetPrefixRangeEnd(full)
}

// scanAt reads [start, end) page by page, at revision rev, or at the
// revision of the first page when rev is 0.
func (s *Store) scanAt(ctx context.Context, start, end string, rev int64) ([]runlease.Row, error) {
	var rows []runlease.Row
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(s.o.scanPage))}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.client.Get(ctx, start, opts...)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		rows = s.appendRows(rows, resp.Kvs)
		// Paged by the keys read, not the rows kept: a page of bells
		// alone adds no row, yet the range goes on after it.
		if !resp.More || len(resp.Kvs) == 0 {
			return rows, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// appendRows appends the rows of kvs, their keys without the store's
// prefix, to rows, leaving out bells (bell.go), which are not rows. Every
// read of rows goes through it.
func (s *Store) appendRows(rows []runlease.Row, kvs []*mvccpb.KeyValue) []runlease.Row {
	for _, kv := range kvs {
		if s.isBell(kv.Key) {
			continue
		}
		rows = append(rows, runlease.Row{Key: string(kv.Key[len(s.o.prefix):]), Value: string(kv.Value)})
	}
	return rows
}

func isCompacted(err error) bool {
	return rpctypes.Error(err) == rpctypes.ErrCompacted
}

// checkWrite validates a conditional write's arguments.
func checkWrite(key string, expected *string, value string) error {
	if err := runlease.CheckKey(key); err != nil {
		return err
	}
	if expected != nil {
		if err := runlease.CheckValue(*expected); err != nil {
			return err
		}
	}
	return runlease.CheckValue(value)
}

// cond is the comparison of a condition: an absent key has CreateRevision 0;
// an equal value compares equal (etcd fails a value comparison on an absent
// key, so "" does not match a missing key).
func (s *Store) cond(c runlease.Cond) *pb.Compare {
	key := []byte(s.o.prefix + c.Key)
	if c.Value == nil {
		return &pb.Compare{Result: pb.Compare_EQUAL, Target: pb.Compare_CREATE, Key: key,
			TargetUnion: &pb.Compare_CreateRevision{CreateRevision: 0}}
	}
	return &pb.Compare{Result: pb.Compare_EQUAL, Target: pb.Compare_VALUE, Key: key,
		TargetUnion: &pb.Compare_Value{Value: []byte(*c.Value)}}
}

func (s *Store) put(key, value string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: []byte(s.o.prefix + key), Value: []byte(value)}}}
}

func (s *Store) del(key string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{
		Key: []byte(s.o.prefix + key)}}}
}

// txn sends req through the raw KV stub rather than clientv3's KV, because
// the label of a fault depends on whether the request left: grpc.Peer is
// filled in only once a transport stream carried it, so an empty peer after
// a failure means nothing was sent (no member was reachable while the call
// waited, or it was refused before a stream opened). The client's retry
// interceptor is on the connection, so it still applies, and it retries a
// Txn only when the request was not sent.
//
// A request larger than the cluster accepts is refused before it is sent
// (checkSize).
func (s *Store) txn(ctx context.Context, op, key string, req *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := s.checkSize(op, req); err != nil {
		return nil, err
	}
	var p peer.Peer
	resp, err := s.kv.Txn(ctx, req, grpc.WaitForReady(true), grpc.Peer(&p))
	if err != nil {
		return nil, s.fault(ctx, op, key, true, p.Addr != nil, err)
	}
	return resp, nil
}
