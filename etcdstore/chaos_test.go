//go:build linux

package etcdstore_test

// Lease safety under pauses and kills, on etcd: the lease chaos test of the
// root package (chaos_lease_test.go; internal/chaos documents each check
// and why it is sound), with three child processes that each open their own
// etcdstore.Store on the shared test cluster, under a prefix of this test.
// Eight drivers per process compete for four runs with the shortest TTL,
// keep their leases with a Keeper and advance each run in supersteps that
// write downstream and then checkpoint through lease.Write. The downstream
// is fenced on etcd itself: a key per run, under a prefix of its own,
// holding the fence and seq of the last superstep, written by a Txn that
// puts only if the stored fence is at most the writer's (ecSink). The
// parent freezes children (SIGSTOP, then SIGCONT) and kills them (SIGKILL,
// then a replacement) at random; the etcd members are never touched.
//
// Linux only, with the shared cluster (skipped without one, mandatory with
// CI=true):
//
//	CI=true go test -race -run TestChaos -count=1 -v .             # CI size: 25 s of faults
//	CI=true go test -race -tags chaos -run TestChaos -count=1 -v . # full size: 60 s
//	RUNLEASE_CHAOS_FOR=2m CI=true go test -race -run TestChaos -count=1 -v .
//
// Each check is shown to fail on etcd by a deliberately broken holder,
// chosen with RUNLEASE_CHAOS_BREAK: ignore-keeper (the trust check must
// catch it), ckpt-unfenced (the checkpoint check) and downstream-unfenced
// (the downstream check: the children's sink then puts without its Txn
// condition). With one set, the test passes only if its check reports
// violations:
//
//	RUNLEASE_CHAOS_BREAK=downstream-unfenced CI=true go test -race -run TestChaos -count=1 -v .

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/internal/chaos"
	"github.com/areev/runlease/internal/proctest"
)

// The children are this test binary run again in a role (internal/proctest).
// A child must not run TestMain, which starts an etcd cluster of its own:
// so the role runs from init, which Go calls once every package-level
// variable (the role registrations) is set and before TestMain. In an
// ordinary test run there is no role and init returns at once.
func init() {
	if code, ok := proctest.RunRole(); ok {
		os.Exit(code)
	}
}

// ecEnvEndpoints passes the cluster's client URLs to a child, comma-separated.
const ecEnvEndpoints = "RUNLEASE_CHAOS_ETCD_ENDPOINTS"

// ecLease is the shape of the test, the same as on Postgres. The bound is
// counted from the fault: the lease expires at most a TTL after the last
// renewal before the fault, plus a renewal interval for a renewal that was
// late, plus a second of slack for a loaded machine.
var ecLease = chaos.LeaseTest{Procs: 3, Drivers: 8, Runs: 4, TTL: runlease.MinTTL,
	Bound: runlease.MinTTL + runlease.MinTTL/3 + time.Second}

var roleChaosLease = proctest.Register("etcd-chaos-lease-driver", func() int { return chaos.RunChild(ecOpen, ecLease.Child) })

// ecOpen opens a child's store on the prefix env.Table and its sink on the
// prefix env.Down, through one client of every member. The sink is the
// unfenced one when RUNLEASE_CHAOS_BREAK is downstream-unfenced.
func ecOpen(ctx context.Context, env chaos.Env) (chaos.Backend, error) {
	eps := os.Getenv(ecEnvEndpoints)
	if eps == "" {
		return chaos.Backend{}, errors.New(ecEnvEndpoints + " is not set")
	}
	store, err := etcdstore.Open(ctx, strings.Split(eps, ","), etcdstore.WithPrefix(env.Table))
	if err != nil {
		return chaos.Backend{}, err
	}
	sink := &ecSink{kv: store.Client(), prefix: env.Down, fenced: chaos.BreakMode() != chaos.BreakDownUnfenced}
	return chaos.Backend{Store: store, Down: sink, Close: func() { store.Close() }}, nil
}

// ecSink is the downstream of the etcd test: the key prefix+run holds
// ecDownValue(fence, seq). The fence is written zero-padded to a fixed
// width, so etcd's byte-wise comparison of values orders them by fence:
// the stored fence is at most f exactly when the stored value sorts below
// the padded f+1. A fenced Put is one Txn that puts only under that
// comparison, so a write whose fence is below the stored one is refused
// atomically, however late it arrives.
type ecSink struct {
	kv     clientv3.KV
	prefix string
	fenced bool // false: BreakDownUnfenced, a plain Put
}

func ecDownValue(fence uint64, seq int) string { return fmt.Sprintf("%020d:%06d", fence, seq) }

func (s *ecSink) Put(ctx context.Context, run string, fence uint64, seq int) (bool, error) {
	key, value := s.prefix+run, ecDownValue(fence, seq)
	if !s.fenced {
		_, err := s.kv.Put(ctx, key, value)
		return err == nil, err
	}
	resp, err := s.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(key), "<", fmt.Sprintf("%020d", fence+1))).
		Then(clientv3.OpPut(key, value)).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// ecReadDown returns the sink's final (fence, seq) of every run under
// prefix, read in one linearizable range read.
func ecReadDown(ctx context.Context, kv clientv3.KV, prefix string) (map[string]chaos.FenceSeq, error) {
	resp, err := kv.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[string]chaos.FenceSeq{}
	for _, item := range resp.Kvs {
		fs, err := chaos.ParseCkptValue(string(item.Value)) // the same fence:seq form, zero-padded
		if err != nil {
			return nil, fmt.Errorf("downstream key %s: %w", item.Key, err)
		}
		out[strings.TrimPrefix(string(item.Key), prefix)] = fs
	}
	return out, nil
}

func TestChaosLeaseSafeUnderPausesAndKills(t *testing.T) {
	t.Parallel()
	c := requireCluster(t)
	ecLease.Run(t, func(t *testing.T) chaos.LeaseBackend {
		store := newStore(t)
		// A prefix beside the store's, not inside it: nothing runlease
		// scans can see the sink's keys.
		down := strings.TrimSuffix(store.Prefix(), "/") + "-downstream/"
		kv := store.Client()
		for i := range ecLease.Runs {
			// The value comparison of the fenced Put needs a key to compare.
			_, err := kv.Put(t.Context(), down+chaos.RunName(i), ecDownValue(0, 0))
			require.NoError(t, err)
		}
		return chaos.LeaseBackend{
			Role: roleChaosLease,
			Env: chaos.Env{Table: store.Prefix(), Down: down,
				Extra: []string{ecEnvEndpoints + "=" + strings.Join(c.Endpoints(), ",")}},
			Store:    store,
			ReadDown: func(ctx context.Context) (map[string]chaos.FenceSeq, error) { return ecReadDown(ctx, kv, down) },
		}
	})
}

// TestChaosSinkRefusesALowerFence pins the sink's fence condition, on which
// the downstream check of the chaos test rests: equal and higher fences are
// applied, a lower one is refused, and the unfenced sink applies anything.
func TestChaosSinkRefusesALowerFence(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	down := strings.TrimSuffix(store.Prefix(), "/") + "-downstream/"
	kv := store.Client()
	_, err := kv.Put(t.Context(), down+"r", ecDownValue(0, 0))
	require.NoError(t, err)
	fenced, unfenced := &ecSink{kv: kv, prefix: down, fenced: true}, &ecSink{kv: kv, prefix: down}
	steps := []struct {
		sink    *ecSink
		fence   uint64
		seq     int
		applied bool
	}{
		{fenced, 9, 1, true},
		{fenced, 9, 2, true},   // the same fence, a later step
		{fenced, 10, 1, true},  // a higher fence: 10 sorts above 9 only zero-padded
		{fenced, 9, 3, false},  // a stale holder
		{fenced, 1, 1, false},  // a very stale one
		{unfenced, 2, 7, true}, // the broken sink lets it through
	}
	for _, s := range steps {
		applied, err := s.sink.Put(t.Context(), "r", s.fence, s.seq)
		require.NoError(t, err)
		require.Equal(t, s.applied, applied, "put fence %d seq %d (fenced %v)", s.fence, s.seq, s.sink.fenced)
	}
	final, err := ecReadDown(t.Context(), kv, down)
	require.NoError(t, err)
	require.Equal(t, map[string]chaos.FenceSeq{"r": {Fence: 2, Seq: 7}}, final)
}
