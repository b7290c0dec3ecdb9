package etcdstore

import (
	"bytes"
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/areev/runlease"
)

// A bell is what MetaDeleteNotify writes to wake the subscribers of a key:
// the etcd key of that key followed by one NUL. runlease keys never hold
// NUL ([runlease.CheckKey]), so no row ever has a bell's key, and every
// etcd key under the prefix that holds a NUL is a bell. A bell's value
// means nothing: each put is a new revision, and the revision is what a
// watch reports. Bells are never deleted; every read skips them
// (appendRows), and a key's watch covers its bell too (watch).

// bellKey returns the etcd key of the bell of the key whose etcd key is
// full.
func bellKey(full string) string { return full + "\x00" }

// isBell reports whether the etcd key k, under the store's prefix, is a
// bell rather than a row.
func (s *Store) isBell(k []byte) bool { return bytes.IndexByte(k[len(s.o.prefix):], 0) >= 0 }

// MetaDeleteNotify implements [runlease.DeleteNotifier]: MetaDelete that,
// when it deletes, wakes the subscribers of wakeKey on every node. It is one
// Txn: compare key's value with expected, and on success delete key and
// put wakeKey's bell, an etcd key no row can have (wakeKey's etcd key
// followed by a NUL), which the watch of wakeKey sees at the revision of
// the delete. So a subscriber woken by it reads a store that no longer
// holds the row, and a refused delete (the value differs, or key is
// absent) wakes no one and writes nothing.
//
// Bells cost one more put in the releasing Txn, on every release whether
// or not anyone waits, and one small key per wakeKey ever rung, which is
// never deleted; no read of the store returns a bell.
//
// It fails with [runlease.ErrInvalidArgument] when key, expected or
// wakeKey is invalid, before anything is sent, and with a
// [*runlease.StorageError] labelled as for MetaDelete otherwise: when it
// is outcome unknown, both the delete and the bell may have happened, or
// neither.
func (s *Store) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	if err := checkWrite(key, &expected, ""); err != nil {
		return false, err
	}
	if err := runlease.CheckKey(wakeKey); err != nil {
		return false, err
	}
	if err := s.enter(ctx, "MetaDeleteNotify", key); err != nil {
		return false, err
	}
	req := &pb.TxnRequest{
		Compare: []*pb.Compare{s.cond(runlease.IfEquals(key, expected))},
		// key and the bell never overlap (a bell holds a NUL, key does
		// not), as etcd requires of the keys one Txn writes.
		Success: []*pb.RequestOp{s.del(key), s.ring(wakeKey)},
	}
	resp, err := s.txn(ctx, "MetaDeleteNotify", key, req)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// ring is the put of key's bell.
func (s *Store) ring(key string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: []byte(bellKey(s.o.prefix + key))}}}
}
