package runlease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// TestPostgresRestartLeavesOneHolderPerRun crashes and restarts a private
// server while a keeper holds a lease and a contender keeps trying to take
// it: after the restart at most one of them believes it holds the run.
func TestPostgresRestartLeavesOneHolderPerRun(t *testing.T) {
	t.Parallel()
	cluster := pgtest.StartCluster(t)
	holderStore := openPGDSN(t, cluster.DSN())
	contenderStore := openPGDSN(t, cluster.DSN())
	ttl := runlease.WithTTL(runlease.MinTTL)

	l, err := runlease.Acquire(t.Context(), holderStore, "r1", "A", ttl)
	require.NoError(t, err)
	k, err := runlease.Keep(t.Context(), l)
	require.NoError(t, err)
	defer k.Stop()

	cluster.Restart()
	var b *runlease.Lease
	deadline := time.Now().Add(2 * runlease.MinTTL) // longer than a TTL: a lapse would show
	for b == nil && time.Now().Before(deadline) {
		b, err = runlease.Acquire(t.Context(), contenderStore, "r1", "B", ttl)
		var se *runlease.StorageError
		if err != nil && !errors.Is(err, runlease.ErrTakenOver) && !errors.As(err, &se) {
			t.Fatalf("an unclassified fault: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Either the keeper rode out the restart and the contender was refused
	// throughout, or the keeper gave the lease up and the contender took it
	// over at a higher fence — never both holding it.
	if b != nil {
		require.Error(t, k.Err(), "the contender holds r1 while the keeper still trusts it")
		assert.Greater(t, b.Fence(), l.Fence())
		require.ErrorIs(t, l.Renew(t.Context()), runlease.ErrLeaseLost)
	} else {
		require.NoError(t, k.Err(), "nobody holds r1")
		require.NoError(t, l.Renew(t.Context()))
	}
	t.Logf("after the restart: keeper err=%v, contender acquired=%v", k.Err(), b != nil)
}

func openPGDSN(t *testing.T, dsn string) *runlease.PostgresStore {
	t.Helper()
	s, err := runlease.OpenPostgres(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}
