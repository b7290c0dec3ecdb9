package etcdstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
)

// quiet is how long a subscriber is watched for a wake-up that must not
// come. A wake-up that comes later is not caught: the check can miss a
// wrong ring, never fail a right one.
const quiet = 300 * time.Millisecond

// patience bounds the wait for a wake-up that must come: far longer than
// it takes, so that a slow machine does not fail the test.
const patience = 30 * time.Second

// The bells of MetaDeleteNotify (bell.go): a delete that lands wakes the
// subscribers of its wake key on every node, and no read ever returns a
// bell.
func TestBells(t *testing.T) {
	requireCluster(t)

	t.Run("a_delete_that_lands_wakes_the_wake_keys_subscribers_on_another_node_and_a_refused_one_does_not", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		other := reopen(t, s)
		wake, cancel := other.Subscribe("bell/")
		defer cancel()
		requireWake(t, wake, "the new watch")
		create(t, s, "k", "v")

		ok, err := s.MetaDeleteNotify(t.Context(), "k", "other", "bell/")
		require.NoError(t, err)
		assert.False(t, ok, "the value differs: nothing is deleted")
		ok, err = s.MetaDeleteNotify(t.Context(), "absent", "v", "bell/")
		require.NoError(t, err)
		assert.False(t, ok, "an absent key is not deleted")
		v, found, err := other.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, "v", v)
		requireQuiet(t, wake, "a refused delete rang the bell")
		assert.Zero(t, rawCount(t, s, "bell/"), "a refused delete writes no bell")

		ok, err = s.MetaDeleteNotify(t.Context(), "k", "v", "bell/")
		require.NoError(t, err)
		require.True(t, ok)
		requireWake(t, wake, "the delete")
		_, found, err = other.MetaGet(t.Context(), "k")
		require.NoError(t, err)
		assert.False(t, found, "the woken subscriber reads the store without the row")
		assert.Equal(t, int64(1), rawCount(t, s, "bell/"), "the bell is a key of its own")
	})

	t.Run("invalid_arguments_and_a_closed_store_are_refused_before_sending", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, c := range []struct {
			name                   string
			key, expected, wakeKey string
		}{
			{"an_empty_wake_key", "k", "v", ""},
			{"a_wake_key_with_NUL", "k", "v", "b\x00"},
			{"a_key_with_NUL", "k\x00", "v", "b"},
			{"an_expected_value_with_NUL", "k", "v\x00", "b"},
		} {
			_, err := s.MetaDeleteNotify(t.Context(), c.key, c.expected, c.wakeKey)
			assert.ErrorIs(t, err, runlease.ErrInvalidArgument, c.name)
		}
		require.NoError(t, s.Close())
		_, err := s.MetaDeleteNotify(t.Context(), "k", "v", "b")
		require.ErrorIs(t, err, runlease.ErrStoreClosed)
	})

	t.Run("no_read_returns_a_bell_whatever_the_page_size", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		const queue = "runqueue:3:gpu:" // a scope's queue prefix, its waiters' wake key
		rows := []runlease.Row{
			{Key: queue + "a", Value: "entry a"},
			{Key: queue + "b", Value: "entry b"},
			{Key: "runslot:3:gpu:0", Value: "slot"},
		}
		for _, r := range rows {
			create(t, s, r.Key, r.Value)
		}
		// Bells before the rows of a prefix, two in a row, between two
		// rows, and alone at the end of every key.
		bells := []string{"runqueue:3:gpu", queue, queue + "a", "zz"}
		for _, b := range bells {
			ring(t, s, b)
		}
		require.Equal(t, int64(len(rows)+len(bells)), rawCount(t, s, ""), "the bells are in etcd")

		want := map[string][]runlease.Row{
			"":               {rows[0], rows[1], rows[2]},
			"runqueue:3:gpu": {rows[0], rows[1]},
			queue:            {rows[0], rows[1]},
			queue + "a":      {rows[0]},
			"zz":             nil,
		}
		prefixes := []string{"", "runqueue:3:gpu", queue, queue + "a", "zz"}
		for _, page := range []int{1, 2, 3, etcdstore.DefaultScanPage} {
			// A page of 1 or 2 keys is, somewhere, a page of bells alone.
			ps := storeOn(t, newClient(t), etcdstore.WithPrefix(s.Prefix()), etcdstore.WithScanPage(page))
			many, err := ps.MetaScanMany(t.Context(), prefixes)
			require.NoError(t, err)
			for i, p := range prefixes {
				got, err := ps.MetaScan(t.Context(), p)
				require.NoError(t, err)
				assert.Equal(t, want[p], got, "MetaScan(%q), pages of %d", p, page)
				assert.Equal(t, want[p], many[i], "MetaScanMany, prefix %q, pages of %d", p, page)
			}
		}
		_, found, err := s.MetaGet(t.Context(), queue)
		require.NoError(t, err)
		assert.False(t, found, "a wake key is not a row")
	})

	t.Run("a_row_subscriber_is_told_to_read_when_its_keys_bell_rings_never_handed_the_bell", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		rows, cancel := s.SubscribeRows("k")
		defer cancel()
		requireRow(t, rows, "") // the watch is established
		create(t, s, "k", "row")
		requireRow(t, rows, "row")

		ring(t, s, "k")
		requireNext(t, rows, "", "the ring of k's bell")
		// Whatever a bell holds, the watch tells it from the row by its
		// key: a bell with a value that could pass for a row.
		_, err := s.Client().Put(t.Context(), s.Prefix()+"k\x00", "not a row")
		require.NoError(t, err)
		requireNext(t, rows, "", "a put of k's bell")
		ok, err := s.MetaCAS(t.Context(), "k", ptr("row"), "row 2")
		require.NoError(t, err)
		require.True(t, ok, "the bell left the row alone")
		requireRow(t, rows, "row 2")
	})

	t.Run("a_waiting_run_is_admitted_by_the_release_on_another_node_not_by_polling", func(t *testing.T) {
		t.Parallel()
		a := newStore(t)
		b := reopen(t, a)
		gpu := []runlease.Scope{runlease.NamedScope("gpu", 1)}
		holder, err := runlease.ClaimSlots(t.Context(), a, "h", gpu)
		require.NoError(t, err)
		// The poll is an hour and the TTL (DefaultTTL) far longer than
		// the deadline, so neither a poll, an expiry nor a renewal of the
		// waiter's entry wakes it in time: only the release's bell can.
		ctx, cancel := context.WithTimeout(t.Context(), patience)
		defer cancel()
		type result struct {
			slots *runlease.Slots
			err   error
		}
		done := make(chan result, 1)
		go func() {
			sl, err := runlease.ClaimSlotsWait(ctx, b, "w", gpu, runlease.WithWaitPoll(time.Hour))
			done <- result{sl, err}
		}()
		// Released once the waiter has queued, and so is asleep or about
		// to be: released sooner, its first read would admit it.
		require.Eventually(t, func() bool {
			q, err := a.MetaScan(t.Context(), runlease.QueuePrefix)
			return err == nil && len(q) == 1
		}, patience, 10*time.Millisecond, "the waiter queues")
		select {
		case r := <-done:
			t.Fatalf("the waiter returned while the slot was held: %v", r.err)
		case <-time.After(quiet):
		}
		require.NoError(t, holder.Release(t.Context()))
		r := <-done
		require.NoError(t, r.err, "the waiter was not woken before its deadline")
		q, err := a.MetaScan(t.Context(), runlease.QueuePrefix)
		require.NoError(t, err)
		assert.Empty(t, q, "the admitted run left the queue")
		require.NoError(t, r.slots.Release(t.Context()))
	})
}

// ring rings key's bell: a row made only to be deleted with
// MetaDeleteNotify.
func ring(t *testing.T, s *etcdstore.Store, key string) {
	t.Helper()
	const tmp = "bell-rope"
	create(t, s, tmp, "v")
	ok, err := s.MetaDeleteNotify(t.Context(), tmp, "v", key)
	require.NoError(t, err)
	require.True(t, ok)
}

// rawCount counts the etcd keys, rows and bells, under s's prefix and
// then prefix.
func rawCount(t *testing.T, s *etcdstore.Store, prefix string) int64 {
	t.Helper()
	resp, err := s.Client().Get(t.Context(), s.Prefix()+prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return resp.Count
}

func requireWake(t *testing.T, wake <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(patience):
		t.Fatalf("not woken by %s", what)
	}
}

func requireQuiet(t *testing.T, wake <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-wake:
		t.Fatal(msg)
	case <-time.After(quiet):
	}
}

// requireNext requires the next wake-up of rows to carry want.
func requireNext(t *testing.T, rows <-chan string, want, what string) {
	t.Helper()
	select {
	case row := <-rows:
		require.Equal(t, want, row, "woken by %s", what)
	case <-time.After(patience):
		t.Fatalf("not woken by %s", what)
	}
}
