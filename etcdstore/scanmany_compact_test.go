package etcdstore

// Tests of MetaScanMany starting over when the revision it reads at is
// compacted between its first Txn and a later page. A wrapper of the
// client's KV (scriptedKV) runs a step just before each page read at a
// pinned revision; the step writes a new generation of rows and compacts,
// so the compaction lands between the Txn and that page on every run, with
// no timing involved and no hook in the store.
//
// Compaction is cluster-wide: on the cluster the other tests share it
// would fail their reads at old revisions and their watches midway. So
// these tests run on a one-member cluster of their own (the shared one
// lives in package etcdstore_test, out of reach of this package anyway).

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore/internal/etcdtest"
)

// scanned are the prefixes the tests read with one MetaScanMany.
var scanned = []string{"a/", "b/", "c/"}

// generation returns the rows of generation g under each of scanned, in
// key order; every value names g. a/ gains a row each generation and b/
// loses one, so keys as well as values tell generations apart; c/ keeps
// two rows, one page of 2, read by the Txn alone. With pages of 2, a/ and
// b/ need later pages for every g below 8.
func generation(g int) [][]runlease.Row {
	counts := []int{4 + g, 10 - g, 2}
	out := make([][]runlease.Row, len(scanned))
	for i, p := range scanned {
		for k := range counts[i] {
			out[i] = append(out[i], runlease.Row{Key: fmt.Sprintf("%s%02d", p, k), Value: fmt.Sprintf("g%d", g)})
		}
	}
	return out
}

// writeGeneration turns the rows of generation g-1 into those of g in one
// Txn, so every revision holds exactly one generation; it also writes a row
// outside the scanned prefixes, which no scan may return.
func writeGeneration(t *testing.T, raw *clientv3.Client, prefix string, g int) {
	t.Helper()
	var ops []clientv3.Op
	keep := map[string]bool{}
	for _, rows := range generation(g) {
		for _, r := range rows {
			keep[r.Key] = true
			ops = append(ops, clientv3.OpPut(prefix+r.Key, r.Value))
		}
	}
	if g > 1 {
		for _, rows := range generation(g - 1) {
			for _, r := range rows {
				if !keep[r.Key] {
					ops = append(ops, clientv3.OpDelete(prefix+r.Key))
				}
			}
		}
	}
	ops = append(ops, clientv3.OpPut(prefix+"d/00", fmt.Sprintf("g%d", g)))
	_, err := raw.Txn(t.Context()).Then(ops...).Commit()
	require.NoError(t, err)
}

// compactNow compacts the cluster's history up to its current revision and
// returns that revision: every read at an older one fails from then on.
func compactNow(t *testing.T, raw *clientv3.Client) int64 {
	t.Helper()
	resp, err := raw.Get(t.Context(), "\x00", clientv3.WithCountOnly())
	require.NoError(t, err)
	_, err = raw.Compact(t.Context(), resp.Header.Revision, clientv3.WithCompactPhysical())
	require.NoError(t, err)
	return resp.Header.Revision
}

// read is one request the store made through a scriptedKV.
type read struct {
	txn       bool  // a Txn of first pages, or a Get at a pinned revision
	rev       int64 // the Txn's revision, or the one the Get asked for
	compacted bool  // the Get failed because rev was compacted
}

// scriptedKV is the client's KV with a step run before every Get at a
// pinned revision (a later page of a scan), and a log of the Txns and
// pinned Gets the store made. It serves one scan at a time, called from
// the test's goroutine, so it needs no lock, and its step may use require.
type scriptedKV struct {
	clientv3.KV
	log    []read
	pinned int                    // pinned Gets so far
	before func(n int, rev int64) // the step, given the Get's number and revision
}

func (kv *scriptedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	rev := clientv3.OpGet(key, opts...).Rev()
	if rev == 0 {
		return kv.KV.Get(ctx, key, opts...)
	}
	if kv.before != nil {
		kv.before(kv.pinned, rev)
	}
	kv.pinned++
	resp, err := kv.KV.Get(ctx, key, opts...)
	kv.log = append(kv.log, read{rev: rev, compacted: isCompacted(err)})
	return resp, err
}

func (kv *scriptedKV) Txn(ctx context.Context) clientv3.Txn {
	return &loggedTxn{Txn: kv.KV.Txn(ctx), kv: kv}
}

// loggedTxn logs the revision of a Txn that commits.
type loggedTxn struct {
	clientv3.Txn
	kv *scriptedKV
}

func (t *loggedTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *loggedTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *loggedTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *loggedTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil {
		t.kv.log = append(t.kv.log, read{txn: true, rev: resp.Header.Revision})
	}
	return resp, err
}

// scriptedPrefixes numbers the scripted stores' prefixes, so that each is
// fresh under -count=N too, on a cluster that keeps the rows of runs before.
var scriptedPrefixes atomic.Int64

// scriptedStore returns a store on a fresh prefix of c that reads through a
// scriptedKV, with pages of 2 rows and generation 1 written, and a plain
// client of c for the test's own writes.
func scriptedStore(t *testing.T, c *etcdtest.Cluster) (*Store, *scriptedKV, *clientv3.Client) {
	t.Helper()
	client, err := c.Client()
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	raw, err := c.Client()
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	kv := &scriptedKV{KV: client.KV}
	client.KV = kv // before New, so every read of the store goes through kv
	s, err := New(client, WithPrefix(fmt.Sprintf("test/%s/%d/", t.Name(), scriptedPrefixes.Add(1))), WithScanPage(2))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	writeGeneration(t, raw, s.Prefix(), 1)
	return s, kv, raw
}

// ownCluster starts a one-member cluster for t alone, stopped at cleanup.
// It skips t when none can start, unless CI=true, as TestMain does.
func ownCluster(t *testing.T) *etcdtest.Cluster {
	t.Helper()
	c, err := etcdtest.StartWith(t.TempDir(), etcdtest.Options{Members: 1})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true requires a real etcd cluster, and none could be started: %v", err)
		}
		t.Skipf("no etcd cluster (set CI=true to make this a failure): %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

func TestMetaScanManyCompaction(t *testing.T) {
	t.Parallel() // the cluster is this test's own
	c := ownCluster(t)
	// The subtests share c, and one's compaction would fail another's
	// pinned reads at unplanned moments: they run one after another.
	for _, tc := range []struct {
		name string
		at   int // the pinned Get of the first try before which to compact
	}{
		// Generation 1 has 5 rows under a/ and 9 under b/: after the Txn's
		// first pages, a/ takes pinned Gets 0 and 1, b/ takes 2 to 5.
		{"before_the_first_later_page", 0},
		{"after_one_prefix_is_complete", 2},
		{"before_the_last_later_page", 5},
	} {
		t.Run("a_revision_compacted_"+tc.name+"_restarts_the_scan_at_one_newer_snapshot", func(t *testing.T) {
			compactOnce(t, c, tc.at)
		})
	}
	t.Run("a_revision_compacted_on_every_try_fails_after_the_last_restart", func(t *testing.T) {
		compactAlways(t, c)
	})
}

// compactOnce compacts the revision of the first try before its pinned Get
// number at, around writes of generations 2 and 3; the second try writes
// generation 4 before its first later page. That try must return generation
// 3 whole: not 1 (compacted), not 4 (written after its Txn), and no mix.
func compactOnce(t *testing.T, c *etcdtest.Cluster, at int) {
	s, kv, raw := scriptedStore(t, c)
	var compactedAt, firstRev int64
	wroteLate := false
	kv.before = func(n int, rev int64) {
		switch {
		case n == at && compactedAt == 0:
			firstRev = rev
			writeGeneration(t, raw, s.Prefix(), 2)
			compactedAt = compactNow(t, raw)
			writeGeneration(t, raw, s.Prefix(), 3) // after the compaction, before the restart
		case compactedAt != 0 && rev != firstRev && !wroteLate:
			wroteLate = true
			writeGeneration(t, raw, s.Prefix(), 4) // during the restarted scan
		}
	}
	got, err := s.MetaScanMany(t.Context(), scanned)
	kv.before = nil
	require.NoError(t, err)
	require.NotZero(t, compactedAt, "the scan made no pinned Get number %d", at)
	require.True(t, wroteLate, "the restarted scan made no pinned Get")
	assert.Equal(t, generation(3), got, "one snapshot, taken after the compaction")

	txns, compacted := requireTries(t, kv.log)
	require.Equal(t, []bool{true, false}, compacted, "one try compacted, then one restart: %+v", kv.log)
	assert.Equal(t, firstRev, txns[0].rev, "the first try read on at its Txn's revision")
	assert.Greater(t, txns[0].rev, int64(0))
	assert.Less(t, txns[0].rev, compactedAt)
	assert.Greater(t, txns[1].rev, compactedAt, "the restart read after generation 3 was written")

	got, err = s.MetaScanMany(t.Context(), scanned)
	require.NoError(t, err)
	assert.Equal(t, generation(4), got, "a later scan sees the write made during the restart")
}

// compactAlways writes a new generation and compacts before the first
// later page of every try: MetaScanMany gives up after maxScanRestarts
// restarts with a fault matching etcd's error, and a scan left alone then
// reads the last generation.
func compactAlways(t *testing.T, c *etcdtest.Cluster) {
	s, kv, raw := scriptedStore(t, c)
	g, lastRev := 1, int64(0)
	kv.before = func(_ int, rev int64) {
		if rev != lastRev { // the first later page of a try
			lastRev = rev
			g++
			writeGeneration(t, raw, s.Prefix(), g)
			compactNow(t, raw)
		}
	}
	_, err := s.MetaScanMany(t.Context(), scanned)
	kv.before = nil
	var se *runlease.StorageError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "MetaScanMany", se.Op)
	assert.False(t, se.Unknown, "a read changes nothing")
	assert.ErrorIs(t, err, rpctypes.ErrCompacted)
	_, compacted := requireTries(t, kv.log)
	require.Len(t, compacted, maxScanRestarts+1, "the first try and every restart: %+v", kv.log)
	assert.NotContains(t, compacted, false, "every try was compacted")

	got, err := s.MetaScanMany(t.Context(), scanned)
	require.NoError(t, err)
	assert.Equal(t, generation(g), got)
}

// requireTries splits log into the scan's tries, each a Txn and then Gets
// at its revision, of which only the last may have been compacted. It
// returns each try's Txn and whether the try ended in a compacted Get.
func requireTries(t *testing.T, log []read) (txns []read, compacted []bool) {
	t.Helper()
	for _, r := range log {
		if r.txn {
			txns, compacted = append(txns, r), append(compacted, false)
			continue
		}
		require.NotEmpty(t, txns, "a pinned Get before any Txn: %+v", log)
		try := len(txns) - 1
		require.Equal(t, txns[try].rev, r.rev, "a Get of try %d is not at its Txn's revision: %+v", try, log)
		require.False(t, compacted[try], "try %d read on after a compacted Get: %+v", try, log)
		compacted[try] = r.compacted
	}
	return txns, compacted
}
