package runlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// TestKeeperTrustedUntilEndsWithTheKeeper: a driver that uses
// Keeper.TrustedUntil as the deadline of its side effects must see no trust
// left (a moment that has passed, as Slots.TrustedUntil reports after a
// loss) once the lease is known lost or the keeper has ended, however it
// ended; while the keeper runs, it is in the future.
func TestKeeperTrustedUntilEndsWithTheKeeper(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	cases := []struct {
		name string
		end  func(t *testing.T, s runlease.Store, k *runlease.Keeper)
		// lost: the keeper ends with the lease's loss (RUN-E021).
		lost bool
	}{{
		name: "released_by_an_operator_found_by_Renew",
		lost: true,
		end: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			info, err := runlease.Peek(t.Context(), s, "r1")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
			require.ErrorIs(t, k.Lease().Renew(t.Context()), runlease.ErrReleased)
		},
	}, {
		name: "released_by_an_operator_found_by_the_keepers_renewal",
		lost: true,
		end: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			info, err := runlease.Peek(t.Context(), s, "r1")
			require.NoError(t, err)
			require.NoError(t, runlease.ForceRelease(t.Context(), s, info))
			<-k.Done()
		},
	}, {
		name: "taken_over_found_by_the_keepers_renewal",
		lost: true,
		end: func(t *testing.T, s runlease.Store, k *runlease.Keeper) {
			cur := get(t, s, "runlease:r1")
			ok, err := s.MetaCAS(t.Context(), "runlease:r1", &cur, `{"holder":"B","fence":9,"until_ms":1}`)
			require.NoError(t, err)
			require.True(t, ok)
			<-k.Done()
		},
	}, {
		name: "stopped",
		end:  func(t *testing.T, _ runlease.Store, k *runlease.Keeper) { k.Stop() },
	}, {
		name: "released",
		end: func(t *testing.T, _ runlease.Store, k *runlease.Keeper) {
			require.NoError(t, k.Release(t.Context()))
		},
	}, {
		name: "the_lease_released_by_its_driver",
		end: func(t *testing.T, _ runlease.Store, k *runlease.Keeper) {
			require.NoError(t, k.Lease().Release(t.Context()))
		},
	}, {
		name: "its_context_ended",
		end: func(t *testing.T, _ runlease.Store, k *runlease.Keeper) {
			// The case's context is cancelled below, before end runs.
			<-k.Done()
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := bubbleStore(t)
				l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				k, err := runlease.Keep(ctx, l)
				require.NoError(t, err)
				defer k.Stop()
				time.Sleep(2 * time.Second) // one renewal has landed
				require.True(t, k.TrustedUntil().After(time.Now()), "a running keeper trusts its lease")

				if tc.name == "its_context_ended" {
					cancel()
				}
				tc.end(t, s, k)
				endedAt := time.Now()
				require.Error(t, k.Err())
				if tc.lost {
					require.ErrorIs(t, k.Err(), runlease.ErrLeaseLost)
				}
				// At the moment of the end, and ever after: the lease may
				// even be renewed by hand, which does not revive the keeper.
				assert.False(t, k.TrustedUntil().After(endedAt), "TrustedUntil is %v after the keeper ended",
					k.TrustedUntil().Sub(endedAt))
				time.Sleep(time.Second)
				if !tc.lost && tc.name != "released" && tc.name != "the_lease_released_by_its_driver" {
					require.NoError(t, l.Renew(t.Context()))
				}
				assert.False(t, k.TrustedUntil().After(endedAt), "TrustedUntil is %v after the keeper ended",
					k.TrustedUntil().Sub(endedAt))
			})
		})
	}
}
