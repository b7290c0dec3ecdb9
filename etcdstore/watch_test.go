package etcdstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/etcdstore"
)

func TestWatch(t *testing.T) {
	requireCluster(t)

	t.Run("a_subscriber_receives_each_row_another_node_writes", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		other := reopen(t, s)
		rows, cancel := s.SubscribeRows("k")
		defer cancel()
		requireRow(t, rows, "") // the watch is established
		create(t, other, "k", "one")
		requireRow(t, rows, "one")
		_, err := other.MetaDelete(t.Context(), "k", "one")
		require.NoError(t, err)
		requireRow(t, rows, "")
	})

	t.Run("a_subscriber_cut_off_while_the_history_was_compacted_is_woken_to_read_again", func(t *testing.T) {
		t.Parallel()
		fs := faultyStore(t)
		s := fs.Store.(*etcdstore.Store)
		writer := reopen(t, s)
		rows, cancel := s.SubscribeRows("k")
		defer cancel()
		requireRow(t, rows, "") // the watch is established
		create(t, writer, "k", "1")
		requireRow(t, rows, "1")

		fs.Inject(cutOff())
		for _, step := range [][2]string{{"1", "2"}, {"2", "3"}} {
			ok, err := writer.MetaCAS(t.Context(), "k", ptr(step[0]), step[1])
			require.NoError(t, err)
			require.True(t, ok)
		}
		resp, err := writer.Client().Get(t.Context(), writer.Prefix()+"k")
		require.NoError(t, err)
		// The watch's next revision is gone: resuming it fails, and the
		// store must start a new watch and wake its subscribers.
		_, err = writer.Client().Compact(t.Context(), resp.Header.Revision)
		require.NoError(t, err)
		fs.Inject(noFault())

		requireNoticed(t, s, rows, "k", "3")
		ok, err := writer.MetaCAS(t.Context(), "k", ptr("3"), "4")
		require.NoError(t, err)
		require.True(t, ok)
		requireNoticed(t, s, rows, "k", "4")
	})

	t.Run("a_closed_store_ends_its_watches", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		_, cancel := s.Subscribe("k")
		defer cancel()
		require.NoError(t, s.Close()) // goleak in TestMain checks the goroutine ended
		wake, cancel2 := s.Subscribe("k")
		defer cancel2()
		select {
		case <-wake:
			t.Fatal("a closed store woke a subscriber")
		case <-time.After(100 * time.Millisecond):
		}
	})
}

// requireNoticed waits until a subscriber of key would see want, as a
// waiter does: from the row a wake-up carries, or by reading the key when
// a wake-up carries none.
func requireNoticed(t *testing.T, s *etcdstore.Store, rows <-chan string, key, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case row := <-rows:
			if row == want {
				return
			}
			if row == "" {
				v, _, err := s.MetaGet(t.Context(), key)
				require.NoError(t, err)
				if v == want {
					return
				}
			}
		case <-deadline:
			t.Fatalf("no wake-up that shows %q", want)
		}
	}
}

// requireRow waits for rows to carry want, skipping the row-less wake-ups a
// new watch sends. A new watch wakes its subscribers once it is
// established, so requireRow(t, rows, "") right after subscribing waits
// for that.
func requireRow(t *testing.T, rows <-chan string, want string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case row := <-rows:
			if row == want {
				return
			}
			if row != "" {
				t.Fatalf("woken with row %q, want %q", row, want)
			}
		case <-deadline:
			t.Fatalf("no wake-up with row %q", want)
		}
	}
}
