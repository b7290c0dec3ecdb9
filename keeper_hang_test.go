package runlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

// TestKeepAfterTrustRanOut: a keeper started on a lease whose trust window
// has already run out must have ended, its work context cancelled, when
// Keep returns. Its row may have expired already, so a contender can be
// granted the run at once: waiting for the Renewer's loop to notice (which
// may run late, here because another keeper's Lost hook holds it) would
// leave two drivers trusting the run.
func TestKeepAfterTrustRanOut(t *testing.T) {
	t.Parallel()
	five := runlease.WithTTL(5 * time.Second)
	for _, shared := range []bool{true, false} {
		name := map[bool]string{true: "shared_renewer", false: "own_renewer"}[shared]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := faultyBubble(t)
				var r runlease.Renewer
				defer r.Close()
				l, err := runlease.Acquire(t.Context(), s, "r1", "A", five)
				require.NoError(t, err)

				// The first keeper's renewals hang until its trust window
				// ends; the loop then runs its Lost hook, which stalls.
				entered, resume := make(chan struct{}), make(chan struct{})
				defer close(resume)
				stall := runlease.WithHooks(runlease.Hooks{Lost: func(runlease.LossEvent) {
					close(entered)
					<-resume
				}})
				s.HangWrites(testkit.Prefix(runlease.LeasePrefix))
				k1, err := r.Keep(t.Context(), l, stall)
				require.NoError(t, err)
				<-entered
				require.ErrorIs(t, k1.Err(), runlease.ErrTrustExpired)
				time.Sleep(time.Second) // the row expires: takeover is open
				s.HangWrites(nil)

				keep := r.Keep
				if !shared {
					keep = runlease.Keep
				}
				k2, err := keep(t.Context(), l)
				require.NoError(t, err)
				select {
				case <-k2.Done():
				default:
					t.Fatal("Keep returned a running keeper of a lease whose trust window ran out")
				}
				require.ErrorIs(t, context.Cause(k2.Context()), runlease.ErrTrustExpired)
				require.ErrorIs(t, k2.Err(), runlease.ErrTrustExpired)

				// The contender that may now be granted the run finds no
				// keeper of A's still trusting it.
				_, err = runlease.Acquire(t.Context(), s, "r1", "B", five)
				require.NoError(t, err)
				require.Error(t, k2.Context().Err())
				k2.Stop()
			})
		})
	}
}
