package storetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// testDeleteRead checks the optional [runlease.DeleteReadNotifier]
// capability, when the store has it: the delete is MetaDeleteNotify's, the
// reads that follow it see it, and its wake-up carries the tag to
// SubscribeTags subscribers alone. A release hands the read to the waiters
// of its process, who are admitted on it: a read that does not see the
// delete, or a tag that names another wake-up, lets them sleep past a free
// slot.
func testDeleteRead(t *testing.T, newStore newStoreFunc) {
	if _, ok := newStore(t).(runlease.DeleteReadNotifier); !ok {
		return
	}
	with := withCapability[runlease.DeleteReadNotifier](newStore)
	t.Run("a_delete_that_applies_is_seen_by_the_reads_and_wakes_with_its_tag", with(testDeleteReadApplies))
	t.Run("a_delete_that_does_not_apply_changes_nothing_and_still_reads", with(testDeleteReadRefused))
	t.Run("other_wake-ups_carry_no_tag", with(testDeleteReadUntagged))
	t.Run("bad_input_is_refused_before_anything_is_written", with(testDeleteReadBadInput))
}

// awaitTag makes tagged deletes of fresh keys until sub receives the tag
// of one of them: a store may mark a subscription as waiting only a little
// after SubscribeTags returns (Postgres notifies only marked keys), and
// until then a delete wakes nobody. Wake-ups without a tag in between are
// the store's own (a mark taking effect). It returns the deletes' results.
func awaitTag(t *testing.T, s runlease.Store, d runlease.DeleteReadNotifier, sub <-chan string, wake string, ranges []runlease.Range) [][]runlease.Row {
	t.Helper()
	for attempt := range 100 {
		key := fmt.Sprintf("dr/key/%d", attempt)
		create(t, s, key, "v")
		tag := fmt.Sprintf("tag-%d", attempt)
		deleted, rows, err := d.MetaDeleteNotifyRanges(t.Context(), key, "v", wake, tag, ranges)
		require.NoError(t, err, "MetaDeleteNotifyRanges(%q)", key)
		require.True(t, deleted, "MetaDeleteNotifyRanges(%q, its own value) deletes it", key)
		requireAbsent(t, s, key)
		require.Len(t, rows, len(ranges), "one list of rows per range")
		for i, r := range ranges {
			for _, row := range rows[i] {
				require.NotEqual(t, key, row.Key, "range %d (%+v) read after the delete, yet it holds the deleted key", i, r)
			}
		}
		timeout := time.After(200 * time.Millisecond)
		for {
			select {
			case got := <-sub:
				if got == "" {
					continue
				}
				require.True(t, strings.HasPrefix(got, "tag-"), "a tag subscriber received %q, which no delete sent", got)
				if got == tag {
					return rows
				}
				continue // an earlier attempt's, late
			case <-timeout:
			}
			break
		}
	}
	t.Fatalf("no tagged delete of key %q's subscribers delivered its tag in 100 attempts", wake)
	return nil
}

func testDeleteReadApplies(t *testing.T, s runlease.Store, d runlease.DeleteReadNotifier) {
	fill(t, s, []string{"dr/a", "dr/b", "dr/c", "ds"})
	tags, cancel := d.SubscribeTags("bell/x")
	defer cancel()
	rowsSub, cancelRows := subscribeRows(s, "bell/x")
	defer cancelRows()
	bare, cancelBare := d.Subscribe("bell/x")
	defer cancelBare()
	ranges := []runlease.Range{{Prefix: "dr/"}, {Prefix: "dr/", Limit: 2}, {Prefix: "dr/", After: "dr/a", Limit: 1}, {Prefix: "none/"}}
	rows := awaitTag(t, s, d, tags, "bell/x", ranges)
	want := []runlease.Row{{Key: "dr/a", Value: "v:dr/a"}, {Key: "dr/b", Value: "v:dr/b"}, {Key: "dr/c", Value: "v:dr/c"}}
	assert.Equal(t, want, rows[0], "the whole prefix, without the deleted key")
	assert.Equal(t, want[:2], rows[1], "the first two")
	assert.Equal(t, want[1:2], rows[2], "the first after dr/a")
	assert.Empty(t, rows[3], "an empty range")
	select {
	case <-bare:
	case <-time.After(5 * time.Second):
		t.Error("a tagged delete did not wake a Subscribe subscriber of the woken key (a waiter of an earlier version)")
	}
	if rowsSub != nil {
		select {
		case got := <-rowsSub:
			assert.Empty(t, got, "a row subscriber of the woken key gets no row from a tagged delete (the tag is not a row)")
		case <-time.After(5 * time.Second):
			t.Error("a tagged delete did not wake a row subscriber of the woken key")
		}
	}
}

// subscribeRows subscribes to key's rows when the store sends rows, else
// returns nil.
func subscribeRows(s runlease.Store, key string) (<-chan string, func()) {
	if rn, ok := s.(runlease.RowNotifier); ok {
		return rn.SubscribeRows(key)
	}
	return nil, func() {}
}

func testDeleteReadRefused(t *testing.T, s runlease.Store, d runlease.DeleteReadNotifier) {
	fill(t, s, []string{"dr/a", "dr/b"})
	deleted, rows, err := d.MetaDeleteNotifyRanges(t.Context(), "dr/a", "other", "bell/y", "t", []runlease.Range{{Prefix: "dr/"}})
	require.NoError(t, err)
	assert.False(t, deleted, "a delete whose expected value does not match does not apply")
	requireValue(t, s, "dr/a", "v:dr/a")
	if rows != nil { // the reads are a hint, but when made they are right
		assert.Equal(t, []runlease.Row{{Key: "dr/a", Value: "v:dr/a"}, {Key: "dr/b", Value: "v:dr/b"}}, rows[0])
	}
	deleted, _, err = d.MetaDeleteNotifyRanges(t.Context(), "dr/none", "v", "bell/y", "t", nil)
	require.NoError(t, err)
	assert.False(t, deleted, "an absent key is not deleted")
}

func testDeleteReadUntagged(t *testing.T, s runlease.Store, d runlease.DeleteReadNotifier) {
	tags, cancel := d.SubscribeTags("bell/z")
	defer cancel()
	awaitTag(t, s, d, tags, "bell/z", nil) // the subscription is in place
	create(t, s, "dr/plain", "v")
	deleted, err := d.MetaDeleteNotify(t.Context(), "dr/plain", "v", "bell/z")
	require.NoError(t, err)
	require.True(t, deleted)
	select {
	case got := <-tags:
		assert.Empty(t, got, "MetaDeleteNotify's wake-up carries no tag")
	case <-time.After(5 * time.Second):
		t.Error("MetaDeleteNotify did not wake a SubscribeTags subscriber of its wake key")
	}
}

func testDeleteReadBadInput(t *testing.T, s runlease.Store, d runlease.DeleteReadNotifier) {
	create(t, s, "dr/k", "v")
	ok := []runlease.Range{{Prefix: "dr/"}}
	for _, c := range []struct {
		name, key, wake, tag string
		ranges               []runlease.Range
	}{
		{"an empty tag", "dr/k", "bell", "", ok},
		{"a tag over MaxTagLen", "dr/k", "bell", strings.Repeat("t", runlease.MaxTagLen+1), ok},
		{"a tag with NUL", "dr/k", "bell", "a\x00b", ok},
		{"a tag that is not UTF-8", "dr/k", "bell", "a\xffb", ok},
		{"an empty wake key", "dr/k", "", "t", ok},
		{"a negative limit", "dr/k", "bell", "t", []runlease.Range{{Prefix: "dr/", Limit: -1}}},
		{"too many ranges", "dr/k", "bell", "t", make([]runlease.Range, runlease.MaxScanMany+1)},
		{"an empty key", "", "bell", "t", ok},
	} {
		deleted, rows, err := d.MetaDeleteNotifyRanges(t.Context(), c.key, "v", c.wake, c.tag, c.ranges)
		assert.True(t, errors.Is(err, runlease.ErrInvalidArgument), "%s: got %v, want ErrInvalidArgument", c.name, err)
		assert.False(t, deleted, c.name)
		assert.Nil(t, rows, c.name)
		requireValue(t, s, "dr/k", "v")
	}
	require.NoError(t, runlease.CheckTag(strings.Repeat("t", runlease.MaxTagLen)), "a tag of MaxTagLen bytes is valid")
}
