package etcdstore

import (
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// requestEnvelope bounds what etcd adds to a Txn before it compares the
// request with its --max-request-bytes: the Txn is proposed inside an
// InternalRaftRequest, beside a header holding a request id, the client's
// user name (counted apart) and its auth revision. Each of those fields
// takes at most a dozen bytes, their tags and lengths included.
const requestEnvelope = 64

// fits returns how many bytes of a request's Txn the cluster accepts:
// the store's limit less etcd's envelope.
func (s *Store) fits() int {
	return s.o.maxRequestBytes - requestEnvelope - len(s.client.Username)
}

// checkSize refuses req, before it is sent, when the cluster would refuse
// it for its size: no retry can make it fit.
func (s *Store) checkSize(op string, req *pb.TxnRequest) error {
	if n := proto.Size(req); n > s.fits() {
		return invalidArg("%s: a Txn of %d bytes is over the %d bytes etcd accepts in one request (see WithMaxRequestBytes)",
			op, n+requestEnvelope+len(s.client.Username), s.o.maxRequestBytes)
	}
	return nil
}

// opSize is what op adds to a Txn that carries it: the op and its tag and
// length as an element of the Txn's list of ops.
func opSize(op *pb.RequestOp) int { return 1 + protowire.SizeBytes(proto.Size(op)) }

// tooLarge reports whether err says that a request was refused for its
// size: by etcd, past --max-request-bytes, or by gRPC, on either side,
// past the largest message it takes. Such a request was not applied, and
// sending it again can never succeed.
func tooLarge(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "request is too large") || strings.Contains(msg, "message larger than max")
}
