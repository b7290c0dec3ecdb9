package runlease_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// bubbleStore opens an embedded store inside a synctest bubble and closes it
// before the bubble ends, so that its goroutines belong to the bubble.
func bubbleStore(t *testing.T) *runlease.SQLiteStore {
	t.Helper()
	s, err := runlease.OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// events records hook calls.
type events struct {
	mu      sync.Mutex
	renewed []runlease.RenewEvent
	lost    []runlease.LossEvent
	slots   []runlease.SlotLossEvent
}

func (e *events) hooks() runlease.Hooks {
	return runlease.Hooks{
		Renewed: func(ev runlease.RenewEvent) { e.mu.Lock(); e.renewed = append(e.renewed, ev); e.mu.Unlock() },
		Lost:    func(ev runlease.LossEvent) { e.mu.Lock(); e.lost = append(e.lost, ev); e.mu.Unlock() },
		SlotsLost: func(ev runlease.SlotLossEvent) {
			e.mu.Lock()
			e.slots = append(e.slots, ev)
			e.mu.Unlock()
		},
	}
}

func (e *events) counts() (renewed, failed, lost int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.renewed {
		if r.Err != nil {
			failed++
		}
	}
	return len(e.renewed), failed, len(e.lost)
}

// TestKeeper is not parallel: one subtest counts the process's goroutines.
func TestKeeper(t *testing.T) {
	five := runlease.WithTTL(5 * time.Second)

	t.Run("a_5s_ttl_survives_a_60s_superstep", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			ev := &events{}
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five, runlease.WithHooks(ev.hooks()))
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)

			time.Sleep(60 * time.Second) // the superstep: a long tool call
			require.NoError(t, k.Err())
			require.NoError(t, k.Context().Err(), "the work context is still live")
			_, err = runlease.Acquire(t.Context(), s, "r1", "B", five)
			require.ErrorIs(t, err, runlease.ErrLeaseLost, "a contender is still refused")
			renewed, failed, _ := ev.counts()
			assert.Equal(t, 0, failed)
			assert.GreaterOrEqual(t, renewed, 60*3/5-1, "about every TTL/3")
			assert.True(t, l.Expiry().After(time.Now()))

			k.Stop()
			require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
			info, err := runlease.Peek(t.Context(), s, "r1")
			require.NoError(t, err)
			assert.True(t, info.Live, "stopping does not release")
		})
	})

	t.Run("a_lost_lease_cancels_the_work_context_with_the_reason", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			ev := &events{}
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l, runlease.WithHooks(ev.hooks()))
			require.NoError(t, err)
			// Taken before the loss, as a driver takes it: the context must
			// be cancelled by the loss, not merely created cancelled.
			work := k.Context()

			// Another writer replaces the row, as a takeover after a pause would.
			cur := get(t, s, "runlease:r1")
			ok, err := s.MetaCAS(t.Context(), "runlease:r1", &cur, `{"holder":"B","fence":9,"until_ms":1}`)
			require.NoError(t, err)
			require.True(t, ok)

			<-work.Done()
			<-k.Done()
			err = k.Err()
			require.ErrorIs(t, err, runlease.ErrLeaseLost)
			require.ErrorIs(t, err, runlease.ErrTakenOver)
			var lost *runlease.LeaseLostError
			require.ErrorAs(t, err, &lost)
			assert.Equal(t, "B", lost.Holder)
			assert.Equal(t, uint64(9), lost.Fence)
			assert.Equal(t, err, context.Cause(work))
			assert.Equal(t, err, context.Cause(k.Context()))
			synctest.Wait()
			_, _, nlost := ev.counts()
			assert.Equal(t, 1, nlost, "the Lost hook fires once")
			ev.mu.Lock()
			defer ev.mu.Unlock()
			require.NotEmpty(t, ev.renewed, "the renewal that found the loss is reported to Renewed too")
			last := ev.renewed[len(ev.renewed)-1]
			assert.ErrorIs(t, last.Err, runlease.ErrTakenOver)
		})
	})

	t.Run("an_operator_release_is_reported_as_released", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			cur := get(t, s, "runlease:r1")
			_, err = s.MetaCAS(t.Context(), "runlease:r1", &cur, `{"holder":"","fence":1,"until_ms":0}`)
			require.NoError(t, err)
			<-k.Done()
			require.ErrorIs(t, k.Err(), runlease.ErrReleased)
		})
	})

	t.Run("an_unreachable_store_ends_trust_before_the_lease_can_expire", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			ev := &events{}
			l, err := runlease.Acquire(t.Context(), f, "r1", "A", five, runlease.WithHooks(ev.hooks()))
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			time.Sleep(10 * time.Second) // healthy for a while
			expiry := l.Expiry()

			f.SetDown(true)
			<-k.Done()
			ended := time.Now()
			require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
			require.ErrorIs(t, k.Err(), runlease.ErrStorage, "the last fault is kept")
			assert.ErrorIs(t, context.Cause(k.Context()), runlease.ErrTrustExpired)
			// The holder stopped at least the margin (TTL/10) before anyone
			// could take over, by the clock that judges expiry.
			assert.LessOrEqual(t, ended.Add(500*time.Millisecond).UnixMilli(), expiry.UnixMilli())
			synctest.Wait() // the Lost hook runs just after Done closes
			_, failed, nlost := ev.counts()
			assert.Greater(t, failed, 3, "faults are retried with backoff inside the window")
			assert.Equal(t, 1, nlost)

			f.SetDown(false)
			for time.Now().UnixMilli() < expiry.UnixMilli() {
				_, err = runlease.Acquire(t.Context(), f, "r1", "B", five)
				require.ErrorIs(t, err, runlease.ErrLeaseLost, "no contender before expiry")
				time.Sleep(100 * time.Millisecond)
			}
			_, err = runlease.Acquire(t.Context(), f, "r1", "B", five)
			require.NoError(t, err)
		})
	})

	t.Run("transient_faults_inside_the_window_are_survived", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			ev := &events{}
			l, err := runlease.Acquire(t.Context(), f, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l, runlease.WithHooks(ev.hooks()))
			require.NoError(t, err)
			time.Sleep(2 * time.Second)
			f.SetDown(true)
			time.Sleep(2 * time.Second)
			f.SetDown(false)
			time.Sleep(20 * time.Second)
			require.NoError(t, k.Err())
			_, failed, _ := ev.counts()
			assert.Positive(t, failed)
			k.Stop()
		})
	})

	t.Run("ending_the_start_context_stops_the_keeper_loudly", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			acquireCtx, endRequest := context.WithCancel(t.Context())
			l, err := runlease.Acquire(acquireCtx, s, "r1", "A", five)
			require.NoError(t, err)
			endRequest() // a request-scoped context used to acquire ends: renewal must go on

			runCtx, endRun := context.WithCancelCause(t.Context())
			k, err := runlease.Keep(runCtx, l)
			require.NoError(t, err)
			time.Sleep(30 * time.Second)
			require.NoError(t, k.Err(), "the acquire context does not end renewal")

			boom := errors.New("shutting down")
			endRun(boom)
			<-k.Done()
			require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
			require.ErrorIs(t, k.Err(), boom, "the cause is kept")
			require.ErrorIs(t, context.Cause(k.Context()), boom)
		})
	})

	t.Run("slots_are_renewed_beside_and_a_lost_slot_does_not_stop_the_run", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			ev := &events{}
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			sl, err := runlease.ClaimSlots(t.Context(), s, "r1", []runlease.Scope{runlease.MemScope(1)}, five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l, runlease.KeepSlots(sl), runlease.WithHooks(ev.hooks()))
			require.NoError(t, err)
			time.Sleep(30 * time.Second)
			_, err = runlease.ClaimSlots(t.Context(), s, "r2", []runlease.Scope{runlease.MemScope(1)}, five)
			require.ErrorIs(t, err, runlease.ErrConcurrencyLimit, "the slot was kept alive")

			cur := get(t, s, "runslot:mem:0")
			_, err = s.MetaCAS(t.Context(), "runslot:mem:0", &cur, `{"holder":"r2","fence":0,"until_ms":1}`)
			require.NoError(t, err)
			time.Sleep(5 * time.Second)
			require.NoError(t, k.Err(), "the run goes on")
			ev.mu.Lock()
			require.Len(t, ev.slots, 1)
			assert.Equal(t, []string{"runslot:mem:0"}, ev.slots[0].Err.Keys)
			ev.mu.Unlock()
			require.NoError(t, k.Release(t.Context()))
			assert.Equal(t, []runlease.Row{
				{Key: "runlease:r1", Value: get(t, s, "runlease:r1")},
				{Key: "runslot:mem:0", Value: `{"holder":"r2","fence":0,"until_ms":1}`},
			}, rows(t, s), "release frees the lease and leaves the slot r2 took")
			info, err := runlease.Peek(t.Context(), s, "r1")
			require.NoError(t, err)
			assert.True(t, info.Released)
		})
	})

	t.Run("one_renewer_keeps_many_leases_in_batches_without_a_goroutine_each", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := testkit.NewCountingBatcher(bubbleStore(t))
			var r runlease.Renewer
			// Count only the goroutines this test starts: tests running in
			// parallel start theirs too.
			pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("runlease-test", t.Name())))
			before := labelledGoroutines(t.Name())
			const n = 100
			keepers := keepRuns(t, &r, s, n, 0)
			synctest.Wait()
			started := labelledGoroutines(t.Name()) - before
			assert.Positive(t, started, "the renewer's loop is counted")
			assert.Less(t, started, 10, "one loop, not one goroutine per lease")
			s.Reset()
			time.Sleep(20 * time.Second)
			for _, k := range keepers {
				require.NoError(t, k.Err())
			}
			assert.Zero(t, s.CASes.Load(), "no lease renewed on its own")
			assert.GreaterOrEqual(t, s.MultiWrites.Load(), int64(n*20*3/5-n), "every lease about every TTL/3")
			assert.LessOrEqual(t, s.Multis.Load(), int64(20*3/5+2), "all of them in one call per interval")
			r.Close()
			for _, k := range keepers {
				require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
			}
		})
	})

	t.Run("a_lease_lost_inside_a_batch_is_told_apart_from_the_others", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := testkit.NewCountingBatcher(bubbleStore(t))
			var r runlease.Renewer
			defer r.Close()
			keepers := make([]*runlease.Keeper, 3)
			for i := range keepers {
				l, err := runlease.Acquire(t.Context(), s, "r"+strconv.Itoa(i), "A", five)
				require.NoError(t, err)
				keepers[i], err = r.Keep(t.Context(), l)
				require.NoError(t, err)
			}
			cur := get(t, s, "runlease:r1")
			_, err := s.MetaCAS(t.Context(), "runlease:r1", &cur, `{"holder":"B","fence":2,"until_ms":1}`)
			require.NoError(t, err)
			<-keepers[1].Done()
			require.ErrorIs(t, keepers[1].Err(), runlease.ErrTakenOver)
			time.Sleep(10 * time.Second)
			require.NoError(t, keepers[0].Err())
			require.NoError(t, keepers[2].Err())
			assert.Positive(t, s.Multis.Load(), "renewed in batches")
		})
	})

	t.Run("one_lease_kept_twice_is_renewed_without_deadlock", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			var r runlease.Renewer
			defer r.Close()
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			k1, err := r.Keep(t.Context(), l)
			require.NoError(t, err)
			k2, err := r.Keep(t.Context(), l)
			require.NoError(t, err)
			time.Sleep(20 * time.Second)
			require.NoError(t, k1.Err())
			require.NoError(t, k2.Err())
		})
	})

	t.Run("err_judges_the_trust_window_when_called", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			time.Sleep(5 * time.Second) // a pause past the trust window, before keeping
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired, "at once, whether or not the loop has run")
			<-k.Done()
		})
	})

	t.Run("bad_options_are_refused", func(t *testing.T) {
		t.Parallel()
		s := newSQLite(t)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
		require.NoError(t, err)
		for _, opt := range []runlease.Option{
			runlease.KeepInterval(3 * time.Second), runlease.KeepInterval(-time.Second),
			runlease.KeepMargin(3 * time.Second), runlease.KeepMargin(-time.Second),
		} {
			_, err := runlease.Keep(t.Context(), l, opt)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
		}
		_, err = runlease.Keep(t.Context(), nil)
		require.ErrorIs(t, err, runlease.ErrInvalidArgument)
		require.NoError(t, l.Release(t.Context()))
		_, err = runlease.Keep(t.Context(), l)
		require.ErrorIs(t, err, runlease.ErrReleased, "a released lease cannot be kept")
	})
}

func TestKeeperStopLeavesNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bubbleStore(t)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(5*time.Second))
		require.NoError(t, err)
		var calls atomic.Int64
		k, err := runlease.Keep(context.Background(), l, runlease.KeepInterval(100*time.Millisecond),
			runlease.WithHooks(runlease.Hooks{Renewed: func(runlease.RenewEvent) { calls.Add(1) }}))
		require.NoError(t, err)
		time.Sleep(250 * time.Millisecond)
		require.GreaterOrEqual(t, calls.Load(), int64(2))
		k.Stop()
		n := calls.Load()
		time.Sleep(10 * time.Second) // simulated: two hundred intervals
		assert.Equal(t, n, calls.Load(), "no renewal after Stop returned")
		select {
		case <-k.Done():
		default:
			t.Fatal("Done not closed after Stop")
		}
		// The bubble ends only once every goroutine in it has exited.
	})
}

// TestKeeperStopsTrustingWhenTheExpiryClockJumpsAhead: the clock that
// judges expiry jumps forward, so the row has less than the margin left
// though the keeper's monotonic window is still open. A keeper judged at
// that moment no longer trusts the lease: a contender reading the same
// clock may take the run over before the monotonic window ends.
func TestKeeperStopsTrustingWhenTheExpiryClockJumpsAhead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newSQLite(t)
	clk := testkit.NewClock(time.Now())
	l, err := runlease.Acquire(ctx, s, "r", "A", runlease.WithTTL(10*time.Second), runlease.WithClock(clk.Now))
	require.NoError(t, err)
	k, err := runlease.Keep(ctx, l, runlease.KeepInterval(4*time.Second))
	require.NoError(t, err)
	defer k.Stop()
	require.NoError(t, k.Err(), "trusted at first")
	clk.Advance(9500 * time.Millisecond) // 0.5 s left by the expiry clock, less than the 1 s margin
	require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
	select {
	case <-k.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the work context outlived the keeper's trust")
	}
}

// labelledGoroutines counts the live goroutines whose pprof label
// runlease-test is value: those started by a goroutine that set it, and
// their descendants.
func labelledGoroutines(value string) int {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	want := strconv.Quote("runlease-test") + ":" + strconv.Quote(value)
	n := 0
	for _, block := range strings.Split(buf.String(), "\n\n") {
		block = strings.TrimPrefix(block, "goroutine profile:")
		if i := strings.Index(block, "\n"); strings.HasPrefix(block, " total") && i >= 0 {
			block = block[i+1:]
		}
		if !strings.Contains(block, want) {
			continue
		}
		var c int
		if _, err := fmt.Sscanf(block, "%d @", &c); err == nil {
			n += c
		}
	}
	return n
}

// Leases a Renewer keeps come due on shared beats, so leases acquired a few
// milliseconds apart still renew together.
func TestRenewerPutsLeasesKeptAtDifferentMomentsInStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := testkit.NewCountingBatcher(bubbleStore(t))
		var r runlease.Renewer
		defer r.Close()
		// 40 leases acquired 10 ms apart: each comes due at its own
		// moment unless the renewer puts due times on shared beats.
		const n = 40
		keepers := keepRuns(t, &r, s, n, 10*time.Millisecond)
		s.Reset()
		time.Sleep(20 * time.Second) // 12 intervals of 5 s / 3
		for _, k := range keepers {
			require.NoError(t, k.Err())
		}
		calls := s.CASes.Load() + s.Multis.Load()
		assert.GreaterOrEqual(t, s.MultiWrites.Load(), int64(n*10), "nearly every renewal travels in a batch")
		assert.LessOrEqual(t, calls, int64(12*4), "a few calls per interval, not one per lease (%d renewed alone)", s.CASes.Load())
	})
}

// keepRuns acquires runs r0…r(n-1) for holder A with a 5 s TTL, gap apart,
// and keeps each on r.
func keepRuns(t *testing.T, r *runlease.Renewer, s runlease.Store, n int, gap time.Duration) []*runlease.Keeper {
	t.Helper()
	keepers := make([]*runlease.Keeper, n)
	for i := range n {
		l, err := runlease.Acquire(t.Context(), s, "r"+strconv.Itoa(i), "A", runlease.WithTTL(5*time.Second))
		require.NoError(t, err)
		keepers[i], err = r.Keep(t.Context(), l)
		require.NoError(t, err)
		time.Sleep(gap)
	}
	return keepers
}

// TestKeeperFaults holds the regression cases of the keeper's concurrency
// design (CONCURRENCY.md): each subtest is a schedule that once broke a
// promise of the README.
func TestKeeperFaults(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)

	t.Run("a_hung_write_on_one_lease_does_not_freeze_the_other_keepers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := faultyBubble(t)
			var r runlease.Renewer
			defer r.Close()
			a, err := runlease.Acquire(t.Context(), s, "a", "A", five)
			require.NoError(t, err)
			b, err := runlease.Acquire(t.Context(), s, "b", "B", five)
			require.NoError(t, err)
			ka, err := r.Keep(t.Context(), a)
			require.NoError(t, err)
			kb, err := r.Keep(t.Context(), b)
			require.NoError(t, err)

			s.HangWrites(testkit.Prefix("ckpt:"))
			writeCtx, cancelWrite := context.WithCancel(t.Context())
			defer cancelWrite()
			wrote := make(chan error, 1)
			go func() { wrote <- a.Write(writeCtx, runlease.Put("ckpt:a", "1")) }()

			time.Sleep(60 * time.Second)
			require.NoError(t, kb.Err(), "the other run's keeper renews on")
			require.NoError(t, kb.Context().Err())
			_, err = runlease.Acquire(t.Context(), s, "b", "C", five)
			require.ErrorIs(t, err, runlease.ErrLeaseLost, "and its lease stays held")

			// The run whose write hangs cannot renew: its keeper gives up
			// before the row can expire, and says so without waiting.
			require.ErrorIs(t, ka.Err(), runlease.ErrTrustExpired)
			ka.Stop()
			cancelWrite()
			require.ErrorIs(t, <-wrote, runlease.ErrOutcomeUnknown)
		})
	})

	t.Run("overlapping_batched_renewals_do_not_deadlock", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			l1, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			l2, err := runlease.Acquire(t.Context(), s, "r2", "A", five)
			require.NoError(t, err)
			// Two renewers each keep both leases, in opposite order, so
			// their batches share both leases at the same instants.
			var r1, r2 runlease.Renewer
			var keepers []*runlease.Keeper
			for _, pair := range [][2]*runlease.Lease{{l1, l2}, {l2, l1}} {
				r := &r1
				if pair[0] == l2 {
					r = &r2
				}
				for _, l := range pair {
					k, err := r.Keep(t.Context(), l)
					require.NoError(t, err)
					keepers = append(keepers, k)
				}
			}
			time.Sleep(60 * time.Second)
			for i, k := range keepers {
				require.NoError(t, k.Err(), "keeper %d", i)
			}
			require.NoError(t, l1.Renew(t.Context()), "no call on a lease hangs")
			r1.Close()
			r2.Close()
		})
	})

	t.Run("options_that_cannot_apply_to_a_held_lease_are_refused", func(t *testing.T) {
		s := newSQLite(t)
		l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
		require.NoError(t, err)
		for _, opt := range []runlease.Option{
			runlease.WithTTL(time.Hour), runlease.WithClock(time.Now), runlease.WithWaitPoll(time.Second),
			runlease.KeepInterval(time.Nanosecond), runlease.KeepSlots(nil),
		} {
			k, err := runlease.Keep(t.Context(), l, opt)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			require.Nil(t, k)
		}
		_, err = runlease.Peek(t.Context(), s, "r1", runlease.WithTTL(time.Minute))
		require.ErrorIs(t, err, runlease.ErrInvalidArgument, "Peek judges; it has no TTL to apply")
		_, err = runlease.AcquireWait(t.Context(), s, "r1", "B", runlease.WithWaitPoll(time.Nanosecond))
		require.ErrorIs(t, err, runlease.ErrInvalidArgument, "a poll that would hammer the store")
	})

	t.Run("an_explicit_zero_margin_is_kept", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			start := time.Now()
			k, err := runlease.Keep(t.Context(), l, runlease.KeepMargin(0))
			require.NoError(t, err)
			defer k.Stop()
			assert.Equal(t, start.Add(5*time.Second), k.TrustedUntil(), "trust to the very expiry, as asked")
		})
	})

	t.Run("a_loss_found_by_a_fenced_write_ends_the_keeper_at_once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			a, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), a)
			require.NoError(t, err)
			work := k.Context() // taken first, as a driver does
			// An operator frees the run and another driver takes it, all
			// between two renewals of A's keeper.
			info, err := runlease.Peek(t.Context(), s, "r1")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
			_, err = runlease.Acquire(t.Context(), s, "r1", "B", five)
			require.NoError(t, err)

			err = a.Write(t.Context(), runlease.Put("ckpt:r1", "late"))
			require.ErrorIs(t, err, runlease.ErrTakenOver)
			require.ErrorIs(t, k.Err(), runlease.ErrTakenOver, "before the keeper's own loop runs")
			require.ErrorIs(t, context.Cause(work), runlease.ErrTakenOver)
			select {
			case <-work.Done():
			default:
				t.Fatal("the work context taken before the loss is still live")
			}
		})
	})

	t.Run("a_call_with_an_ended_keepers_context_returns_the_keepers_cause", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			work := k.Context()
			k.Stop()
			err = l.Write(work, runlease.Put("ckpt:r1", "x"))
			require.ErrorIs(t, err, runlease.ErrKeeperStopped, "not a storage fault a retry loop would spin on")
			assert.NotErrorIs(t, err, runlease.ErrStorage)
			require.ErrorIs(t, l.Renew(work), runlease.ErrKeeperStopped)
		})
	})

	t.Run("stop_and_close_cut_a_hung_batched_renewal_short", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := faultyBubble(t)
			var r runlease.Renewer
			var keepers []*runlease.Keeper
			for _, run := range []string{"r1", "r2", "r3"} {
				l, err := runlease.Acquire(t.Context(), s, run, "A", runlease.WithTTL(time.Hour))
				require.NoError(t, err)
				k, err := r.Keep(t.Context(), l)
				require.NoError(t, err)
				keepers = append(keepers, k)
			}
			s.HangWrites(testkit.Prefix(runlease.LeasePrefix))
			time.Sleep(21 * time.Minute) // the batch is due at 20 min, and hangs
			start := time.Now()
			keepers[0].Stop()
			assert.Zero(t, time.Since(start), "Stop does not wait for the trust deadline, 34 minutes away")
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			err := keepers[0].Release(ctx)
			require.ErrorIs(t, err, context.DeadlineExceeded, "a release on a hung store ends with its context")
			assert.Equal(t, time.Second, time.Since(start))
			r.Close()
			assert.Equal(t, time.Second, time.Since(start), "Close cuts the batch short")
		})
	})
}
