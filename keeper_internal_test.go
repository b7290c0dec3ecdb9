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

	var bad []string
	time.Sleep(100 * time.Millisecond) // hooks run after Done is closed
	for i, k := range ks {
		<-k.Done()
		if !errors.Is(k.Err(), ErrKeeperStopped) || errors.Is(k.Err(), ErrLeaseLost) {
			bad = append(bad, fmt.Sprintf("keeper %d ended with %v", i, k.Err()))
		}
	}
	if n := lostHooks.Load(); n > 0 {
		bad = append(bad, fmt.Sprintf("%d Lost hooks ran", n))
	}
	require.Empty(t, bad, "released by its own driver, the keepers were stopped, not lost")
}

// TestOverlappingReleasesOfOneLeaseEndItsKeepersAsStopped is the same race without any lock held:
// two goroutines release one lease of 300 keepers, each on a Renewer of its
// own, 40 times over. The first Release ends the keepers one by one; the
// second finds none left and releases the row meanwhile; every keeper the
// first ends after that ends with ErrReleased as a loss, and its Lost hook
// runs.
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
