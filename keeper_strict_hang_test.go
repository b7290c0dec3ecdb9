package runlease_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// slowSlotStore passes every call through, but once armed, a CAS of a
// slot row (a slot renewal) is held up until released, whatever its
// context says: a store slow to honour a cancellation (a connection
// blackholed mid-statement).
type slowSlotStore struct {
	*runlease.SQLiteStore
	mu      sync.Mutex
	armed   bool
	release chan struct{}
}

func (s *slowSlotStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	s.mu.Lock()
	armed := s.armed
	s.mu.Unlock()
	if armed && strings.HasPrefix(key, runlease.SlotPrefix) {
		<-s.release
	}
	return s.SQLiteStore.MetaCAS(ctx, key, expected, value)
}

// TestAStrictKeeperEndsWhenItsSlotsTrustEndsWhileASlotRenewalHangs: the
// README promises that a slot kept with KeepSlotsStrict that is "not renewed
// within its trust window also ends the keeper ... whose work context is
// cancelled with it, before any other run can take the slot by expiry", and
// CONCURRENCY.md that the loop wakes at the trust deadline "whatever
// renewals are in flight". While a slot renewal is in flight, dueLocked
// (renewer.go, `if k.ks != nil && k.ks.job == nil`) no longer bounds the
// keeper's next look by the slots' trust end: only the lease's schedule
// wakes it. Here the lease (renewed after the claim) keeps renewing fine,
// the slot renewal hangs: the slot's row expires, run b takes the slot, and
// run a's strict keeper's work context is still live.
func TestAStrictKeeperEndsWhenItsSlotsTrustEndsWhileASlotRenewalHangs(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := &slowSlotStore{SQLiteStore: bubbleStore(t), release: make(chan struct{})}
		five := runlease.WithTTL(5 * time.Second)
		mem := []runlease.Scope{runlease.MemScope(1)}
		l, err := runlease.Acquire(t.Context(), s, "a", "A", five)
		require.NoError(t, err)
		sl, err := runlease.ClaimSlots(t.Context(), s, "a", mem, five)
		require.NoError(t, err)
		claimed := time.Now()
		time.Sleep(time.Second)
		require.NoError(t, l.Renew(t.Context())) // the lease is a second younger than the claim
		s.mu.Lock()
		s.armed = true
		s.mu.Unlock()
		k, err := runlease.Keep(t.Context(), l, runlease.KeepSlotsStrict(sl))
		require.NoError(t, err)
		defer func() { close(s.release); k.Stop() }()
		work := k.Context()

		// The slot's row expires 5 s after the claim; run b may take it then.
		time.Sleep(claimed.Add(5*time.Second + time.Millisecond).Sub(time.Now()))
		b, err := runlease.ClaimSlots(t.Context(), s.SQLiteStore, "b", mem, five)
		require.NoError(t, err, "the slot's row has expired: run b takes it")
		require.Len(t, b.Held(), 1)
		synctest.Wait()
		require.Error(t, work.Err(),
			"run b holds the slot (since %v after the claim), yet run a's strict keeper's work context is live; k.TrustedUntil() = claim + %v",
			time.Since(claimed), k.TrustedUntil().Sub(claimed))
	})
}
