package runlease_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/testkit"
)

// slotStores are the stores the slot rules are proved on: SQLite in a
// temporary folder always, and Postgres when RUNLEASE_TEST_POSTGRES is set
// (the subtest is skipped otherwise).
var slotStores = []struct {
	name string
	open func(t *testing.T) runlease.Store
}{
	{"sqlite", func(t *testing.T) runlease.Store { return newSQLite(t) }},
	{"postgres", func(t *testing.T) runlease.Store { return pgStore(t, pgtest.Pool(t)) }},
}

// waitResult is what a ClaimSlotsWait in the background returned.
type waitResult struct {
	slots *runlease.Slots
	err   error
}

// waitInBackground starts ClaimSlotsWait of run in scopes, with a poll of
// an hour so that only the store's wake-ups admit it.
func waitInBackground(ctx context.Context, s runlease.Store, run string, scopes []runlease.Scope, opts ...runlease.Option) <-chan waitResult {
	res := make(chan waitResult, 1)
	opts = append([]runlease.Option{runlease.WithWaitPoll(time.Hour)}, opts...)
	go func() {
		sl, err := runlease.ClaimSlotsWait(ctx, s, run, scopes, opts...)
		res <- waitResult{sl, err}
	}()
	return res
}

// awaitWaiting returns once run has an entry in a queue of the store, and
// fails t if its wait returns first.
func awaitWaiting(t *testing.T, s runlease.Store, run string, res <-chan waitResult) {
	t.Helper()
	for {
		entries, err := s.MetaScan(t.Context(), runlease.QueuePrefix)
		require.NoError(t, err)
		for _, e := range entries {
			if strings.HasSuffix(e.Key, ":"+run) && strings.Contains(e.Value, `"run":"`+run+`"`) {
				return
			}
		}
		select {
		case got := <-res:
			t.Fatalf("the wait of %s returned before it queued: %v (holding %v)", run, got.err, held(got.slots))
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(time.Millisecond):
		}
	}
}

func held(s *runlease.Slots) []runlease.SlotInfo {
	if s == nil {
		return nil
	}
	return s.Held()
}

// slotFence returns the fence of a slot row a claim wrote, its claim id:
// never 0, which the reference writes, and below 2^63.
func slotFence(t *testing.T, row string) uint64 {
	t.Helper()
	var r struct {
		Fence uint64 `json:"fence"`
	}
	require.NoError(t, json.Unmarshal([]byte(row), &r), "row %s", row)
	require.NotZero(t, r.Fence, "row %s carries no claim id", row)
	require.Less(t, r.Fence, uint64(1)<<63, "row %s", row)
	return r.Fence
}

// process is one process's Store value for a database that other
// processes reach through values of their own: it says nothing of what it
// wraps, so the lineages and the remembered leftovers of the slots claimed
// through it are its own, as those of another process are.
type process struct {
	*testkit.Faulty
	id int
}

// slotWriter is another writer of run r's slot rows: the same run driven
// from another process, of this version or of the reference.
type slotWriter struct {
	name string
	// write takes key for run r at now, for ttl, where the row is expired
	// by that clock (or is the run's own, which the reference re-uses).
	write func(t *testing.T, f *testkit.Faulty, key string, now time.Time, ttl time.Duration)
}

var slotWriters = []slotWriter{
	{"another_process", func(t *testing.T, f *testkit.Faulty, key string, now time.Time, ttl time.Duration) {
		scope, _, _ := cutSlotKey(key)
		_, err := runlease.ClaimSlots(context.Background(), process{f, 2}, "r", []runlease.Scope{runlease.NamedScope(scope, 1)},
			runlease.WithClock(func() time.Time { return now }), runlease.WithTTL(ttl))
		require.NoError(t, err)
	}},
	{"the_reference", func(t *testing.T, f *testkit.Faulty, key string, now time.Time, ttl time.Duration) {
		// Its claim: a compare-and-swap over the row it read, fence 0.
		cur, found, err := f.Store.MetaGet(context.Background(), key)
		require.NoError(t, err)
		var expected *string
		if found {
			expected = &cur
		}
		row := `{"holder":"r","fence":0,"until_ms":` + strconv.FormatInt(now.Add(ttl).UnixMilli(), 10) + `}`
		ok, err := f.Store.MetaCAS(context.Background(), key, expected, row)
		require.NoError(t, err)
		require.True(t, ok)
	}},
}

func cutSlotKey(key string) (scope string, slot int, ok bool) {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == ':' {
			n, err := strconv.Atoi(key[i+1:])
			return key[len(runlease.SlotPrefix):i], n, err == nil
		}
	}
	return "", 0, false
}
