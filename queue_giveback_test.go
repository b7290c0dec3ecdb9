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

// lateStore is a SQLite store whose next admission batch (a batch that
// writes a slot row) is held up for stall, then applies; from then on the
// store hangs every read and delete until the call's context ends, as a
// store that went away just after answering.
type lateStore struct {
	*runlease.SQLiteStore
	mu    sync.Mutex
	stall time.Duration
	hung  bool
	// landed is closed when the stalled admission has applied.
	landed chan struct{}
}

func (s *lateStore) isHung() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hung
}

func (s *lateStore) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return false, testkit.Unknown("MetaBatch")
	}
	admission := false
	for _, op := range ops {
		admission = admission || strings.HasPrefix(op.Key, runlease.SlotPrefix)
	}
	if !admission {
		return s.SQLiteStore.MetaBatch(ctx, conds, ops)
	}
	s.mu.Lock()
	d := s.stall
	s.stall = 0
	s.mu.Unlock()
	time.Sleep(d)
	ok, err := s.SQLiteStore.MetaBatch(context.WithoutCancel(ctx), conds, ops)
	if d > 0 {
		s.mu.Lock()
		s.hung = true
		s.mu.Unlock()
		close(s.landed)
	}
	return ok, err
}

func (s *lateStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return "", false, testkit.Unknown("MetaGet")
	}
	return s.SQLiteStore.MetaGet(ctx, key)
}

func (s *lateStore) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return false, testkit.Unknown("MetaDelete")
	}
	return s.SQLiteStore.MetaDelete(ctx, key, expected)
}

func (s *lateStore) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (bool, error) {
	if s.isHung() {
		<-ctx.Done()
		return false, testkit.Unknown("MetaDeleteNotify")
	}
	return s.SQLiteStore.MetaDeleteNotify(ctx, key, expected, wakeKey)
}

// TestAWaitCancelledWhileGivingBackALateAdmissionReturnsWithinItsBound: the README promises
// that "a wait whose context ends returns within 2 s of it". A queued
// waiter's admission lands after its trust window (cb9f7f8), so the waiter
// gives the slots back with a clean-up context of its own (giveBack, 2 s).
// Its own context ends just after that give-back began, while the store
// hangs. giveBack spends its 2 s, the loop then sees ctx ended and runs the
// wait's clean-up (leave + freePending) with a second, fresh 2 s context:
// the call returns about 4 s after its context ended.
func TestAWaitCancelledWhileGivingBackALateAdmissionReturnsWithinItsBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := &lateStore{SQLiteStore: bubbleStore(t), stall: 6 * time.Second, landed: make(chan struct{})}
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
