package runlease_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// stallingStore is a SQLite store whose batches that take a slot (a
// waiter's admission) are held up, as in a stalled server or network: for
// a while before they apply, or, hung, until their context ends, when they
// apply and report an unknown outcome. When hung, its reads and deletes
// also wait for their context to end. With hangAfter, it hangs from the
// moment the stalled admission has landed (closing landed), as a store that
// went away just after answering.
type stallingStore struct {
	*runlease.SQLiteStore
	mu        sync.Mutex
	stall     time.Duration // the next admission waits this long, then applies
	hung      bool
	hangAfter bool
	landed    chan struct{} // with hangAfter: closed once the stalled admission applied
}

func (s *stallingStore) isHung() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hung
}

func (s *stallingStore) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	admission := false
	for _, op := range ops {
		admission = admission || strings.HasPrefix(op.Key, runlease.SlotPrefix)
	}
	if admission {
		s.mu.Lock()
		d, hung := s.stall, s.hung
		s.stall = 0
		s.mu.Unlock()
		if hung {
			<-ctx.Done()
			_, _ = s.SQLiteStore.MetaBatch(context.WithoutCancel(ctx), conds, ops)
			return false, testkit.Unknown("MetaBatch")
		}
		time.Sleep(d)
		if d > 0 && s.hangAfter {
			ok, err := s.SQLiteStore.MetaBatch(context.WithoutCancel(ctx), conds, ops)
			s.mu.Lock()
			s.hung = true
			s.mu.Unlock()
			close(s.landed)
			return ok, err
		}
	}
	return s.SQLiteStore.MetaBatch(ctx, conds, ops)
}

func (s *stallingStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return "", false, testkit.Unknown("MetaGet")
	}
	return s.SQLiteStore.MetaGet(ctx, key)
}

func (s *stallingStore) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return false, testkit.Unknown("MetaDelete")
	}
	return s.SQLiteStore.MetaDelete(ctx, key, expected)
}

func (s *stallingStore) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return false, testkit.Unknown("MetaDeleteNotify")
	}
	return s.SQLiteStore.MetaDeleteNotify(ctx, key, expected, wakeKey)
}

// TestAnAdmissionConfirmedAfterItsTrustWindowIsGivenBack: a waiter's
// admission stamps its slot rows from the start of the attempt, so one that
// lands, or is confirmed, a TTL less the margin later can no longer be
// trusted (its rows are expiring or gone). The waiter gives the slots back,
// is told it lost its place, and queues again, instead of returning a claim
// that Held() shows empty.
func TestAnAdmissionConfirmedAfterItsTrustWindowIsGivenBack(t *testing.T) {
	t.Parallel()
	for _, stall := range []time.Duration{4800 * time.Millisecond, 6 * time.Second} { // rows live, and expired, at landing
		t.Run(stall.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &stallingStore{SQLiteStore: bubbleStore(t), stall: stall}
				requeued := make(chan runlease.RequeueEvent, 4)
				start := time.Now()
				sl, err := runlease.ClaimSlotsWait(t.Context(), s, "a", []runlease.Scope{runlease.MemScope(1)},
					runlease.WithTTL(5*time.Second),
					runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(e runlease.RequeueEvent) { requeued <- e }}))
				require.NoError(t, err)
				require.Len(t, sl.Held(), 1, "admitted, with a trust window of its own")
				assert.Equal(t, time.Now().Add(5*time.Second-500*time.Millisecond), sl.TrustedUntil(),
					"the trust window of the second admission, which was not held up")
				assert.Equal(t, start.Add(stall), time.Now(), "admitted at once after the stalled batch")
				require.Len(t, requeued, 1, "the waiter is told its first admission came too late")
				e := <-requeued
				assert.Contains(t, e.Reason, "trust window")
				// One slot row, the one it holds.
				live, err := runlease.Occupancy(t.Context(), s)
				require.NoError(t, err)
				require.Len(t, live, 1)
				assert.Equal(t, sl.Held()[0].Key, live[0].Key)
				require.NoError(t, sl.Release(t.Context()))
			})
		})
	}
}

// TestAWaitWhoseAdmissionHungReturnsWithinItsBound: a queued wait whose
// context ends while its admission is in doubt takes its entries out and
// frees the slots that admission may have taken within one leaveTimeout
// (2 s) of the end of its context, however long the store takes to answer.
func TestAWaitWhoseAdmissionHungReturnsWithinItsBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := &stallingStore{SQLiteStore: bubbleStore(t), hung: true}
		mem := []runlease.Scope{runlease.MemScope(1)}
		// Run x holds the slot, through the store itself: its release is
		// not held up, and wakes the waiter.
		x, err := runlease.ClaimSlots(t.Context(), s.SQLiteStore, "x", mem, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		deadline, _ := ctx.Deadline()
		done := make(chan error, 1)
		go func() {
			_, err := runlease.ClaimSlotsWait(ctx, s, "a", mem, runlease.WithTTL(5*time.Second))
			done <- err
		}()
		time.Sleep(time.Second)
		require.Len(t, queueRows(t, s.SQLiteStore), 1, "the waiter is queued")
		require.NoError(t, x.Release(t.Context()))
		err = <-done
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, context.DeadlineExceeded, err, "ctx.Err() itself")
		assert.LessOrEqual(t, time.Since(deadline), 2*time.Second, "returned within leaveTimeout of the end of its context")
	})
}

// TestAWaitCancelledWhileGivingBackALateAdmissionReturnsWithinItsBound: a
// queued waiter's admission lands after its trust window, so the waiter
// gives the slots back; its context ends just after the give-back began,
// while the store hangs from then on. The give-back and the wait's clean-up
// share one bound: the call returns within 2 s of the end of its context.
func TestAWaitCancelledWhileGivingBackALateAdmissionReturnsWithinItsBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := &stallingStore{SQLiteStore: bubbleStore(t), stall: 6 * time.Second, hangAfter: true, landed: make(chan struct{})}
		mem := []runlease.Scope{runlease.MemScope(1)}
		// x holds the only slot: the waiter queues (writes its entry).
		x, err := runlease.ClaimSlots(t.Context(), s.SQLiteStore, "x", mem, runlease.WithTTL(time.Hour))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := runlease.ClaimSlotsWait(ctx, s, "a", mem, runlease.WithTTL(5*time.Second))
			done <- err
		}()
		time.Sleep(time.Second)
		require.Len(t, queueRows(t, s.SQLiteStore), 1, "the waiter is queued")
		require.NoError(t, x.Release(t.Context())) // wakes the waiter: its admission stalls 6 s
		<-s.landed                                 // landed past the trust window (4.5 s): giveBack begins
		time.Sleep(time.Millisecond)
		cancel()
		ended := time.Now()
		err = <-done
		assert.Equal(t, context.Canceled, err, "ctx.Err() itself")
		assert.LessOrEqual(t, time.Since(ended), 2*time.Second,
			"ClaimSlotsWait returned %v after its context ended; README: within 2 s", time.Since(ended))
	})
}
