package runlease_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/benchkit"
)

// BenchmarkQueueEntryRenewals: w waiters of one process (w = 10, 100 and
// 1,000) wait on a full scope of limit 1, through one Store value, with a
// TTL of MinTTL and a poll of an hour, so that nothing but their entries'
// renewals (and the expiries they wait for) makes them call the store.
// Each iteration watches them for one TTL. Reports, per waiter and TTL,
// the calls that wrote entries (trips/waiter-ttl), the entries written
// (writes/waiter-ttl) and the reads of the scope (reads/waiter-ttl), for
// the store as it is ("together": renewals batched per process) and for
// the same store without MultiCASer ("alone": each waiter renews in a
// batch of its own).
func BenchmarkQueueEntryRenewals(b *testing.B) {
	forEachStore(b, func(b *testing.B, env *benchkit.Env) {
		for _, w := range []int{10, 100, 1000} {
			for _, alone := range []bool{false, true} {
				name := "together"
				if alone {
					name = "alone"
				}
				b.Run(fmt.Sprintf("waiters=%d/%s", w, name), func(b *testing.B) {
					benchEntryRenewals(b, env, w, alone)
				})
			}
		}
	})
}

// entryCounter counts the calls of a built-in store that write queue
// entries and that read a scope. entryCounterAlone hides its MultiCASer.
type entryCounter struct {
	waitStore
	calls, writes, reads atomic.Int64
}

func (c *entryCounter) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	c.calls.Add(1)
	c.writes.Add(int64(len(ops)))
	return c.waitStore.MetaBatch(ctx, conds, ops)
}

func (c *entryCounter) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	c.reads.Add(1)
	return c.waitStore.MetaScanMany(ctx, prefixes)
}

func (c *entryCounter) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	c.reads.Add(1)
	return c.waitStore.MetaRanges(ctx, ranges)
}

type entryCounterMulti struct{ *entryCounter }

func (c entryCounterMulti) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	c.calls.Add(1)
	c.writes.Add(int64(len(writes)))
	return c.waitStore.(runlease.MultiCASer).MetaCASMany(ctx, writes)
}

func benchEntryRenewals(b *testing.B, env *benchkit.Env, w int, alone bool) {
	ctx, cancel := context.WithCancel(b.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	c := &entryCounter{waitStore: env.Store.(waitStore)}
	var store runlease.Store = entryCounterMulti{c}
	if alone {
		store = c
	}
	name := "bench-renew-" + strconv.FormatInt(env.Seq(), 10)
	scope := []runlease.Scope{runlease.NamedScope(name, 1)}
	held, err := runlease.ClaimSlots(ctx, env.Store, "holder", scope, runlease.WithTTL(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	defer held.Release(context.Background())
	errs := make(chan error, w)
	for i := range w {
		wg.Go(func() {
			_, err := runlease.ClaimSlotsWait(ctx, store, "waiter-"+strconv.Itoa(i), scope,
				runlease.WithTTL(runlease.MinTTL), runlease.WithWaitPoll(time.Hour))
			if ctx.Err() == nil {
				errs <- err
			}
		})
	}
	if err := awaitScopeEntries(ctx, env.Store, name, w); err != nil {
		b.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the last placements' reads end
	calls, writes, reads := c.calls.Load(), c.writes.Load(), c.reads.Load()
	b.ResetTimer()
	for range b.N {
		select {
		case err := <-errs:
			b.Fatalf("a waiter returned: %v", err)
		case <-time.After(runlease.MinTTL):
		}
	}
	b.StopTimer()
	per := float64(w) * float64(b.N)
	b.ReportMetric(float64(c.calls.Load()-calls)/per, "trips/waiter-ttl")
	b.ReportMetric(float64(c.writes.Load()-writes)/per, "writes/waiter-ttl")
	b.ReportMetric(float64(c.reads.Load()-reads)/per, "reads/waiter-ttl")
}
