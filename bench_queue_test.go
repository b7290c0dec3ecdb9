package runlease_test

// Benchmarks of the admission queue (see BENCHMARKS.md "## Admission
// queue"):
//
//   - BenchmarkQueueAdmission: a release by one node until the waiter of
//     another node (a second pool on the same table, on Postgres; the same
//     store on SQLite) returns from ClaimSlotsWait, woken by the store's
//     notification, with the poll set to an hour so that only the wake-up
//     can admit it. Reports p50-us and p99-us of that latency.
//   - BenchmarkQueueClaim: ClaimSlots+Release of one slot of a scope whose
//     queue holds n live entries of lower priority (they rank behind the
//     claim, so it is admitted), at n = 0, 1, 100 and 10,000: round trips
//     per cycle and the ratio of its rate to the same cycle with n = 0, in
//     the same run.
//   - BenchmarkQueueWakeRead: the read a woken waiter makes (one scope:
//     its slots, queue and marks in one call), at the same lengths, with
//     its round trips and its ratio to n = 0.
//   - BenchmarkQueueWakeWaiters: the reads of a scope that one release
//     costs when 1 or 20 waiters of one process wait on it.
//   - BenchmarkQueueWaitCycle: a driver's ClaimSlotsWait and Release of a
//     free scope, over and over, as at every superstep, against
//     ClaimSlots and Release of the same scope in the same run, one after
//     the other: the wait's extra cost (its subscription) is the ratio.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/benchkit"
)

var queueLengths = []int{0, 1, 100, 10_000}

func BenchmarkQueueAdmission(b *testing.B) {
	forEachStore(b, func(b *testing.B, env *benchkit.Env) {
		ctx := b.Context()
		waiterStore := env.Store
		if env.Kind == "postgres" {
			peer, err := env.Peer(ctx)
			if err != nil {
				b.Fatal(err)
			}
			waiterStore = peer
		}
		scope := []runlease.Scope{runlease.NamedScope("bench-admit-"+strconv.FormatInt(env.Seq(), 10), 1)}
		lat := make([]time.Duration, 0, b.N)
		trips := env.Trips()
		b.ResetTimer()
		for i := range b.N {
			held, err := runlease.ClaimSlots(ctx, env.Store, "holder", scope)
			if err != nil {
				b.Fatal(err)
			}
			admitted := make(chan time.Time, 1)
			errs := make(chan error, 1)
			go func() {
				sl, err := runlease.ClaimSlotsWait(ctx, waiterStore, "waiter-"+strconv.Itoa(i), scope,
					runlease.WithWaitPoll(time.Hour))
				if err != nil {
					errs <- err
					return
				}
				admitted <- time.Now()
				errs <- sl.Release(ctx)
			}()
			if err := awaitEntries(ctx, env.Store, 1); err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			if err := held.Release(ctx); err != nil {
				b.Fatal(err)
			}
			select {
			case t1 := <-admitted:
				lat = append(lat, t1.Sub(t0))
			case err := <-errs:
				b.Fatal(err)
			}
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(us(lat[len(lat)/2]), "p50-us")
		b.ReportMetric(us(lat[min(len(lat)-1, len(lat)*99/100)]), "p99-us")
		b.ReportMetric(float64(env.Trips()-trips)/float64(b.N), "trips/cycle")
	})
}

// awaitEntries waits until the queues hold n rows.
func awaitEntries(ctx context.Context, s runlease.Store, n int) error {
	for {
		rows, err := s.MetaScan(ctx, runlease.QueuePrefix)
		if err != nil {
			return err
		}
		if len(rows) == n {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// fillQueue writes n live entries of priority -1 into scope's queue, as
// waiters in other processes would.
func fillQueue(b *testing.B, s runlease.Store, scope string, n int) {
	b.Helper()
	now := time.Now().UnixMilli()
	var ops []runlease.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		ok, err := s.(runlease.Batcher).MetaBatch(b.Context(), nil, ops)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		ops = ops[:0]
	}
	for i := range n {
		run := "queued-" + strconv.Itoa(i)
		v := fmt.Sprintf(`{"run":%q,"waiter":"w%d","fence":0,"seq":1,"principal":"p%d","weight":1,"priority":-1,"units":1,"tag":%d,"enq_ms":%d,"until_ms":%d,"scopes":[%q]}`,
			run, i, i%10, i*100_000, now, now+3_600_000, scope)
		key := fmt.Sprintf("%s%d:%s:%07d.%019d.%016d:%s", runlease.QueuePrefix, len(scope), scope, runlease.MaxPriority+1, i*100_000, now, run)
		ops = append(ops, runlease.Put(key, v))
		if len(ops) == runlease.MaxBatch {
			flush()
		}
	}
	flush()
}

func BenchmarkQueueClaim(b *testing.B) {
	benchQueueLengths(b, "cycle", func(ctx context.Context, env *benchkit.Env, scope []runlease.Scope) error {
		sl, err := runlease.ClaimSlots(ctx, env.Store, "claimant", scope)
		if err != nil {
			return err
		}
		return sl.Release(ctx)
	})
}

func BenchmarkQueueWakeRead(b *testing.B) {
	benchQueueLengths(b, "read", func(ctx context.Context, env *benchkit.Env, scope []runlease.Scope) error {
		_, err := runlease.ExplainSlots(ctx, env.Store, "woken", scope)
		return err
	})
}

// benchQueueLengths runs op on a scope of limit 1 whose queue holds each
// of queueLengths live entries ranked behind it, reporting its rate, round
// trips and ratio to the empty queue of the same run, per unit.
func benchQueueLengths(b *testing.B, unit string, op func(context.Context, *benchkit.Env, []runlease.Scope) error) {
	forEachStore(b, func(b *testing.B, env *benchkit.Env) {
		var base float64
		for _, n := range queueLengths {
			b.Run(fmt.Sprintf("queue=%d", n), func(b *testing.B) {
				name := "bench-queue-" + strconv.FormatInt(env.Seq(), 10)
				fillQueue(b, env.Store, name, n)
				scope := []runlease.Scope{runlease.NamedScope(name, 1)}
				trips := env.Trips()
				start := time.Now()
				b.ResetTimer()
				for range b.N {
					if err := op(b.Context(), env, scope); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				rate := float64(b.N) / time.Since(start).Seconds()
				if n == 0 {
					base = rate
				}
				b.ReportMetric(rate, unit+"s/s")
				b.ReportMetric(float64(env.Trips()-trips)/float64(b.N), "trips/"+unit)
				if base > 0 {
					b.ReportMetric(rate/base, "ratio-to-empty")
				}
			})
		}
	})
}

// BenchmarkQueueWaitCycle times, cycle by cycle and alternately,
// ClaimSlotsWait+Release and ClaimSlots+Release of one free scope by one
// driver. A wait subscribes to its scope's wake-ups while it runs; on
// Postgres the store listens on a connection of its own, and marks the
// scope as waited on, for as long as anyone subscribes and a while after,
// so that a driver waiting at every superstep does not open a connection
// and write a mark at every call. Reports the medians of both cycles,
// their ratio (wait-to-claim) and the round trips of a wait's cycle.
func BenchmarkQueueWaitCycle(b *testing.B) {
	forEachStore(b, func(b *testing.B, env *benchkit.Env) {
		ctx := b.Context()
		scope := []runlease.Scope{runlease.NamedScope("bench-cycle-"+strconv.FormatInt(env.Seq(), 10), 4)}
		cycle := func(wait bool) (time.Duration, error) {
			t0 := time.Now()
			var sl *runlease.Slots
			var err error
			if wait {
				sl, err = runlease.ClaimSlotsWait(ctx, env.Store, "driver", scope)
			} else {
				sl, err = runlease.ClaimSlots(ctx, env.Store, "driver", scope)
			}
			if err == nil {
				err = sl.Release(ctx)
			}
			return time.Since(t0), err
		}
		waits := make([]time.Duration, 0, b.N)
		claims := make([]time.Duration, 0, b.N)
		var waitTrips int64
		b.ResetTimer()
		for range b.N {
			trips := env.Trips()
			d, err := cycle(true)
			if err != nil {
				b.Fatal(err)
			}
			waitTrips += env.Trips() - trips
			waits = append(waits, d)
			if d, err = cycle(false); err != nil {
				b.Fatal(err)
			}
			claims = append(claims, d)
		}
		b.StopTimer()
		slices.Sort(waits)
		slices.Sort(claims)
		w, c := waits[len(waits)/2], claims[len(claims)/2]
		b.ReportMetric(us(w), "wait-p50-us")
		b.ReportMetric(us(c), "claim-p50-us")
		b.ReportMetric(float64(w)/float64(c), "wait-to-claim")
		b.ReportMetric(float64(waitTrips)/float64(b.N), "trips/wait")
	})
}

// BenchmarkQueueWakeWaiters: w waiters of one process (w = 1 and 20) wait
// on a full scope of limit 1, through one Store value, with a poll of an
// hour; each cycle releases the slot, and the waiter admitted holds it for
// the next cycle while a new waiter takes its place in the queue. Reports
// reads/release: the reads of the scope's slot rows from the release until
// every waiter is asleep again (no read for 50 ms). The timed part is the
// release and the admission it wakes.
func BenchmarkQueueWakeWaiters(b *testing.B) {
	forEachStore(b, func(b *testing.B, env *benchkit.Env) {
		for _, w := range []int{1, 20} {
			b.Run(fmt.Sprintf("waiters=%d", w), func(b *testing.B) {
				benchWakeWaiters(b, env, w)
			})
		}
	})
}

func benchWakeWaiters(b *testing.B, env *benchkit.Env, w int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	rc := &readCounter{waitStore: env.Store.(waitStore)}
	name := "bench-wake-" + strconv.FormatInt(env.Seq(), 10)
	scope := []runlease.Scope{runlease.NamedScope(name, 1)}
	held, err := runlease.ClaimSlots(ctx, rc, "holder", scope)
	if err != nil {
		b.Fatal(err)
	}
	admitted, errs := make(chan *runlease.Slots, 1), make(chan error, w)
	next := 0
	spawn := func() {
		next++
		run := "waiter-" + strconv.Itoa(next)
		wg.Go(func() {
			sl, err := runlease.ClaimSlotsWait(ctx, rc, run, scope, runlease.WithWaitPoll(time.Hour))
			switch {
			case err == nil:
				admitted <- sl
			case ctx.Err() == nil:
				errs <- err
			}
		})
	}
	for range w {
		spawn()
	}
	if err := awaitScopeEntries(ctx, env.Store, name, w); err != nil {
		b.Fatal(err)
	}
	rc.settle()
	var reads int64
	b.ResetTimer()
	for range b.N {
		r0 := rc.reads.Load()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		select {
		case held = <-admitted:
		case err := <-errs:
			b.Fatal(err)
		}
		b.StopTimer()
		rc.settle()
		reads += rc.reads.Load() - r0
		spawn()
		if err := awaitScopeEntries(ctx, env.Store, name, w); err != nil {
			b.Fatal(err)
		}
		rc.settle()
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(reads)/float64(b.N), "reads/release")
	if err := held.Release(ctx); err != nil {
		b.Fatal(err)
	}
}

// waitStore is what a built-in store offers a waiter.
type waitStore interface {
	runlease.Store
	runlease.Batcher
	runlease.DeleteNotifier
	runlease.MultiScanner
	runlease.RangeReader
}

// readCounter counts the reads of slot rows through a built-in store: a
// MetaScanMany or a MetaRanges, or a MetaScan of slot rows.
type readCounter struct {
	waitStore
	reads atomic.Int64
}

func (c *readCounter) MetaScan(ctx context.Context, prefix string) ([]runlease.Row, error) {
	if strings.HasPrefix(prefix, runlease.SlotPrefix) {
		c.reads.Add(1)
	}
	return c.waitStore.MetaScan(ctx, prefix)
}

func (c *readCounter) MetaScanMany(ctx context.Context, prefixes []string) ([][]runlease.Row, error) {
	c.reads.Add(1)
	return c.waitStore.MetaScanMany(ctx, prefixes)
}

func (c *readCounter) MetaRanges(ctx context.Context, ranges []runlease.Range) ([][]runlease.Row, error) {
	c.reads.Add(1)
	return c.waitStore.MetaRanges(ctx, ranges)
}

// settle waits until no read has been made for 50 ms.
func (c *readCounter) settle() {
	for last := int64(-1); ; {
		n := c.reads.Load()
		if n == last {
			return
		}
		last = n
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitScopeEntries waits until the queue of scope holds n rows.
func awaitScopeEntries(ctx context.Context, s runlease.Store, scope string, n int) error {
	prefix := runlease.QueuePrefix + strconv.Itoa(len(scope)) + ":" + scope + ":"
	for {
		rows, err := s.MetaScan(ctx, prefix)
		if err != nil {
			return err
		}
		if len(rows) == n {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(100 * time.Microsecond)
	}
}
