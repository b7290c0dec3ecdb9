package etcdstore_test

// Linearizability of the etcd store through member crashes and a cut-off
// member, checked with porcupine (runlease's internal/linearize, the checker
// the SQLite and Postgres stores pass): goroutines make random gets,
// conditional writes, deletes and batches over a few keys while the test
// kills the cluster's leader and then a follower (SIGKILL) and restarts
// each, or cuts every connection to one member through a proxy. The
// checker must find an order of the calls that respects real time and the
// model of a map of compare-and-swap registers; a call whose outcome the
// store reports as unknown may land at any instant after it was made, and
// one it reports as not applied must not have landed. That the checker
// rejects broken stores is shown in the core module's
// linearizability_test.go.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/etcdstore/internal/etcdtest"
	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/linearize"
)

const (
	// linCheckTimeout bounds porcupine's search, far above what a correct
	// history of this size needs: running out counts as a failure.
	linCheckTimeout = 2 * time.Minute
	// linCallTimeout bounds each call, so that a call to a dead member ends
	// (with an unknown outcome) instead of holding its goroutine.
	linCallTimeout = 2 * time.Second
	// linGoroutines make calls through each client.
	linGoroutines = 3
	// linPause is the longest pause between a goroutine's calls, which keeps
	// the history within what the checker searches quickly when batches
	// make it check every key together: about 7,000 calls a run, where a
	// 4 ms pause gave 14,000, whose check ran past linCheckTimeout on a
	// machine busy with other jobs (a verdict of Unknown, not a violation).
	linPause = 24 * time.Millisecond
)

// TestLinearizable runs the workload through faults of the cluster. It is
// not parallel: no other test may run while a member is down.
func TestLinearizable(t *testing.T) {
	c := requireCluster(t)
	if testing.Short() {
		t.Skip("kills and restarts etcd members")
	}
	t.Run("the_leader_and_then_a_follower_killed_and_restarted", func(t *testing.T) {
		for attempt := 1; !linOneRun(t, c, attempt); attempt++ {
		}
	})

	t.Run("the_clients_member_cut_off", func(t *testing.T) {
		for attempt := 1; ; attempt++ {
			// Every client reaches member 0 only through the proxy, and the
			// other two directly: cut off, member 0 fails every call sent
			// through it, and the clients must carry on through the others.
			proxy, err := etcdtest.NewProxy(c.Member(0))
			require.NoError(t, err)
			t.Cleanup(proxy.Close)
			eps := append([]string{proxy.URL()}, c.Endpoints()[1:]...)
			prefix := fmt.Sprintf("test/%d/", prefixes.Add(1))
			stores := make([]runlease.Store, 3)
			for i := range stores {
				client, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
				require.NoError(t, err)
				t.Cleanup(func() { client.Close() })
				stores[i] = storeOn(t, client, etcdstore.WithPrefix(prefix))
			}
			var cutAt, healAt int64
			recs, _ := linRun(t, stores, func(ctx context.Context) {
				// First lose a few replies: requests that apply while their
				// sender learns nothing.
				for range 6 {
					linSleep(ctx, 300*time.Millisecond)
					proxy.DropAfterRequest(50 * time.Millisecond)
				}
				linSleep(ctx, 500*time.Millisecond)
				cutAt = history.Mono()
				proxy.Cut()
				t.Log("cut member 0 off")
				linSleep(ctx, 4*time.Second)
				healAt = history.Mono()
				proxy.Heal()
				linSleep(ctx, 1500*time.Millisecond)
			})
			if !linRequireLinearizable(t, recs, attempt) {
				continue
			}

			// Failover: every client kept being served while its member was
			// cut off. Calls that began in the first half second after the cut
			// may still have been waiting on the dead connection.
			served := make([]int, len(stores))
			for _, r := range recs {
				if !r.Unknown && r.Call > cutAt+int64(500*time.Millisecond) && r.Return < healAt {
					served[r.Proc]++
				}
			}
			for i, n := range served {
				assert.Greater(t, n, 50, "client %d was served %d calls while member 0 was cut off", i, n)
			}
			t.Logf("calls served while cut off, per client: %v", served)
			return
		}
	})
}

// linOneRun makes one history through a leader kill and a follower kill,
// each member restarted, and checks it; it reports false when the check
// was inconclusive and another attempt may be made (see linAttempts).
func linOneRun(t *testing.T, c *etcdtest.Cluster, attempt int) bool {
	prefix := fmt.Sprintf("test/%d/", prefixes.Add(1))
	stores := make([]runlease.Store, 3)
	for i := range stores {
		stores[i] = storeOn(t, newClient(t), etcdstore.WithPrefix(prefix))
	}
	recs, _ := linRun(t, stores, func(ctx context.Context) {
		last := -1
		for _, pick := range []string{"leader", "follower"} {
			linSleep(ctx, 1500*time.Millisecond)
			leader, err := c.Leader(ctx)
			require.NoError(t, err)
			victim := leader
			for pick == "follower" && (victim == leader || victim == last) {
				victim = (victim + 1) % etcdtest.Members
			}
			last = victim
			c.Kill(victim)
			t.Logf("killed the %s, member %d", pick, victim)
			linSleep(ctx, 5*time.Second)
			require.NoError(t, c.Restart(victim))
			t.Logf("member %d answers again", victim)
		}
		linSleep(ctx, 1500*time.Millisecond)
	})
	return linRequireLinearizable(t, recs, attempt)
}

// linRun makes random calls through every store from [linGoroutines]
// goroutines each until faults returns, and returns the records to check
// and how many calls failed.
func linRun(t *testing.T, stores []runlease.Store, faults func(context.Context)) ([]linearize.Record, int) {
	t.Helper()
	w := &linearize.Workload{Keys: []string{"lin:0", "lin:1", "lin:2"}, Values: []string{"a", "b", "c", "d"},
		BatchShare: 0.2, Now: history.Mono, Timeout: linCallTimeout}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var (
		mu     sync.Mutex
		recs   []linearize.Record
		failed int
		wg     sync.WaitGroup
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for p, s := range stores {
		for g := range linGoroutines {
			wg.Go(func() {
				c := w.NewClient(s, p, g, seed)
				rng := rand.New(rand.NewPCG(seed, uint64(p*linGoroutines+g)))
				var local []linearize.Record
				n := 0
				for ctx.Err() == nil {
					// A call is made with the test's context, not ctx, so
					// that the end of the run cuts none short.
					rec, keep, err := c.Step(t.Context())
					if err != nil {
						n++
					}
					if keep {
						local = append(local, rec)
					}
					linSleep(ctx, time.Duration(rng.Int64N(int64(linPause))))
				}
				mu.Lock()
				recs = append(recs, local...)
				failed += n
				mu.Unlock()
			})
		}
	}
	faults(ctx)
	stop()
	wg.Wait()
	return recs, failed
}

// linAttempts is how many histories a subtest makes at most while the
// checker cannot finish searching them within linCheckTimeout. A search
// that runs out of time (porcupine's verdict Unknown) proves nothing either
// way: a history with a few dozen calls of unknown outcome, each of which
// may take effect anywhere after it began, can be too hard to search on a
// busy machine. Such a history is logged and another one is made; a
// history found not linearizable fails at once.
const linAttempts = 2

// linRequireLinearizable checks recs as one map (batches span keys) and
// requires that the history exercised what it is meant to. It reports
// false, having logged why, when the check ran out of time before the last
// attempt.
func linRequireLinearizable(t *testing.T, recs []linearize.Record, attempt int) bool {
	t.Helper()
	res := linearize.Check(recs, []string{"lin:0", "lin:1", "lin:2"}, false, linCheckTimeout)
	var won, lost, found, batches, unknown int
	for _, r := range recs {
		switch {
		case r.Unknown:
			unknown++
		case r.Kind == linearize.Get && r.Found:
			found++
		case r.Kind == linearize.Batch && r.OK:
			batches++
		case r.OK:
			won++
		case r.Kind != linearize.Get:
			lost++
		}
	}
	t.Logf("%d calls (%d with an unknown outcome): %d writes applied, %d refused, %d batches applied, %d gets found a value; checked in %v",
		res.Ops, unknown, won, lost, batches, found, res.Took)
	if res.Verdict == porcupine.Unknown && attempt < linAttempts {
		t.Logf("attempt %d: the check ran out of time after %v, which proves nothing either way; making another history", attempt, res.Took)
		return false
	}
	require.Equal(t, porcupine.Ok, res.Verdict, "the history of %d calls is not linearizable", res.Ops)
	assert.Positive(t, won, "no conditional write applied")
	assert.Positive(t, lost, "no conditional write refused: the clients never collided")
	assert.Positive(t, batches, "no batch applied")
	assert.Positive(t, found, "no get found a value")
	return true
}

// linSleep waits for d or the end of ctx.
func linSleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
