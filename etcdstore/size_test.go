package etcdstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
)

// value returns a value of n bytes.
func value(n int) string { return strings.Repeat("v", n) }

// revisions returns the revision of the last write of every etcd key
// under the store's prefix, bells included: a write moves one of them, or
// adds a key.
func revisions(t *testing.T, s *etcdstore.Store) map[string]int64 {
	t.Helper()
	resp, err := s.Client().Get(t.Context(), s.Prefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	out := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.ModRevision
	}
	return out
}

// TestARequestTooLargeForTheClusterIsRefusedBeforeItIsSent runs writes
// larger than etcd's default --max-request-bytes (1.5 MiB), the test
// cluster's, though each value is within runlease.MaxValueLen: no retry
// could make them fit, so they are refused as invalid arguments, and
// nothing is sent.
func TestARequestTooLargeForTheClusterIsRefusedBeforeItIsSent(t *testing.T) {
	requireCluster(t)
	refused := func(t *testing.T, s *etcdstore.Store, rev map[string]int64, err error) {
		t.Helper()
		require.ErrorIs(t, err, runlease.ErrInvalidArgument)
		assert.Equal(t, runlease.CodeInvalidArgument, runlease.Code(err))
		assert.NotErrorIs(t, err, runlease.ErrStorage, "not a fault: a retry cannot make it fit")
		assert.Contains(t, err.Error(), "WithMaxRequestBytes")
		assert.Equal(t, rev, revisions(t, s), "nothing was written")
	}

	t.Run("a_fenced_write_of_two_values_of_a_MiB", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		lease, err := runlease.Acquire(t.Context(), s, "r1", "A")
		require.NoError(t, err)
		rev := revisions(t, s)
		err = lease.Write(t.Context(), runlease.Put("a", value(runlease.MaxValueLen)), runlease.Put("b", value(runlease.MaxValueLen)))
		refused(t, s, rev, err)
		_, found, err := s.MetaGet(t.Context(), "a")
		require.NoError(t, err)
		assert.False(t, found)
		require.NoError(t, lease.Write(t.Context(), runlease.Put("a", value(runlease.MaxValueLen))),
			"the lease is as it was, and a write that fits lands")
	})

	t.Run("a_swap_of_a_MiB_value_for_another", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		old := value(runlease.MaxValueLen)
		create(t, s, "k", old)
		rev := revisions(t, s)
		_, err := s.MetaCAS(t.Context(), "k", &old, strings.Repeat("w", runlease.MaxValueLen))
		refused(t, s, rev, err)
	})

	t.Run("a_batch_of_renewals_none_of_which_fits", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		old := value(runlease.MaxValueLen)
		create(t, s, "k", old)
		rev := revisions(t, s)
		_, err := s.MetaCASMany(t.Context(), []runlease.CASWrite{
			{Key: "small", Value: "v"},
			{Key: "k", Expected: &old, Value: strings.Repeat("w", runlease.MaxValueLen)},
		})
		refused(t, s, rev, err)
	})
}

// TestABatchOfRenewalsIsSplitIntoTxnsThatFit writes three values of 600
// KiB with one MetaCASMany: together they are over the cluster's limit,
// any two are not, and each write applies on its own.
func TestABatchOfRenewalsIsSplitIntoTxnsThatFit(t *testing.T) {
	requireCluster(t)
	s := newStore(t)
	var writes []runlease.CASWrite
	for _, k := range []string{"a", "b", "c"} {
		writes = append(writes, runlease.CASWrite{Key: k, Value: strings.Repeat(k, 600<<10)})
	}
	swapped, err := s.MetaCASMany(t.Context(), writes)
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, true}, swapped)
	for _, w := range writes {
		got, found, err := s.MetaGet(t.Context(), w.Key)
		require.NoError(t, err)
		require.True(t, found)
		assert.Equal(t, w.Value, got)
	}
}

// TestARequestTheClusterRefusesForItsSizeIsNeitherRetryableNorUnknown
// tells a store a limit above the cluster's, so that its requests reach
// the cluster, which refuses them for their size: the fault is not applied
// and not Retryable, whether etcd or its gRPC server refused it.
func TestARequestTheClusterRefusesForItsSizeIsNeitherRetryableNorUnknown(t *testing.T) {
	requireCluster(t)
	for _, c := range []struct {
		name  string
		bytes int // the batch's size
		says  string
	}{
		// Between the cluster's 1.5 MiB and its gRPC server's largest
		// message, 2 MiB: etcd refuses it (InvalidArgument).
		{"by_etcd_past_its_max_request_bytes", 1700 << 10, "request is too large"},
		// Past 2 MiB: the gRPC server refuses it (ResourceExhausted).
		{"by_its_grpc_server_past_its_largest_message", 2600 << 10, "received message larger than max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, etcdstore.WithMaxRequestBytes(16<<20))
			rev := revisions(t, s)
			var ops []runlease.Op
			for i, left := 0, c.bytes; left > 0; i++ {
				n := min(left, runlease.MaxValueLen)
				ops = append(ops, runlease.Put(strings.Repeat("k", i+1), value(n)))
				left -= n
			}
			_, err := s.MetaBatch(t.Context(), nil, ops)
			require.ErrorIs(t, err, runlease.ErrStorage)
			var se *runlease.StorageError
			require.True(t, errors.As(err, &se))
			assert.False(t, se.Unknown, "refused: not applied (%v)", err)
			assert.False(t, se.Retryable, "no retry can make it fit (%v)", err)
			assert.Contains(t, err.Error(), c.says)
			assert.Contains(t, err.Error(), "WithMaxRequestBytes")
			assert.Equal(t, rev, revisions(t, s), "nothing was written")
		})
	}
}
