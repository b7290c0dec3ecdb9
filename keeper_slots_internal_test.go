package runlease

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// strictKeepers returns the keepers s ends when a call of its own gives a
// slot up.
func strictKeepers(s *Slots) []*Keeper {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.strict)
}

// TestAStrictHandOverRacingTheKeepersEndLeavesNoRegistration hands a claim
// to a keeper with KeepSlotsStrict while the keeper ends (stopped, its Keep
// context ended, or its lease lost): whichever comes first, once both have
// returned and the end's clean-up has run, the Slots lists no keeper to
// end, so a later release of the
// slots ends nothing and the Slots holds no keeper alive. A hand-over that
// succeeded left the keeper its slots; one refused left it none.
func TestAStrictHandOverRacingTheKeepersEndLeavesNoRegistration(t *testing.T) {
	t.Parallel()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	rounds := 60
	if testing.Short() {
		rounds = 15
	}
	for round := range rounds {
		run := fmt.Sprintf("r%d", round)
		l, err := Acquire(ctx, s, run, "A", WithTTL(MinTTL))
		require.NoError(t, err)
		sl, err := ClaimSlots(ctx, s, run, []Scope{MemScope(1000)}, WithTTL(MinTTL))
		require.NoError(t, err)
		keepCtx, cancel := context.WithCancelCause(ctx)
		k, err := Keep(keepCtx, l)
		require.NoError(t, err)

		var handOver error
		var wg sync.WaitGroup
		wg.Go(func() { handOver = k.KeepSlotsStrict(sl) })
		wg.Go(func() {
			switch round % 3 {
			case 0:
				k.Stop()
			case 1:
				cancel(errors.New("driver done"))
			case 2:
				// Taken over, and found by a call on the lease.
				cur, _, err := s.MetaGet(ctx, l.key)
				if err == nil {
					_, err = s.MetaCAS(ctx, l.key, &cur, `{"holder":"B","fence":9,"until_ms":1}`)
				}
				if err == nil {
					err = l.Renew(ctx)
				}
				if !errors.Is(err, ErrTakenOver) {
					t.Errorf("round %d: the takeover was not found: %v", round, err)
				}
			}
		})
		wg.Wait()
		<-k.Done()
		k.Stop()
		cancel(nil)

		if handOver == nil {
			require.Same(t, sl, k.Slots(), "round %d", round)
		} else {
			require.Equal(t, k.Err(), handOver, "round %d: refused with the keeper's reason", round)
			require.Nil(t, k.Slots(), "round %d", round)
		}
		// An end's clean-up runs after Done is closed, on the goroutine
		// that ended the keeper (for a Keep context that ended, one of the
		// context's own), which nothing here waits for: wait for it.
		require.Eventually(t, func() bool { return len(strictKeepers(sl)) == 0 }, time.Minute, time.Millisecond,
			"round %d: an ended keeper is still registered on the slots", round)
		require.NoError(t, sl.Release(ctx))
		_ = l.Release(ctx)
	}
}
