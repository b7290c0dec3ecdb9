package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/areev/runlease"
)

// fault classifies an error of the etcd client as a [*runlease.StorageError].
//
// A write is labelled Unknown when it may have been applied: it was sent
// (sent is true) and etcd did not refuse it. etcd refuses a request before
// proposing it with InvalidArgument, FailedPrecondition, ResourceExhausted,
// PermissionDenied, Unauthenticated and the like; everything else after
// sending (a deadline, a lost connection, "leader changed", "request timed
// out") leaves the proposal possibly committed.
//
// A request refused for its size (past etcd's --max-request-bytes, or
// gRPC's largest message) is not applied and never Retryable.
//
// A call whose ctx has ended gives up: its error matches ctx's with
// errors.Is and is never Retryable, whatever gRPC made of the end of ctx.
// deadlineSlack is how far ahead of the caller's deadline a timeout from
// the server is taken as that deadline's: the server's timer and this
// process's run on different clocks.
const deadlineSlack = 50 * time.Millisecond

func (s *Store) fault(ctx context.Context, op, key string, write, sent bool, err error) error {
	if !sent && s.closed.Load() {
		return runlease.ErrStoreClosed
	}
	err = rpctypes.Error(err)
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); ok && cerr == nil && time.Until(dl) <= deadlineSlack &&
		(!time.Now().Before(dl) || code == codes.DeadlineExceeded || errors.Is(err, rpctypes.ErrTimeout)) {
		// gRPC hands the deadline to the server, whose timer can fire
		// ("request timed out") and answer a moment before this process's
		// timer ends ctx: the deadline caused the fault all the same. Wait
		// for ctx to end, so that the call returns as its context's error
		// says, and the caller's ctx.Err() agrees with it.
		t := time.NewTimer(time.Until(dl) + deadlineSlack)
		select {
		case <-ctx.Done():
			cerr = ctx.Err()
		case <-t.C:
		}
		t.Stop()
		if cerr == nil && !time.Now().Before(dl) {
			cerr = context.DeadlineExceeded // past it, however ctx says so
		}
	}
	if cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", err, cerr) // the end of ctx caused it: keep it matchable
	}
	se := &runlease.StorageError{Op: op, Key: key, Err: redact(err, s.secret)}
	se.Unknown = write && sent && !refused(code)
	se.Retryable = cerr == nil && (code == codes.Unavailable || code == codes.ResourceExhausted ||
		code == codes.DeadlineExceeded || code == codes.Aborted)
	if tooLarge(err) {
		// Refused for its size (ResourceExhausted from gRPC, or etcd's
		// "request is too large"): it was not applied, and no retry can
		// make it fit. The store's own check (checkSize) refuses such a
		// request before sending it unless the cluster's limit is lower
		// than the store was told.
		se.Unknown, se.Retryable = false, false
		se.Err = fmt.Errorf("%w (the request is larger than the cluster accepts: see WithMaxRequestBytes)", se.Err)
	}
	return se
}

// refused reports whether etcd answers with code only for a request it did
// not apply.
func refused(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.ResourceExhausted,
		codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.NotFound, codes.AlreadyExists:
		return true
	}
	return false
}

// redact keeps secret (the client's password) out of err's text. The etcd
// client leaves passwords out of its messages; this is a second line of
// defence.
func redact(err error, secret string) error {
	if secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	return &redactedError{err: err, secret: secret}
}

type redactedError struct {
	err    error
	secret string
}

func (e *redactedError) Error() string { return strings.ReplaceAll(e.err.Error(), e.secret, "xxxxx") }
func (e *redactedError) Unwrap() error { return e.err }
