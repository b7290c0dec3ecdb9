package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/storetest"
)

func ptr(s string) *string { return &s }

func TestOptions(t *testing.T) {
	requireCluster(t)
	client := newClient(t)
	for _, c := range []struct {
		name string
		opt  etcdstore.Option
	}{
		{"a_prefix_with_NUL", etcdstore.WithPrefix("a\x00")},
		{"a_prefix_of_invalid_UTF-8", etcdstore.WithPrefix("\xff")},
		{"a_txn_limit_below_the_minimum", etcdstore.WithMaxTxnOps(etcdstore.MinMaxTxnOps - 1)},
		{"a_request_size_limit_below_the_minimum", etcdstore.WithMaxRequestBytes(etcdstore.MinMaxRequestBytes - 1)},
		{"an_empty_scan_page", etcdstore.WithScanPage(0)},
	} {
		t.Run(c.name+"_is_refused", func(t *testing.T) {
			_, err := etcdstore.New(client, c.opt)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			_, err = etcdstore.Open(t.Context(), requireCluster(t).Endpoints(), c.opt)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
		})
	}
	t.Run("a_nil_client_is_refused", func(t *testing.T) {
		_, err := etcdstore.New(nil)
		require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	})
}

func TestStore(t *testing.T) {
	requireCluster(t)

	t.Run("rows_live_under_the_prefix_byte_for_byte_and_other_prefixes_do_not_see_them", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		other := newStore(t)
		const v = "{\"holder\": \"é\\u00e9\"}\t "
		create(t, s, "k", v)
		raw, err := s.Client().Get(t.Context(), s.Prefix()+"k")
		require.NoError(t, err)
		require.Len(t, raw.Kvs, 1)
		assert.Equal(t, v, string(raw.Kvs[0].Value), "the value is stored as written")
		_, found, err := other.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.False(t, found, "a store under another prefix does not see the row")
		rows, err := other.MetaScan(t.Context(), "")
		require.NoError(t, err)
		assert.Empty(t, rows)
		rows, err = s.MetaScan(t.Context(), "")
		require.NoError(t, err)
		assert.Equal(t, []runlease.Row{{Key: "k", Value: v}}, rows, "keys come back without the prefix")
	})

	t.Run("a_scan_read_in_small_pages_returns_every_row_in_order", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, etcdstore.WithScanPage(3))
		var want []runlease.Row
		for i := range 10 {
			k := fmt.Sprintf("p/%02d", i)
			create(t, s, k, "v")
			want = append(want, runlease.Row{Key: k, Value: "v"})
		}
		create(t, s, "q", "v")
		rows, err := s.MetaScan(t.Context(), "p/")
		require.NoError(t, err)
		assert.Equal(t, want, rows)
	})

	t.Run("a_batch_at_the_txn_limit_applies_and_one_over_it_is_refused_before_sending", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ops := func(n int) []runlease.Op {
			out := make([]runlease.Op, n)
			for i := range out {
				out[i] = runlease.Put(fmt.Sprintf("b/%03d", i), "v")
			}
			return out
		}
		ok, err := s.MetaBatch(t.Context(), nil, ops(etcdstore.DefaultMaxTxnOps))
		require.NoError(t, err)
		assert.True(t, ok)
		_, err = s.MetaBatch(t.Context(), nil, ops(etcdstore.DefaultMaxTxnOps+1))
		require.ErrorIs(t, err, runlease.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "WithMaxTxnOps")
		conds := make([]runlease.Cond, etcdstore.DefaultMaxTxnOps+1)
		for i := range conds {
			conds[i] = runlease.IfAbsent(fmt.Sprintf("c/%03d", i))
		}
		_, err = s.MetaBatch(t.Context(), conds, ops(1))
		require.ErrorIs(t, err, runlease.ErrInvalidArgument)
	})

	t.Run("a_txn_the_cluster_refuses_is_a_fault_that_changed_nothing", func(t *testing.T) {
		t.Parallel()
		// The store believes the cluster takes more than it does.
		s := newStore(t, etcdstore.WithMaxTxnOps(etcdstore.DefaultMaxTxnOps*2))
		ops := make([]runlease.Op, etcdstore.DefaultMaxTxnOps+1)
		for i := range ops {
			ops[i] = runlease.Put(fmt.Sprintf("b/%03d", i), "v")
		}
		_, err := s.MetaBatch(t.Context(), nil, ops)
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.False(t, se.Unknown, "etcd refused the Txn before proposing it: %v", err)
		rows, err := s.MetaScan(t.Context(), "")
		require.NoError(t, err)
		assert.Empty(t, rows)
	})

	t.Run("writes_split_across_txns_each_keep_their_own_outcome", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, etcdstore.WithMaxTxnOps(3)) // two writes per Txn
		var writes []runlease.CASWrite
		var want []bool
		for i := range 7 {
			k := fmt.Sprintf("w/%d", i)
			create(t, s, k, "old")
			expected := "old"
			if i%3 == 1 {
				expected = "stale"
			}
			writes = append(writes, runlease.CASWrite{Key: k, Expected: ptr(expected), Value: "new"})
			want = append(want, i%3 != 1)
		}
		writes = append(writes, runlease.CASWrite{Key: "w/new", Value: "new"})
		want = append(want, true)
		got, err := s.MetaCASMany(t.Context(), writes)
		require.NoError(t, err)
		assert.Equal(t, want, got)
		for i, w := range writes {
			v, _, err := s.MetaGet(t.Context(), w.Key)
			require.NoError(t, err)
			assert.Equal(t, want[i], v == "new", w.Key)
		}
	})

	t.Run("a_closed_store_refuses_calls_and_leaves_the_callers_client_open", func(t *testing.T) {
		t.Parallel()
		client := newClient(t)
		s, err := etcdstore.New(client, etcdstore.WithPrefix(fmt.Sprintf("test/%d/", prefixes.Add(1))))
		require.NoError(t, err)
		require.NoError(t, s.Close())
		require.NoError(t, s.Close(), "Close is idempotent")
		_, _, err = s.MetaGet(t.Context(), "k")
		require.ErrorIs(t, err, runlease.ErrStoreClosed)
		_, err = s.MetaCAS(t.Context(), "k", nil, "v")
		require.ErrorIs(t, err, runlease.ErrStoreClosed)
		_, err = client.Get(t.Context(), "k")
		require.NoError(t, err, "the store never closes a client it was given")
	})

	t.Run("a_store_that_Open_made_closes_its_client", func(t *testing.T) {
		t.Parallel()
		s, err := etcdstore.Open(t.Context(), requireCluster(t).Endpoints(),
			etcdstore.WithPrefix(fmt.Sprintf("test/%d/", prefixes.Add(1))),
			etcdstore.WithConfig(func(c *clientv3.Config) { c.Logger = zap.NewNop() }))
		require.NoError(t, err)
		create(t, s, "k", "v")
		require.NoError(t, s.Close())
		assert.Error(t, s.Client().Ctx().Err(), "the client is closed")
	})

	t.Run("Open_fails_without_a_reachable_member_not_applied_and_matching_the_context", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		_, err := etcdstore.Open(ctx, []string{"127.0.0.1:1"},
			etcdstore.WithConfig(func(c *clientv3.Config) { c.Logger = zap.NewNop() }))
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.False(t, se.Unknown)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	})

	t.Run("a_write_that_waits_for_an_unreachable_cluster_is_not_applied_and_matches_its_context", func(t *testing.T) {
		t.Parallel()
		fs := faultyStore(t)
		s := fs.Store.(*etcdstore.Store)
		create(t, s, "k", "v")
		fs.Inject(cutOff())
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, err := s.MetaCAS(ctx, "k", ptr("v"), "w")
		fs.Inject(noFault())
		var se *runlease.StorageError
		require.ErrorAs(t, err, &se)
		assert.False(t, se.Unknown, "nothing was sent: %v", err)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.False(t, errors.Is(err, runlease.ErrInvalidArgument))
		v, _, err := s.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, "v", v)
	})
}

// create writes a new row, failing t unless it did.
func create(t *testing.T, s runlease.Store, key, value string) {
	t.Helper()
	ok, err := s.MetaCAS(t.Context(), key, nil, value)
	require.NoError(t, err)
	require.True(t, ok, "MetaCAS creating %q", key)
}

func cutOff() storetest.Fault  { return storetest.Fault{Kind: storetest.FaultBeforeApply} }
func noFault() storetest.Fault { return storetest.Fault{} }
