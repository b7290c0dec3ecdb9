package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// memberHangStore renews many leases at once, passing batches through to
// the store it wraps, while every single-key call on one key hangs once
// armed: a member of a batched renewal that the batch refused then hangs
// in its own resolution (the compare-and-swap and read-back it makes
// alone), while the batched call itself goes through.
type memberHangStore struct {
	runlease.Store // a runlease.MultiCASer
	key            string
	armed          atomic.Bool
	// deaf, when not nil, makes a hung call ignore its context and return
	// only once deaf is closed, as a store whose driver does not watch the
	// context does; otherwise a hung call returns when its context ends.
	deaf chan struct{}
	hung atomic.Int32 // calls hanging now
}

func (s *memberHangStore) hang(ctx context.Context, op, key string) error {
	if key != s.key || !s.armed.Load() {
		return nil
	}
	s.hung.Add(1)
	defer s.hung.Add(-1)
	if s.deaf != nil {
		<-s.deaf
	} else {
		<-ctx.Done()
	}
	return &runlease.StorageError{Op: op, Key: key, Unknown: true, Err: context.DeadlineExceeded}
}

func (s *memberHangStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if err := s.hang(ctx, "MetaGet", key); err != nil {
		return "", false, err
	}
	return s.Store.MetaGet(ctx, key)
}

func (s *memberHangStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	if err := s.hang(ctx, "MetaCAS", key); err != nil {
		return false, err
	}
	return s.Store.MetaCAS(ctx, key, expected, value)
}

func (s *memberHangStore) MetaCASMany(ctx context.Context, writes []runlease.CASWrite) ([]bool, error) {
	return s.Store.(runlease.MultiCASer).MetaCASMany(ctx, writes)
}

// batchWithHungMember keeps leases of runs "a" and "b" on one Renewer, so
// that they renew in one batch, after an operator released a's row behind
// its back: the batch refuses a's write, and a's resolution (its own
// compare-and-swap) hangs on s, while b's write lands. b is acquired first,
// so its trust window ends first and bounds the batch. It returns when b's
// renewal has landed, with a's resolution hanging.
func batchWithHungMember(t *testing.T, s *memberHangStore, raw runlease.Store) (r *runlease.Renewer, a, b *runlease.Lease, ka, kb *runlease.Keeper) {
	t.Helper()
	ctx := t.Context()
	ttl := runlease.WithTTL(5 * time.Second)
	b, err := runlease.Acquire(ctx, s, "b", "B", ttl)
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	a, err = runlease.Acquire(ctx, s, "a", "A", ttl)
	require.NoError(t, err)
	r = &runlease.Renewer{}
	// Kept in this order, a comes before b in the batch: a member resolved
	// one after another would hold b up.
	ka, err = r.Keep(ctx, a, runlease.KeepInterval(time.Second))
	require.NoError(t, err)
	kb, err = r.Keep(ctx, b, runlease.KeepInterval(time.Second))
	require.NoError(t, err)
	info, err := runlease.Peek(ctx, raw, "a")
	require.NoError(t, err)
	require.NoError(t, runlease.ForceRelease(ctx, raw, info))
	s.armed.Store(true)

	before, err := runlease.Peek(ctx, raw, "b")
	require.NoError(t, err)
	for s.hung.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	synctest.Wait()
	after, err := runlease.Peek(ctx, raw, "b")
	require.NoError(t, err)
	require.True(t, after.Until.After(before.Until), "b's batched renewal landed")
	return r, a, b, ka, kb
}

// TestRenewerBatchMemberHangs holds the promises of a batched renewal one of
// whose members hangs while it is resolved on its own: every other member's
// outcome is its own, known and recorded, and its write token given back,
// as soon as the batched call returns.
func TestRenewerBatchMemberHangs(t *testing.T) {
	t.Parallel()

	t.Run("a_member_whose_renewal_landed_can_be_released_at_once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			raw := bubbleStore(t)
			s := &memberHangStore{Store: raw, key: runlease.LeasePrefix + "a"}
			r, _, b, ka, kb := batchWithHungMember(t, s, raw)
			defer r.Close()
			defer ka.Stop()
			defer kb.Stop()

			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			require.NoError(t, b.Release(ctx), "b's release waits for no other lease's write")
			info, err := runlease.Peek(t.Context(), raw, "b")
			require.NoError(t, err)
			assert.Empty(t, info.Holder, "b is released")
		})
	})

	t.Run("a_member_whose_renewal_landed_keeps_its_trust", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			raw := bubbleStore(t)
			// a's resolution ignores its context: it outlasts b's trust
			// window as it stood before the batch.
			s := &memberHangStore{Store: raw, key: runlease.LeasePrefix + "a", deaf: make(chan struct{})}
			r, _, _, ka, kb := batchWithHungMember(t, s, raw)
			defer r.Close()
			defer ka.Stop()
			defer kb.Stop()
			defer close(s.deaf) // before the keepers stop and the Renewer closes

			trusted := kb.TrustedUntil()
			time.Sleep(10 * time.Second)
			synctest.Wait()
			require.Equal(t, int32(1), s.hung.Load(), "a's resolution still hangs")
			require.NoError(t, kb.Err(), "b's keeper trusts its landed renewals")
			require.NoError(t, kb.Context().Err())
			assert.True(t, kb.TrustedUntil().After(trusted.Add(5*time.Second)), "b's trust window moved on")
		})
	})

	t.Run("a_batch_waiting_for_a_place_in_flight_holds_no_lease", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			raw := bubbleStore(t)
			ctx := t.Context()
			ttl := runlease.WithTTL(5 * time.Second)
			every := runlease.KeepInterval(time.Second)
			// As many single renewals as the Renewer runs at once, all
			// hanging, on a store that renews one lease at a time.
			hanging := testkit.PlainStore{Store: &testkit.Faulty{Store: raw}}
			var r runlease.Renewer
			defer r.Close()
			var keepers []*runlease.Keeper
			for i := range 64 {
				l, err := runlease.Acquire(ctx, hanging, fmt.Sprintf("h%d", i), "H", ttl)
				require.NoError(t, err)
				k, err := r.Keep(ctx, l, every)
				require.NoError(t, err)
				keepers = append(keepers, k)
			}
			hanging.Store.(*testkit.Faulty).HangWrites(testkit.Prefix(runlease.LeasePrefix + "h"))
			time.Sleep(500 * time.Millisecond)
			var leases []*runlease.Lease
			for _, run := range []string{"b", "c"} {
				l, err := runlease.Acquire(ctx, raw, run, "B", ttl)
				require.NoError(t, err)
				k, err := r.Keep(ctx, l, every)
				require.NoError(t, err)
				keepers = append(keepers, k)
				leases = append(leases, l)
			}
			// b and c are due at 1.5 s, in one batch, which waits for a
			// place among the renewals in flight.
			time.Sleep(1500 * time.Millisecond)
			synctest.Wait()
			rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			require.NoError(t, leases[0].Release(rctx), "b's release waits for no place in flight")

			var wg sync.WaitGroup
			for _, k := range keepers {
				wg.Go(k.Stop)
			}
			wg.Wait()
		})
	})
}

// TestRenewerBatchHookHangs holds rule 2 of CONCURRENCY.md for the hooks of
// a batched renewal: a keeper's hook may call its own lease (README,
// Observability), and when that call hangs on the store, it delays only
// that lease. The other members of the batch go on renewing and keep their
// trust.
func TestRenewerBatchHookHangs(t *testing.T) {
	t.Parallel()

	t.Run("a_hung_Renew_in_one_members_Renewed_hook_leaves_the_others_renewing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			raw := bubbleStore(t)
			ctx := t.Context()
			// Calls of a's key alone hang, ignoring their context, until
			// deaf is closed; batched renewals go through.
			s := &memberHangStore{Store: raw, key: runlease.LeasePrefix + "a", deaf: make(chan struct{})}
			ttl := runlease.WithTTL(5 * time.Second)
			every := runlease.KeepInterval(time.Second)
			a, err := runlease.Acquire(ctx, s, "a", "A", ttl)
			require.NoError(t, err)
			b, err := runlease.Acquire(ctx, s, "b", "B", ttl)
			require.NoError(t, err)

			var r runlease.Renewer
			var once atomic.Bool
			// a's driver renews once more from its hook, as a driver may;
			// that write of a hangs.
			hooks := runlease.Hooks{Renewed: func(ev runlease.RenewEvent) {
				if ev.Err == nil && once.CompareAndSwap(false, true) {
					s.armed.Store(true)
					_ = a.Renew(context.Background())
				}
			}}
			ka, err := r.Keep(ctx, a, every, runlease.WithHooks(hooks))
			require.NoError(t, err)
			kb, err := r.Keep(ctx, b, every)
			require.NoError(t, err)
			defer r.Close()
			defer ka.Stop()
			defer kb.Stop()
			defer close(s.deaf) // before the keepers stop and the Renewer closes

			trusted := kb.TrustedUntil()
			time.Sleep(10 * time.Second)
			synctest.Wait()
			require.Equal(t, int32(1), s.hung.Load(), "a's Renew from its hook still hangs")
			require.NoError(t, kb.Err(), "b's keeper renews on, whatever a's hook waits for")
			assert.True(t, kb.TrustedUntil().After(trusted.Add(5*time.Second)), "b's trust window moved on")
			info, err := runlease.Peek(ctx, raw, "b")
			require.NoError(t, err)
			assert.True(t, info.Until.After(time.Now().Add(3*time.Second)), "b's row is renewed")
		})
	})
}

// TestRenewerBatchesOneLeaseOfARun: a holder re-enters its run (X at fence
// 1, L at fence 2, both kept on one shared Renewer, as re-entry allows),
// and another holder's lease of r2 is kept there too. All come due at
// once. A batch holds one write per key, so X goes alone: had both gone
// into one MetaCASMany, the store would refuse the whole batch (two writes
// of one key), failing L's and r2's renewals on a healthy store and never
// telling X it is superseded.
func TestRenewerBatchesOneLeaseOfARun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		s := bubbleStore(t)
		var mu sync.Mutex
		var errs []error
		renewed := map[string]int{}
		hooks := runlease.WithHooks(runlease.Hooks{Renewed: func(ev runlease.RenewEvent) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case ev.Err == nil:
				renewed[ev.RunID+"@"+strconv.FormatUint(ev.Fence, 10)]++
			case ev.RunID == "r1" && ev.Fence == 1 && errors.Is(ev.Err, runlease.ErrTakenOver):
				// X, superseded by L: told so
			default:
				t.Logf("renewal of %s fence %d: %v", ev.RunID, ev.Fence, ev.Err)
				errs = append(errs, ev.Err)
			}
		}})
		x, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithTTL(runlease.MinTTL), hooks)
		require.NoError(t, err)
		l, err := runlease.Acquire(ctx, s, "r1", "A", runlease.WithTTL(runlease.MinTTL), hooks)
		require.NoError(t, err)
		other, err := runlease.Acquire(ctx, s, "r2", "B", runlease.WithTTL(runlease.MinTTL), hooks)
		require.NoError(t, err)
		var r runlease.Renewer
		defer r.Close()
		kx, err := r.Keep(ctx, x, runlease.KeepInterval(time.Second))
		require.NoError(t, err)
		defer kx.Stop()
		kl, err := r.Keep(ctx, l, runlease.KeepInterval(time.Second))
		require.NoError(t, err)
		defer kl.Stop()
		ko, err := r.Keep(ctx, other, runlease.KeepInterval(time.Second))
		require.NoError(t, err)
		defer ko.Stop()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, errs, "renewals on a healthy store failed")
		require.ErrorIs(t, kx.Err(), runlease.ErrTakenOver, "X is told it is superseded")
		require.NoError(t, kl.Err())
		require.NoError(t, ko.Err())
		require.Positive(t, renewed["r1@2"], "L renewed")
		require.Positive(t, renewed["r2@1"], "r2 renewed")
	})
}
