package runlease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFarWaitersAreAllAdmittedSoon: one process's waiters, on a store
// without notifications, with mixed priorities, units, scope sets (a waiter
// in two rooms), cancellations of waiters ahead, a second Store value on
// the same database, and requeues: every waiter that is not cancelled must
// be admitted well before a renewal of its entries (TTL 10 minutes), since
// each one admitted releases at once. Under -short it runs the first 4 of
// its 16 schedules.
func TestFarWaitersAreAllAdmittedSoon(t *testing.T) {
	seeds := uint64(16)
	if testing.Short() {
		seeds = 4
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				raw, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
				require.NoError(t, err)
				t.Cleanup(func() { raw.Close() })
				type quiet struct {
					Store
					Batcher
					RangeReader
				}
				stores := []Store{quiet{raw, raw, raw}, struct {
					Store
					Batcher
				}{raw, raw}}
				rng := rand.New(rand.NewPCG(seed, 7))
				ctx := t.Context()
				gpu, cpu := NamedScope("gpu", 2), NamedScope("cpu", 1)
				h1, err := ClaimSlots(ctx, stores[0], "holder1", []Scope{gpu.Take(2)})
				require.NoError(t, err)
				h2, err := ClaimSlots(ctx, stores[0], "holder2", []Scope{cpu})
				require.NoError(t, err)
				const n = 30
				var admitted atomic.Int32
				runs := n - rng.IntN(6)
				errs := make(chan error, n)
				cancels := make([]context.CancelFunc, n)
				cancelled := 0
				for i := range n {
					var scopes []Scope
					switch rng.IntN(5) {
					case 0:
						scopes = []Scope{gpu, cpu}
					case 1:
						scopes = []Scope{gpu.Take(2)}
					case 2:
						scopes = []Scope{cpu}
					case 3:
						scopes = []Scope{NamedScope("gpu", 3)}
					default:
						scopes = []Scope{gpu}
					}
					st := stores[0]
					if rng.IntN(5) == 0 {
						st = stores[1]
					}
					opts := []Option{WithWaitPoll(MinWaitPoll), WithTTL(10 * time.Minute)}
					if rng.IntN(3) == 0 {
						opts = append(opts, WithPriority(rng.IntN(3)))
					}
					wctx, cancel := context.WithCancel(ctx)
					cancels[i] = cancel
					go func() {
						sl, err := ClaimSlotsWait(wctx, st, fmt.Sprintf("w%d", i%runs), scopes, opts...)
						if err == nil {
							admitted.Add(1)
							err = sl.Release(ctx)
						}
						errs <- err
					}()
					if rng.IntN(3) == 0 {
						synctest.Wait()
					}
				}
				time.Sleep(time.Second)
				synctest.Wait()
				for i := range n {
					if rng.IntN(5) == 0 {
						cancels[i]()
						cancelled++
						synctest.Wait()
					}
				}
				require.NoError(t, h1.Release(ctx))
				time.Sleep(time.Duration(rng.IntN(3)) * time.Second)
				require.NoError(t, h2.Release(ctx))
				time.Sleep(30 * time.Second)
				synctest.Wait()
				ok, failed := 0, 0
				for range n {
					select {
					case err := <-errs:
						if err == nil {
							ok++
						} else {
							failed++
						}
					default:
					}
				}
				for _, c := range cancels {
					c()
				}
				require.Equal(t, n, ok+failed, "waiters still waiting 30s after the holders released (admitted %d, ended %d, cancelled %d)", ok, failed, cancelled)
			})
		})
	}
}
