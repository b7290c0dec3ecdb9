package runlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// These tests pin promises that the planted bugs of internal/mutate showed
// no other test checked.

// requireEnded fails t unless k has ended and its work context, taken
// before, is cancelled. It reads Done and the work context only, never
// Err, which would itself end a keeper whose lease is known lost.
func requireEnded(t *testing.T, k *runlease.Keeper, work context.Context, msg string) {
	t.Helper()
	select {
	case <-k.Done():
	default:
		t.Fatalf("%s: the keeper is still running", msg)
	}
	select {
	case <-work.Done():
	default:
		t.Fatalf("%s: the work context is still live", msg)
	}
}

// TestALossFoundByACallEndsTheKeepersBeforeItReturns checks the bound of
// CONCURRENCY.md: a keeper whose lease is lost by any call ends before that
// call returns, not when its own loop next looks at it.
func TestALossFoundByACallEndsTheKeepersBeforeItReturns(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	for _, call := range []struct {
		name string
		do   func(context.Context, *runlease.Lease) error
	}{
		{"fenced_write", func(ctx context.Context, l *runlease.Lease) error {
			return l.Write(ctx, runlease.Put("ckpt:r1", "late"))
		}},
		{"renew", func(ctx context.Context, l *runlease.Lease) error { return l.Renew(ctx) }},
	} {
		t.Run(call.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := bubbleStore(t)
				a, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
				require.NoError(t, err)
				k, err := runlease.Keep(t.Context(), a)
				require.NoError(t, err)
				work := k.Context()
				// Another driver takes the run between two renewals of A's
				// keeper, after an operator freed it.
				info, err := runlease.Peek(t.Context(), s, "r1")
				require.NoError(t, err)
				require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
				_, err = runlease.Acquire(t.Context(), s, "r1", "B", five)
				require.NoError(t, err)

				require.ErrorIs(t, call.do(t.Context(), a), runlease.ErrTakenOver)
				requireEnded(t, k, work, "once the call that found the loss returned")
				require.ErrorIs(t, context.Cause(work), runlease.ErrTakenOver)
			})
		})
	}
}

// TestReleaseStopsTheKeepersFirst checks that Lease.Release stops the
// lease's keepers before it writes, with ErrKeeperStopped: the run's work
// stops at once, even while the release itself hangs, and a release is
// never reported as a loss.
func TestReleaseStopsTheKeepersFirst(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)

	t.Run("while_the_release_hangs", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &testkit.Faulty{Store: bubbleStore(t)}
			l, err := runlease.Acquire(t.Context(), f, "r1", "A", five)
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			work := k.Context()
			f.HangWrites(testkit.Prefix(runlease.LeasePrefix))
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			released := make(chan error, 1)
			go func() { released <- l.Release(ctx) }()
			synctest.Wait() // the release's write hangs
			requireEnded(t, k, work, "while the release is in flight")
			require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
			require.Error(t, <-released, "the hung release ends with its context")
		})
	})

	t.Run("a_release_that_lands_is_not_a_loss", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleStore(t)
			ev := &events{}
			l, err := runlease.Acquire(t.Context(), s, "r1", "A", five, runlease.WithHooks(ev.hooks()))
			require.NoError(t, err)
			k, err := runlease.Keep(t.Context(), l)
			require.NoError(t, err)
			require.NoError(t, l.Release(t.Context()))
			require.ErrorIs(t, k.Err(), runlease.ErrKeeperStopped)
			require.NotErrorIs(t, k.Err(), runlease.ErrLeaseLost)
			_, _, lost := ev.counts()
			assert.Zero(t, lost, "the Lost hook does not fire for the holder's own release")
		})
	})
}

// uncertainClock is a store whose clock (see runlease.Clock) is the local
// one, read with the given uncertainty.
type uncertainClock struct {
	*runlease.SQLiteStore
	u time.Duration
}

func (c uncertainClock) ClockNow() (time.Time, time.Duration) { return time.Now(), c.u }

// TestKeeperMarginCoversTheStoreClocksUncertainty checks that a keeper
// stops trusting its lease the store clock's uncertainty earlier than the
// margin alone says, for the default margin and for an explicit zero.
func TestKeeperMarginCoversTheStoreClocksUncertainty(t *testing.T) {
	t.Parallel()
	const ttl, u = 10 * time.Second, 2 * time.Second
	for _, c := range []struct {
		name   string
		opts   []runlease.Option
		margin time.Duration
	}{
		{"default_margin", nil, ttl/10 + u},
		{"explicit_zero_margin", []runlease.Option{runlease.KeepMargin(0)}, u},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := uncertainClock{bubbleStore(t), u}
				f := &testkit.Faulty{Store: base}
				start := time.Now()
				l, err := runlease.Acquire(t.Context(), storeWithClock{f, base}, "r1", "A", runlease.WithTTL(ttl))
				require.NoError(t, err)
				k, err := runlease.Keep(t.Context(), l, c.opts...)
				require.NoError(t, err)
				defer k.Stop()
				require.Equal(t, start.Add(ttl-c.margin), k.TrustedUntil())

				// With every renewal failing, the keeper gives up by then.
				f.FailWrites(testkit.Prefix(runlease.LeasePrefix))
				time.Sleep(ttl - c.margin)
				require.ErrorIs(t, k.Err(), runlease.ErrTrustExpired)
			})
		})
	}
}

// storeWithClock is a Faulty store that serves the clock of the store it
// wraps (Faulty alone hides it).
type storeWithClock struct {
	*testkit.Faulty
	c runlease.Clock
}

func (s storeWithClock) ClockNow() (time.Time, time.Duration) { return s.c.ClockNow() }

// TestAClaimOfUnknownOutcomeIsAFaultNotARefusal checks, on a store without
// batches, that a claim whose write has an unknown outcome and did not land
// is reported as the fault it is: not as a full scope, and not as held.
func TestAClaimOfUnknownOutcomeIsAFaultNotARefusal(t *testing.T) {
	t.Parallel()
	f := &testkit.Faulty{Store: newSQLite(t)}
	f.Next(testkit.Fault{Apply: false, Err: testkit.Unknown("MetaCAS")})
	_, err := runlease.ClaimSlots(t.Context(), testkit.PlainStore{Store: f}, "a", []runlease.Scope{runlease.MemScope(1)})
	require.ErrorIs(t, err, runlease.ErrOutcomeUnknown)
	require.NotErrorIs(t, err, runlease.ErrConcurrencyLimit, "the scope is empty: a retry may win it")
	assert.Empty(t, rows(t, f), "nothing landed")
}
