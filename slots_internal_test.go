package runlease

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSlotRowsCarryTheirClaimsID: every row a Slots sends, its claim's and
// its renewals', carries its claim id as fence, one id for the claim's
// slots in every scope and another for every other claim of the run; the
// reference's reading of the rows (referenceDecodeRow) reads them as
// decodeRow does.
func TestSlotRowsCarryTheirClaimsID(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := OpenSQLite(t.TempDir() + "/runs.db")
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := WithClock(func() time.Time { return now })
	ids := map[uint64]bool{}
	for range 3 {
		sl, err := ClaimSlots(ctx, s, "r", []Scope{MemScope(8), PrincipalScope("p", 8)}, clock)
		require.NoError(t, err)
		require.NotZero(t, sl.claimID)
		require.Less(t, sl.claimID, uint64(1)<<63)
		assert.False(t, ids[sl.claimID], "two claims of the run drew one id")
		ids[sl.claimID] = true
		check := func(what string) {
			for _, h := range sl.Held() {
				raw, found, err := s.MetaGet(ctx, h.Key)
				require.NoError(t, err)
				require.True(t, found)
				row, err := decodeRow(raw)
				require.NoError(t, err)
				ref, err := referenceDecodeRow(raw)
				require.NoError(t, err)
				assert.Equal(t, leaseRow{Holder: "r", Fence: sl.claimID, UntilMS: h.Until.UnixMilli()}, row, what)
				assert.Equal(t, row, ref, what)
			}
		}
		check("the claim's rows")
		require.NoError(t, sl.Renew(ctx))
		check("the renewal's rows")
	}
}
