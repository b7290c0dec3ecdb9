package runlease_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// slowSlotWrites is a slowReplies whose batches reply late too. It reports
// on landed the send of every write of slot rows that landed, once its
// reply has come back, and can make the writes of slot rows fail (landing
// nothing) while those of the lease go on landing.
type slowSlotWrites struct {
	*slowReplies
	landed chan time.Time
	fail   atomic.Bool
}

var errSlotWritesFail = errors.New("slot writes fail")

func newSlowSlotWrites(t *testing.T, delay time.Duration) *slowSlotWrites {
	return &slowSlotWrites{slowReplies: &slowReplies{SQLiteStore: bubbleStore(t), delay: delay},
		landed: make(chan time.Time, 16)}
}

func (s *slowSlotWrites) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return s.slotWrite(isSlotKey(key), "MetaCAS", func() (bool, error) {
		return s.slowReplies.MetaCAS(ctx, key, expected, value)
	})
}

func (s *slowSlotWrites) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (bool, error) {
	slot := slices.ContainsFunc(ops, func(op runlease.Op) bool { return isSlotKey(op.Key) })
	return s.slotWrite(slot, "MetaBatch", func() (bool, error) {
		return s.write(ctx, "MetaBatch", func() (bool, error) { return s.SQLiteStore.MetaBatch(ctx, conds, ops) })
	})
}

// slotWrite runs do, a write that reaches slot rows when slot is true.
func (s *slowSlotWrites) slotWrite(slot bool, op string, do func() (bool, error)) (bool, error) {
	if !slot {
		return do()
	}
	if s.fail.Load() {
		return false, &runlease.StorageError{Op: op, Err: errSlotWritesFail, Retryable: true}
	}
	sent := time.Now()
	landed, err := do()
	if landed && err == nil {
		s.landed <- sent
	}
	return landed, err
}

func isSlotKey(key string) bool { return strings.HasPrefix(key, runlease.SlotPrefix) }

// TestSlotTrustStartsWhenTheLastWriteWasSent proves for slots what
// TestKeeperTrustStartsWhenTheLastWriteWasSent proves for a lease: a slot's
// trust window is "last renewal that landed + TTL − TTL/10" (README,
// Slots) counted from the send of the claim or renewal, because its row is
// stamped from a reading taken as the write is sent; a reply that comes
// back late must not move the start later. The clock that judges expiry
// stands still or lags, so that the second bound (the row's until_ms less
// the margin, by that clock) lies later and cannot hide a window counted
// from the reply.
//
// Each case claims through one of the paths a claim takes, checks
// Slots.TrustedUntil after the claim and after the keeper's first renewal
// of the slots, then makes every write of slot rows fail while the lease
// goes on renewing: the first slot renewed is given up exactly at its
// renewal's send + TTL − margin, reported to SlotsLost by a KeepSlots
// keeper, and ending a KeepSlotsStrict keeper, whose TrustedUntil is the
// slots' until then.
func TestSlotTrustStartsWhenTheLastWriteWasSent(t *testing.T) {
	t.Parallel()
	const delay = time.Second // each reply's lateness
	const trust = runlease.MinTTL - runlease.MinTTL/10
	claims := []struct {
		name  string
		claim func(ctx context.Context, s runlease.Store, l *runlease.Lease, opts []runlease.Option) (*runlease.Slots, error)
	}{
		{"a_claim_of_one_scope", func(ctx context.Context, s runlease.Store, l *runlease.Lease, opts []runlease.Option) (*runlease.Slots, error) {
			return runlease.ClaimSlots(ctx, s, l.RunID(), []runlease.Scope{runlease.MemScope(2)}, opts...)
		}},
		{"a_batched_claim_of_two_scopes", func(ctx context.Context, s runlease.Store, l *runlease.Lease, opts []runlease.Option) (*runlease.Slots, error) {
			return runlease.ClaimSlots(ctx, s, l.RunID(), []runlease.Scope{runlease.MemScope(2), runlease.PrincipalScope("p", 2)}, opts...)
		}},
		{"a_claim_fenced_by_the_lease", func(ctx context.Context, _ runlease.Store, l *runlease.Lease, _ []runlease.Option) (*runlease.Slots, error) {
			return l.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(2)})
		}},
		{"a_claim_admitted_from_the_queue", func(ctx context.Context, _ runlease.Store, l *runlease.Lease, _ []runlease.Option) (*runlease.Slots, error) {
			return l.ClaimSlotsWait(ctx, []runlease.Scope{runlease.MemScope(2)})
		}},
	}
	keeps := []struct {
		name   string
		keep   func(*runlease.Slots) runlease.Option
		strict bool
	}{
		{"kept", runlease.KeepSlots, false},
		{"kept_strictly", runlease.KeepSlotsStrict, true},
	}
	clocks := []struct {
		name  string
		clock func(start time.Time) func() time.Time
	}{
		{"with_an_expiry_clock_that_stands_still", stillClock},
		{"with_an_expiry_clock_that_lags", laggingClock},
	}
	for _, c := range claims {
		for _, kp := range keeps {
			for _, clk := range clocks {
				t.Run(c.name+"/"+kp.name+"/"+clk.name, func(t *testing.T) {
					t.Parallel()
					synctest.Test(t, func(t *testing.T) {
						ctx := t.Context()
						s := newSlowSlotWrites(t, delay)
						opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.clock(time.Now()))}
						l, err := runlease.Acquire(ctx, s, "r1", "A", opts...)
						require.NoError(t, err)

						slots, err := c.claim(ctx, s, l, opts)
						require.NoError(t, err)
						sent := <-s.landed
						require.Equal(t, sent.Add(delay), time.Now(), "the claim's reply came late")
						units := len(slots.Held())
						require.NotZero(t, units)
						assert.Equal(t, sent.Add(trust), slots.TrustedUntil(), "trusted from the claim's send")

						lost := make(chan runlease.SlotLossEvent, 1)
						r := &runlease.Renewer{}
						defer r.Close()
						k, err := r.Keep(ctx, l, kp.keep(slots),
							runlease.WithHooks(runlease.Hooks{SlotsLost: func(e runlease.SlotLossEvent) { lost <- e }}))
						require.NoError(t, err)

						// The keeper's first renewal of the slots, right after
						// the lease's, one slot after another: once it has
						// recorded its outcome, the first window to end is
						// that of the first slot, counted from its send.
						sent = <-s.landed
						last := sent
						for range units - 1 {
							last = <-s.landed
						}
						synctest.Wait()
						require.Equal(t, last.Add(delay), time.Now(), "the renewal's replies came late")
						assert.Equal(t, sent.Add(trust), slots.TrustedUntil(), "trusted from the renewal's send")

						// No write of the slots lands any more; the lease's
						// do, so the first slot's own window is the one that
						// ends.
						s.fail.Store(true)
						time.Sleep(time.Until(sent.Add(trust)) - time.Millisecond)
						require.Len(t, slots.Held(), units, "trusted until a millisecond before the end")
						assert.Equal(t, sent.Add(trust), slots.TrustedUntil())
						if kp.strict {
							assert.Equal(t, sent.Add(trust), k.TrustedUntil(), "a strict keeper trusts no longer than its slots")
						}
						require.NoError(t, k.Err())
						time.Sleep(time.Millisecond)
						synctest.Wait()

						if kp.strict {
							select {
							case <-k.Done():
							default:
								t.Fatalf("the strict keeper still trusts its slots at the renewal's send + TTL - margin")
							}
							require.ErrorIs(t, k.Err(), runlease.ErrSlotLost)
							require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
							require.ErrorIs(t, context.Cause(k.Context()), runlease.ErrTrustExpired)
						} else {
							select {
							case e := <-lost:
								require.ErrorIs(t, e.Err, runlease.ErrTrustExpired)
							default:
								t.Fatalf("no slot loss reported at the renewal's send + TTL - margin")
							}
							require.NoError(t, k.Err(), "the lease, still renewed, is the authority")
						}
						assert.Len(t, slots.Held(), units-1, "the first slot is not trusted at its renewal's send + TTL - margin")
					})
				})
			}
		}
	}
}
