package runlease

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScheduleMatchesASortedList drives a schedule with random adds,
// removals, moves to "at once" and takes of what is due, and checks each
// take against a plain list of (keeper, instant): the keepers due by now,
// earliest instant first, those to look at at once before all.
func TestScheduleMatchesASortedList(t *testing.T) {
	t.Parallel()
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var s schedule
		model := map[*Keeper]time.Time{} // queued keepers; zero: at once
		base := time.Now()
		now := base
		var idle, every []*Keeper
		for range 40 {
			idle = append(idle, &Keeper{index: -1})
		}
		every = slices.Clone(idle)
		for step := range 400 {
			switch op := rng.IntN(10); {
			case op < 4 && len(idle) > 0: // add, on one of a few instants or its own
				k := idle[len(idle)-1]
				idle = idle[:len(idle)-1]
				if rng.IntN(5) == 0 {
					s.addSoon(k)
					model[k] = time.Time{}
					break
				}
				at := base.Add(time.Duration(rng.IntN(8)) * 100 * time.Millisecond)
				if rng.IntN(3) == 0 {
					at = now.Add(time.Duration(rng.IntN(1_000_000)) * time.Microsecond)
				}
				s.add(k, at)
				model[k] = at
			case op < 6 && len(model) > 0: // remove or move one queued
				k := every[rng.IntN(len(every))]
				for _, queued := model[k]; !queued; _, queued = model[k] {
					k = every[rng.IntN(len(every))]
				}
				if rng.IntN(2) == 0 {
					s.remove(k)
					delete(model, k)
					idle = append(idle, k)
				} else {
					s.moveSoon(k)
					model[k] = time.Time{}
				}
			case op < 8: // time passes
				now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
			default: // the loop takes what is due, bucket by bucket
				for due := s.takeDue(now); due != nil; due = s.takeDue(now) {
					at := model[due[0]]
					var want []*Keeper
					for k, kat := range model {
						if kat.Equal(at) {
							want = append(want, k)
						}
					}
					require.ElementsMatch(t, want, due, "seed %d step %d: a bucket holds the keepers of one instant", seed, step)
					for _, kat := range model {
						require.False(t, kat.Before(at), "seed %d step %d: a keeper due at %v was left behind one due at %v", seed, step, kat, at)
					}
					require.False(t, at.After(now), "seed %d step %d: taken before it was due", seed, step)
					for _, k := range due {
						require.Nil(t, k.bucket)
						require.Equal(t, -1, k.index)
						delete(model, k)
						idle = append(idle, k)
					}
				}
				for _, at := range model {
					require.True(t, at.After(now), "seed %d step %d: a keeper due by now was not taken", seed, step)
				}
			}
			require.Equal(t, len(model), s.len(), "seed %d step %d", seed, step)
			require.ElementsMatch(t, queuedKeepers(model), s.all(), "seed %d step %d", seed, step)
			if first, ok := s.first(); ok {
				least := slices.MinFunc(queuedTimes(model), func(a, b time.Time) int { return a.Compare(b) })
				require.True(t, first.Equal(least), "seed %d step %d: first %v, earliest queued %v", seed, step, first, least)
			}
			require.LessOrEqual(t, len(s.keys), 2*len(s.buckets)+65, "seed %d step %d: keys of emptied buckets pile up", seed, step)
		}
	}
}

// TestScheduleKeepsFewKeysForKeepersThatComeAndGo: a keeper that leaves its
// bucket before its instant leaves a key behind in the heap; tidy bounds
// how many pile up.
func TestScheduleKeepsFewKeysForKeepersThatComeAndGo(t *testing.T) {
	t.Parallel()
	var s schedule
	base := time.Now()
	k := &Keeper{index: -1}
	for i := range 100_000 {
		s.add(k, base.Add(time.Hour+time.Duration(i)))
		s.remove(k)
	}
	require.Zero(t, s.len())
	require.LessOrEqual(t, len(s.keys), 64+1)
	_, ok := s.first()
	require.False(t, ok)
}

func queuedKeepers(m map[*Keeper]time.Time) []*Keeper {
	out := make([]*Keeper, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func queuedTimes(m map[*Keeper]time.Time) []time.Time {
	out := make([]time.Time, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// blockingHandler is a slog handler whose Warn records block until release
// is closed.
type blockingHandler struct {
	entered atomic.Int32
	release chan struct{}
}

func (h *blockingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *blockingHandler) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level == slog.LevelWarn {
		h.entered.Add(1)
		<-h.release
	}
	return nil
}

func (h *blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *blockingHandler) WithGroup(string) slog.Handler { return h }

// TestRenewerCloseWaitsForItsGoroutineReportingALossWithoutAHook: a lease's
// loss found by a Renewer's renewal is reported at unlock, on the renewal's
// goroutine: the keeper's end is logged (slowly, here), then its Lost hook
// runs. While the logger runs no hook does, and Close, called meanwhile
// from another goroutine, must return only once its goroutines have
// exited, as its godoc says: no hook of its keepers runs after it.
func TestRenewerCloseWaitsForItsGoroutineReportingALossWithoutAHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		raw, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
		require.NoError(t, err)
		t.Cleanup(func() { raw.Close() })
		ctx := t.Context()
		l, err := Acquire(ctx, raw, "r", "A", WithTTL(5*time.Second))
		require.NoError(t, err)
		h := &blockingHandler{release: make(chan struct{})}
		var r Renewer
		var closed, hookAfterClose atomic.Bool
		lost := WithHooks(Hooks{Lost: func(LossEvent) { hookAfterClose.Store(closed.Load()) }})
		_, err = r.Keep(ctx, l, KeepInterval(time.Second), WithLogger(slog.New(h)), lost)
		require.NoError(t, err)

		info, err := Peek(ctx, raw, "r")
		require.NoError(t, err)
		require.NoError(t, ForceRelease(ctx, raw, info))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Equal(t, int32(1), h.entered.Load(), "the renewal logs the loss")

		go func() {
			r.Close()
			closed.Store(true)
		}()
		synctest.Wait()
		returnedEarly := closed.Load()
		close(h.release)
		synctest.Wait()
		require.True(t, closed.Load())
		require.False(t, returnedEarly, "Close returned while the Renewer's renewal goroutine was still running (logging the loss), with no hook running; the keeper's Lost hook then ran after Close returned: %v", hookAfterClose.Load())
	})
}
