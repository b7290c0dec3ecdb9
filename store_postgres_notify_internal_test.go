package runlease

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/pgtest"
)

// FuzzPostgresPayload checks that every notification names its key and
// carries its row (or, when too long, none), whatever the key and row hold.
func FuzzPostgresPayload(f *testing.F) {
	f.Add("runlease:r1", `{"holder":"","fence":1,"until_ms":1}`)
	f.Add("runlease-row:3:abc", "runlease-row:1:x")
	f.Add("k:", strings.Repeat("v", pgMaxPayload))
	f.Add("12:", "")
	f.Fuzz(func(t *testing.T, key, value string) {
		if CheckKey(key) != nil || CheckValue(value) != nil {
			return
		}
		p := pgPayload(key, value)
		require.LessOrEqual(t, len(p), pgMaxPayload)
		k, row, hasRow := pgParsePayload(p)
		require.True(t, hasRow)
		require.Equal(t, key, k)
		if len(p) < len(pgPayloadRow)+len(key)+len(value) {
			require.Empty(t, row, "a row too long is left out, never cut")
		} else {
			require.Equal(t, value, row)
		}
	})
}

func TestPostgresPayloadOfABareKey(t *testing.T) {
	for _, p := range []string{"runlease:r1", "runlease-row:", "runlease-row:x:k", "runlease-row:05:abcde", "runlease-row:9:abc", "runlease-row:0:"} {
		k, row, hasRow := pgParsePayload(p)
		assert.Equal(t, p, k, "%q is a bare key", p)
		assert.Empty(t, row)
		assert.False(t, hasRow)
	}
}

// TestANotificationThatFailsLeavesTheWriteItsOutcome: the notification is
// a transaction of its own after the write's; when it fails, the write has
// landed all the same, and is reported as landed.
func TestANotificationThatFailsLeavesTheWriteItsOutcome(t *testing.T) {
	t.Parallel()
	s, err := NewPostgres(t.Context(), pgtest.Pool(t), WithTable(pgtest.NewTable(t, pgtest.Pool(t))))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	s.channel = strings.Repeat("c", 100) // Postgres refuses channel names this long
	ctx := t.Context()
	ok, err := s.MetaCASNotify(ctx, "k", nil, "v1")
	require.NoError(t, err)
	require.True(t, ok)
	v := "v1"
	ok, err = s.MetaCASNotify(ctx, "k", &v, "v2")
	require.NoError(t, err)
	require.True(t, ok)
	got, found, err := s.MetaGet(ctx, "k")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "v2", got)
	ok, err = s.MetaCASNotify(ctx, "k", &v, "v3")
	require.NoError(t, err)
	require.False(t, ok, "a condition that fails is still a refusal")
}
