package runlease

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTwoReleasesOfOneLeaseFireNoLostHook: two Releases of one lease
// race (a deferred Release and one from elsewhere). The first takes the
// lease's keepers and ends them one by one; the second finds none left,
// releases the row, and records the lease as released (l.lost =
// ErrReleased) before the first has ended every keeper. The keepers the
// first ends after that now end with the release as a loss, and their Lost
// hooks run, for the driver's own release.
//
// The interleaving is forced by holding the keepers' Renewer's lock while
// the second Release lands.
func TestTwoReleasesOfOneLeaseFireNoLostHook(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	l, err := Acquire(ctx, s, "r", "A", WithTTL(time.Minute))
	require.NoError(t, err)
	var lostHooks atomic.Int32
	var r Renewer
	defer r.Close()
	var ks []*Keeper
	for range 2 {
		k, err := r.Keep(ctx, l, KeepInterval(10*time.Second),
			WithHooks(Hooks{Lost: func(LossEvent) { lostHooks.Add(1) }}))
		require.NoError(t, err)
		ks = append(ks, k)
	}

	time.Sleep(100 * time.Millisecond) // the Renewer's loop idles until the keepers are due
	r.mu.Lock()                        // the first Release stops in its first keeper's end
	var wg sync.WaitGroup
	var first error
	wg.Go(func() { first = l.Release(ctx) })
	// Wait until the first Release took the keepers.
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.keepers) == 0
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, l.Release(ctx), "the second Release")
	r.mu.Unlock()
	wg.Wait()
	require.NoError(t, first)

	requireStoppedNotLost(t, ks, &lostHooks)
}

// requireStoppedNotLost waits for every keeper of ks to end and fails t
// unless each ended stopped, not lost, and no Lost hook ran (counted by
// lostHooks; hooks run after Done is closed, so it looks a moment later).
func requireStoppedNotLost(t *testing.T, ks []*Keeper, lostHooks *atomic.Int32) {
	t.Helper()
	var bad []string
	for i, k := range ks {
		<-k.Done()
		if !errors.Is(k.Err(), ErrKeeperStopped) || errors.Is(k.Err(), ErrLeaseLost) {
			bad = append(bad, fmt.Sprintf("keeper %d ended with %v", i, k.Err()))
		}
	}
	time.Sleep(100 * time.Millisecond)
	if n := lostHooks.Load(); n > 0 {
		bad = append(bad, fmt.Sprintf("%d Lost hooks ran", n))
	}
	require.Empty(t, bad, "released by its own driver, the keepers were stopped, not lost")
}

// TestOverlappingReleasesOfOneLeaseEndItsKeepersAsStopped is the same race without any lock held:
// two goroutines release one lease of 300 keepers, each on a Renewer of its
// own, 40 times over. The first Release ends the keepers one by one; the
// second finds none left and releases the row meanwhile. A keeper the first
// has not reached yet must end stopped, whether the first Release ends it
// or it finds the release itself first (its Renewer's loop looking at it
// late on a loaded machine finds the lease released:
// TestAKeeperFindingAnOverlappingReleaseOfItsLeaseEndsStopped forces that).
func TestOverlappingReleasesOfOneLeaseEndItsKeepersAsStopped(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	bad, rounds := 0, 0
	for round := range 40 {
		l, err := Acquire(ctx, s, fmt.Sprintf("r%d", round), "A", WithTTL(time.Minute))
		require.NoError(t, err)
		var rs []*Renewer
		var ks []*Keeper
		for range 300 {
			r := &Renewer{}
			rs = append(rs, r)
			k, err := r.Keep(ctx, l, KeepInterval(10*time.Second))
			require.NoError(t, err)
			ks = append(ks, k)
		}
		time.Sleep(20 * time.Millisecond)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { <-start; _ = l.Release(ctx) })
		}
		close(start)
		wg.Wait()
		rounds++
		for _, k := range ks {
			<-k.Done()
			if errors.Is(k.Err(), ErrLeaseLost) {
				bad++
			}
		}
		for _, r := range rs {
			r.Close()
		}
	}
	require.Zero(t, bad, "keepers ended as lost by their own driver's double release over %d rounds", rounds)
}

// TestAKeeperFindingAnOverlappingReleaseOfItsLeaseEndsStopped: two
// Releases of one lease overlap. The first takes the keepers and ends them
// one by one; the second finds none left, releases the row, and records the
// lease as released (ErrReleased) before the first has reached the second
// keeper, which finds that release first: by a look at it (Err, as its
// Renewer's loop does), or as the answer to a renewal. That is the driver's
// own release, not a loss: the keeper ends with ErrKeeperStopped, and no
// Lost hook runs.
//
// The first Release is held in its end of the first keeper by holding that
// keeper's Renewer's lock; the second keeper has a Renewer of its own.
func TestAKeeperFindingAnOverlappingReleaseOfItsLeaseEndsStopped(t *testing.T) {
	for _, how := range []string{"Err", "renewal"} {
		t.Run(how, func(t *testing.T) {
			s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
			require.NoError(t, err)
			defer s.Close()
			ctx := t.Context()
			l, err := Acquire(ctx, s, "r", "A", WithTTL(time.Minute))
			require.NoError(t, err)
			var lostHooks atomic.Int32
			rs := []*Renewer{{}, {}}
			var ks []*Keeper
			for _, r := range rs {
				defer r.Close()
				k, err := r.Keep(ctx, l, KeepInterval(10*time.Second),
					WithHooks(Hooks{Lost: func(LossEvent) { lostHooks.Add(1) }}))
				require.NoError(t, err)
				ks = append(ks, k)
			}

			time.Sleep(100 * time.Millisecond) // the Renewers' loops idle until the keepers are due
			rs[0].mu.Lock()                    // the first Release stops in its end of the first keeper
			var wg sync.WaitGroup
			var first error
			wg.Go(func() { first = l.Release(ctx) })
			require.Eventually(t, func() bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				return len(l.keepers) == 0
			}, 5*time.Second, time.Millisecond)
			require.NoError(t, l.Release(ctx), "the second Release")
			require.ErrorIs(t, l.Err(), ErrReleased)

			// The second keeper, not reached by the first Release yet,
			// finds its lease released.
			switch how {
			case "Err":
				ks[1].Err()
			case "renewal":
				r := rs[1]
				r.mu.Lock()
				r.startLeaseLocked(ks[1], time.Now(), false)
				j := ks[1].leaseJob
				r.mu.Unlock()
				<-j.done
			}
			rs[0].mu.Unlock()
			wg.Wait()
			require.NoError(t, first)

			requireStoppedNotLost(t, ks, &lostHooks)
		})
	}
}

// TestALossFoundBeforeReleaseStillEndsKeepersAsLost: a takeover found
// before Release was called ends the keepers with the loss, even when the
// lease is released (or Release is called) before the loss has reached
// every keeper: only losses recorded once Release was called are the
// driver's own.
func TestALossFoundBeforeReleaseStillEndsKeepersAsLost(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	l, err := Acquire(ctx, s, "r", "A", WithTTL(time.Minute))
	require.NoError(t, err)
	var r Renewer
	defer r.Close()
	k, err := r.Keep(ctx, l, KeepInterval(10*time.Second))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)

	// Taken over: an operator's release and another holder's acquisition.
	info, err := Peek(ctx, s, "r")
	require.NoError(t, err)
	require.NoError(t, ForceRelease(ctx, s, info))
	_, err = Acquire(ctx, s, "r", "B", WithTTL(time.Minute))
	require.NoError(t, err)

	// The loss is recorded, and the keeper taken from the lease, but not
	// ended yet; Release is called meanwhile, finds no keeper left, and
	// waits for the renewal's write token.
	r.mu.Lock()
	var wg sync.WaitGroup
	var renewErr error
	wg.Go(func() { renewErr = l.Renew(ctx) })
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.lost != nil
	}, 5*time.Second, time.Millisecond)
	var releaseErr error
	wg.Go(func() { releaseErr = l.Release(ctx) })
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.releasing
	}, 5*time.Second, time.Millisecond)
	r.mu.Unlock()
	wg.Wait()
	require.ErrorIs(t, renewErr, ErrTakenOver)
	require.ErrorIs(t, releaseErr, ErrTakenOver)
	<-k.Done()
	require.ErrorIs(t, k.Err(), ErrTakenOver, "lost before Release was called")
}

// TestATakeoverFoundWhileReleasesOverlapEndsTheKeeperAsLost: the lease is
// taken over (an operator's release, then holder B's acquisition) while
// two Releases of it overlap: the first has taken the keepers and is held
// before it ends keeper 1; the second finds none left and is refused with
// the takeover. Keeper 1's own renewal is then told that B holds the
// lease. That is a loss to others, found while the driver released: the
// keeper ends taken over and its Lost hook runs, as it would without the
// overlap.
func TestATakeoverFoundWhileReleasesOverlapEndsTheKeeperAsLost(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	l, err := Acquire(ctx, s, "r", "A", WithTTL(time.Minute))
	require.NoError(t, err)
	var lostHooks atomic.Int32
	rs := []*Renewer{{}, {}}
	var ks []*Keeper
	for _, r := range rs {
		defer r.Close()
		k, err := r.Keep(ctx, l, KeepInterval(10*time.Second),
			WithHooks(Hooks{Lost: func(LossEvent) { lostHooks.Add(1) }}))
		require.NoError(t, err)
		ks = append(ks, k)
	}
	info, err := Peek(ctx, s, "r")
	require.NoError(t, err)
	require.NoError(t, ForceRelease(ctx, s, info))
	_, err = Acquire(ctx, s, "r", "B", WithTTL(time.Minute))
	require.NoError(t, err)

	rs[0].mu.Lock() // the first Release is held before it ends keeper 0
	var wg sync.WaitGroup
	var first error
	wg.Go(func() { first = l.Release(ctx) })
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.keepers) == 0
	}, 5*time.Second, time.Millisecond)
	require.ErrorIs(t, l.Release(ctx), ErrTakenOver, "the second Release")
	r := rs[1] // keeper 1's own renewal finds the takeover
	r.mu.Lock()
	r.startLeaseLocked(ks[1], time.Now(), false)
	j := ks[1].leaseJob
	r.mu.Unlock()
	<-j.done
	rs[0].mu.Unlock()
	wg.Wait()
	require.ErrorIs(t, first, ErrTakenOver, "the first Release")

	<-ks[1].Done()
	require.ErrorIs(t, ks[1].Err(), ErrTakenOver, "keeper 1, whose renewal was told B holds the lease")
	require.Error(t, ks[1].Context().Err(), "its work context is cancelled")
	require.Eventually(t, func() bool { return lostHooks.Load() > 0 }, 5*time.Second, time.Millisecond,
		"a Lost hook runs for a takeover by another holder")
}
