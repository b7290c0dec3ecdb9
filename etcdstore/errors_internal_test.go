package etcdstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/areev/runlease"
)

func TestFaultLabels(t *testing.T) {
	s := &Store{}
	for _, c := range []struct {
		name          string
		err           error
		sent, unknown bool
	}{
		{"a_write_never_sent_is_not_applied", status.Error(codes.Unavailable, "connection refused"), false, false},
		{"a_lost_connection_after_sending_is_unknown", status.Error(codes.Unavailable, "error reading from server: EOF"), true, true},
		{"a_leader_change_midway_is_unknown", rpctypes.ErrGRPCLeaderChanged, true, true},
		{"a_server_timeout_is_unknown", rpctypes.ErrGRPCTimeout, true, true},
		{"too_many_ops_is_refused", rpctypes.ErrGRPCTooManyOps, true, false},
		{"a_request_too_large_is_refused", rpctypes.ErrGRPCRequestTooLarge, true, false},
		{"too_many_requests_is_refused", rpctypes.ErrGRPCRequestTooManyRequests, true, false},
		{"a_permission_denied_is_refused", rpctypes.ErrGRPCPermissionDenied, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := s.fault(context.Background(), "MetaCAS", "k", true, c.sent, c.err)
			var se *runlease.StorageError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, c.unknown, se.Unknown, "%v", err)
		})
	}

	t.Run("a_read_is_never_unknown", func(t *testing.T) {
		err := s.fault(context.Background(), "MetaGet", "k", false, true, rpctypes.ErrGRPCTimeout)
		assert.False(t, runlease.IsOutcomeUnknown(err))
	})

	t.Run("an_ended_context_is_matchable_and_not_retryable", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := s.fault(ctx, "MetaCAS", "k", true, true, status.Error(codes.Canceled, "context canceled"))
		require.ErrorIs(t, err, context.Canceled)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.True(t, se.Unknown, "cancelled after sending")
		assert.False(t, se.Retryable)
	})

	t.Run("a_server_timeout_at_the_callers_deadline_matches_the_deadline", func(t *testing.T) {
		// The server's timer may answer before ctx is marked done.
		ctx, cancel := context.WithDeadline(context.WithoutCancel(context.Background()), time.Now().Add(-time.Millisecond))
		defer cancel()
		err := s.fault(noDoneYet{ctx}, "MetaCASMany", "", true, true, rpctypes.ErrGRPCTimeout)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.True(t, runlease.IsOutcomeUnknown(err))
	})

	t.Run("a_server_timeout_just_before_the_callers_deadline_waits_for_it", func(t *testing.T) {
		// The server's timer fired a moment before this process's: the
		// call returns once ctx has ended, with an error that matches it.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		err := s.fault(ctx, "MetaCAS", "k", true, true, rpctypes.ErrGRPCTimeout)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded, "returned before its context ended")
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.False(t, se.Retryable)
	})

	t.Run("a_server_timeout_long_before_the_callers_deadline_is_the_servers", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		err := s.fault(ctx, "MetaCAS", "k", true, true, rpctypes.ErrGRPCTimeout)
		require.NotErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, ctx.Err())
		assert.True(t, runlease.IsOutcomeUnknown(err))
	})

	t.Run("a_request_refused_for_its_size_is_not_retryable_though_other_exhaustion_is", func(t *testing.T) {
		for _, c := range []struct {
			err       error
			retryable bool
		}{
			{status.Error(codes.ResourceExhausted, "grpc: received message larger than max (2662469 vs. 2097152)"), false},
			{status.Error(codes.ResourceExhausted, "grpc: trying to send message larger than max (2662469 vs. 2097152)"), false},
			{rpctypes.ErrGRPCRequestTooLarge, false},
			{rpctypes.ErrGRPCRequestTooManyRequests, true},
		} {
			err := s.fault(context.Background(), "MetaBatch", "", true, true, c.err)
			var se *runlease.StorageError
			require.ErrorAs(t, err, &se)
			assert.False(t, se.Unknown, "%v", err)
			assert.Equal(t, c.retryable, se.Retryable, "%v", err)
		}
	})

	t.Run("the_clients_password_never_reaches_a_message", func(t *testing.T) {
		s := &Store{secret: "hunter2"}
		cause := errors.New("auth failed for root:hunter2")
		err := s.fault(context.Background(), "MetaGet", "k", false, false, cause)
		assert.NotContains(t, err.Error(), "hunter2")
		assert.ErrorIs(t, err, cause, "the driver's error is still reachable")
	})
}

// noDoneYet is a context whose deadline has passed but that does not say
// so yet, as a context is between its deadline and its timer firing.
type noDoneYet struct{ context.Context }

func (noDoneYet) Err() error { return nil }
