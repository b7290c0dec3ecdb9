package runlease_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/testkit"
)

func TestLease(t *testing.T) {
	t.Parallel()
	ttl := runlease.WithTTL(60 * time.Second)

	t.Run("one_holder_at_a_time", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		_, err := runlease.Acquire(t.Context(), s, "r1", "A", ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		b, err := runlease.Acquire(t.Context(), s, "r1", "B", ttl, runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrLeaseLost)
		assert.Nil(t, b)
		assert.True(t, strings.HasPrefix(err.Error(), "RUN-E021"), err.Error())
		var lost *runlease.LeaseLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, "A", lost.Holder, "the refusal names the holder")
		assert.Equal(t, uint64(1), lost.Fence)
		assert.Equal(t, epoch.Add(60*time.Second), lost.Until, "and when takeover becomes possible")
	})

	t.Run("re_entering_our_own_lease_is_fine", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		a1, err := runlease.Acquire(t.Context(), s, "r1", "A", ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(time.Second)
		a2, err := runlease.Acquire(t.Context(), s, "r1", "A", ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Greater(t, a2.Fence(), a1.Fence(), "re-entry starts a new fence")
		require.ErrorIs(t, a1.Renew(t.Context()), runlease.ErrLeaseLost, "the earlier handle is superseded")
		require.NoError(t, a2.Renew(t.Context()))
	})

	t.Run("an_expired_lease_can_be_taken_over", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		a, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(runlease.MinTTL - time.Millisecond)
		_, err = runlease.Acquire(t.Context(), s, "r1", "B", ttl, runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrLeaseLost, "still live one millisecond before expiry")
		clk.Advance(time.Millisecond)
		b, err := runlease.Acquire(t.Context(), s, "r1", "B", ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err, "free at its until time")
		assert.Equal(t, a.Fence()+1, b.Fence())
	})

	t.Run("a_stalled_holder_cannot_renew_after_being_replaced", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		a, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(time.Hour)
		b, err := runlease.Acquire(t.Context(), s, "r1", "B", ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		before := get(t, s, "runlease:r1")

		err = a.Renew(t.Context())
		require.ErrorIs(t, err, runlease.ErrLeaseLost)
		assert.Equal(t, "RUN-E021", runlease.Code(err))
		assert.True(t, strings.HasPrefix(err.Error(), "RUN-E021"), err.Error())
		var lost *runlease.LeaseLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, "B", lost.Holder)
		assert.Equal(t, b.Fence(), lost.Fence)
		assert.Equal(t, before, get(t, s, "runlease:r1"), "the new holder's row is untouched")
		require.ErrorIs(t, a.Renew(t.Context()), runlease.ErrLeaseLost, "and stays lost")
	})

	t.Run("renewing_extends_the_deadline", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		five := runlease.WithTTL(5 * time.Second)
		a, err := runlease.Acquire(t.Context(), s, "r1", "A", five, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(3 * time.Second)
		require.NoError(t, a.Renew(t.Context()))
		assert.Equal(t, epoch.Add(8*time.Second), a.Expiry())
		clk.Advance(4500 * time.Millisecond) // 7.5 s: past the original 5 s, inside the renewed 8 s
		_, err = runlease.Acquire(t.Context(), s, "r1", "B", five, runlease.WithClock(clk.Now))
		require.ErrorIs(t, err, runlease.ErrLeaseLost)
		clk.Advance(500 * time.Millisecond)
		_, err = runlease.Acquire(t.Context(), s, "r1", "B", five, runlease.WithClock(clk.Now))
		require.NoError(t, err, "free at the renewed deadline")
	})

	t.Run("releasing_lets_the_next_driver_start_at_once", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		a, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		require.NoError(t, a.Release(t.Context()))
		require.NoError(t, a.Release(t.Context()), "releasing twice is a no-op")
		clk.Advance(100 * time.Millisecond)
		b, err := runlease.Acquire(t.Context(), s, "r1", "B", runlease.WithClock(clk.Now))
		require.NoError(t, err)
		assert.Equal(t, a.Fence()+1, b.Fence(), "the released row kept the fence")
		require.ErrorIs(t, a.Renew(t.Context()), runlease.ErrLeaseLost, "a released lease cannot renew")
	})

	t.Run("release_after_being_taken_over_leaves_the_new_holder_untouched", func(t *testing.T) {
		t.Parallel()
		s, clk := newSQLite(t), testkit.NewClock(epoch)
		a, err := runlease.Acquire(t.Context(), s, "r1", "A", runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now))
		require.NoError(t, err)
		clk.Advance(runlease.MinTTL)
		b, err := runlease.Acquire(t.Context(), s, "r1", "B", ttl, runlease.WithClock(clk.Now))
		require.NoError(t, err)
		before := get(t, s, "runlease:r1")
		require.ErrorIs(t, a.Release(t.Context()), runlease.ErrLeaseLost)
		assert.Equal(t, before, get(t, s, "runlease:r1"))
		require.NoError(t, b.Renew(t.Context()))
	})
}

func TestFencesNeverGoBackwards(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithTTL(runlease.MinTTL), runlease.WithClock(clk.Now)}
	var last uint64
	holders := []string{"A", "B", "A", "C"}
	for i, h := range holders {
		l, err := runlease.Acquire(t.Context(), s, "r1", h, opts...)
		require.NoError(t, err)
		require.Greater(t, l.Fence(), last, "acquisition %d", i)
		last = l.Fence()
		for range 3 {
			clk.Advance(time.Second)
			require.NoError(t, l.Renew(t.Context()))
			require.Equal(t, last, l.Fence(), "renewals keep the fence")
		}
		if i%2 == 0 {
			require.NoError(t, l.Release(t.Context()))
		} else {
			clk.Advance(runlease.MinTTL) // expire: the next one takes over
		}
	}
	require.Equal(t, uint64(len(holders)), last)
}

func TestFenceAtTheMaximumIsRefusedNotWrapped(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	row := `{"holder":"","fence":` + strconv.FormatUint(math.MaxUint64, 10) + `,"until_ms":0}`
	put(t, s, "runlease:r1", row)
	_, err := runlease.Acquire(t.Context(), s, "r1", "A")
	require.ErrorIs(t, err, runlease.ErrFenceExhausted)
	assert.Equal(t, "RUN-E003", runlease.Code(err))
	assert.Equal(t, row, get(t, s, "runlease:r1"))

	// One below the maximum is still fine, and lands on it.
	s2 := newSQLite(t)
	put(t, s2, "runlease:r1", `{"holder":"","fence":`+strconv.FormatUint(math.MaxUint64-1, 10)+`,"until_ms":0}`)
	l, err := runlease.Acquire(t.Context(), s2, "r1", "A")
	require.NoError(t, err)
	assert.Equal(t, uint64(math.MaxUint64), l.Fence())
}

func TestCorruptLeaseRowIsRefusedAndKept(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		`not json`, `[1]`, `null`, `"text"`, `{"fence":-1}`, `{"fence":1.5}`, `{"fence":1e3}`,
		`{"holder":null}`, `{"holder":7}`, `{"until_ms":"x"}`, `{"holder":"a"} trailing`, `{"holder":"a"`,
		`{"fence":18446744073709551616}`,
	} {
		t.Run(raw, func(t *testing.T) {
			t.Parallel()
			s := newSQLite(t)
			put(t, s, "runlease:r1", raw)
			_, err := runlease.Acquire(t.Context(), s, "r1", "A")
			require.ErrorIs(t, err, runlease.ErrCorruptRow)
			assert.True(t, strings.HasPrefix(err.Error(), "RUN-E002"), err.Error())
			var ce *runlease.CorruptRowError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, "runlease:r1", ce.Key)
			assert.Equal(t, raw, get(t, s, "runlease:r1"), "nothing is overwritten")
			_, err = runlease.Peek(t.Context(), s, "r1")
			require.ErrorIs(t, err, runlease.ErrCorruptRow)
		})
	}
}

func TestRowsAreByteCompatibleWithTheReference(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	holder := "p<>&\"q\\r\u2028é\n\t\x01#node/1"
	l, err := runlease.Acquire(t.Context(), s, "r1", holder, runlease.WithClock(clk.Now), runlease.WithTTL(time.Minute))
	require.NoError(t, err)
	until := strconv.FormatInt(epoch.Add(time.Minute).UnixMilli(), 10)
	// What serde_json writes for the reference's LeaseRow: only '"', '\'
	// and control characters escaped, lower-case \u00xx, raw UTF-8.
	want := `{"holder":"p<>&\"q\\r` + "\u2028é" + `\n\t\u0001#node/1","fence":1,"until_ms":` + until + `}`
	assert.Equal(t, want, get(t, s, "runlease:r1"))

	require.NoError(t, l.Release(t.Context()))
	assert.Equal(t, `{"holder":"","fence":1,"until_ms":`+strconv.FormatInt(epoch.UnixMilli(), 10)+`}`,
		get(t, s, "runlease:r1"), "a release keeps the fence")
}

func TestRowsWrittenByTheReferenceAreRead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, raw string
		fence     uint64
	}{
		{"missing_fields_read_as_zero", `{"holder":"X"}`, 1},
		{"empty_object", `{}`, 1},
		{"unknown_fields_are_ignored", `{"holder":"X","fence":41,"until_ms":5,"note":[1,{"a":null}]}`, 42},
		{"spacing_and_order", ` { "until_ms" : 5 , "fence" : 6 , "holder" : "X" } `, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSQLite(t)
			put(t, s, "runlease:r1", tc.raw)
			l, err := runlease.Acquire(t.Context(), s, "r1", "A")
			require.NoError(t, err, "an expired row is taken over")
			assert.Equal(t, tc.fence, l.Fence())
		})
	}
}

func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("r", runlease.MaxKeyLen)
	for _, tc := range []struct {
		name, runID, holder string
		opts                []runlease.Option
	}{
		{"empty_run_id", "", "A", nil},
		{"nul_in_run_id", "r\x001", "A", nil},
		{"invalid_utf8_run_id", "r\xff", "A", nil},
		{"over_long_run_id", long, "A", nil},
		{"empty_holder", "r1", "", nil},
		{"nul_in_holder", "r1", "A\x00", nil},
		{"invalid_utf8_holder", "r1", "\xc3\x28", nil},
		{"ttl_below_minimum", "r1", "A", []runlease.Option{runlease.WithTTL(runlease.MinTTL - time.Millisecond)}},
		{"negative_ttl", "r1", "A", []runlease.Option{runlease.WithTTL(-time.Minute)}},
		{"ttl_above_maximum", "r1", "A", []runlease.Option{runlease.WithTTL(runlease.MaxTTL + time.Second)}},
		{"nil_clock", "r1", "A", []runlease.Option{runlease.WithClock(nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSQLite(t)
			l, err := runlease.Acquire(t.Context(), s, tc.runID, tc.holder, tc.opts...)
			require.ErrorIs(t, err, runlease.ErrInvalidArgument)
			assert.Nil(t, l)
			assert.True(t, strings.HasPrefix(err.Error(), "RUN-E001"), err.Error())
			assert.Empty(t, rows(t, s), "nothing written")
		})
	}
}

func TestPeekSaysWhenTakeoverBecomesPossible(t *testing.T) {
	t.Parallel()
	s, clk := newSQLite(t), testkit.NewClock(epoch)
	opts := []runlease.Option{runlease.WithClock(clk.Now)}

	info, err := runlease.Peek(t.Context(), s, "r1", opts...)
	require.NoError(t, err)
	assert.Equal(t, runlease.LeaseInfo{RunID: "r1"}, info, "absent")

	l, err := runlease.Acquire(t.Context(), s, "r1", "A", append(opts, runlease.WithTTL(time.Minute))...)
	require.NoError(t, err)
	info, err = runlease.Peek(t.Context(), s, "r1", opts...)
	require.NoError(t, err)
	assert.Equal(t, runlease.LeaseInfo{RunID: "r1", Found: true, Live: true, Holder: "A", Fence: 1,
		Until: epoch.Add(time.Minute), Row: get(t, s, "runlease:r1")}, info)

	clk.Advance(time.Minute)
	info, err = runlease.Peek(t.Context(), s, "r1", opts...)
	require.NoError(t, err)
	assert.False(t, info.Live, "expired at its until time")
	assert.Equal(t, "A", info.Holder)

	require.NoError(t, l.Release(t.Context()))
	info, err = runlease.Peek(t.Context(), s, "r1", opts...)
	require.NoError(t, err)
	assert.Equal(t, runlease.LeaseInfo{RunID: "r1", Found: true, Released: true, Fence: 1, Until: clk.Now(),
		Row: get(t, s, "runlease:r1")}, info)
}

func TestOneWinnerWhenManyDriversRace(t *testing.T) {
	t.Parallel()
	s := newSQLite(t)
	const drivers = 16
	for round := range 20 {
		runID := "race-" + strconv.Itoa(round)
		var wg sync.WaitGroup
		start := make(chan struct{})
		leases := make([]*runlease.Lease, drivers)
		errs := make([]error, drivers)
		for i := range drivers {
			wg.Go(func() {
				<-start
				leases[i], errs[i] = runlease.Acquire(context.Background(), s, runID, "D"+strconv.Itoa(i))
			})
		}
		close(start)
		wg.Wait()
		winners := 0
		for i := range drivers {
			if errs[i] == nil {
				winners++
				continue
			}
			require.True(t, errors.Is(errs[i], runlease.ErrLeaseLost), "driver %d: %v", i, errs[i])
		}
		require.Equal(t, 1, winners, "round %d", round)
	}
}

// requireExpiryAtLeast fails t unless got is want or a few milliseconds
// later: a lease stamps each row above the last it sent, so a renewal in the
// same millisecond as an earlier one expires a millisecond later.
func requireExpiryAtLeast(t *testing.T, want, got time.Time) {
	t.Helper()
	require.False(t, got.Before(want), "expiry %v is before %v", got, want)
	require.WithinDuration(t, want, got, 5*time.Millisecond)
}

// TestAfterAFailedReleaseOnlyReleaseMayFollow pins what Release's
// documentation says of a release that failed: the row may still be held,
// yet Renew, Write and Keep answer ErrReleased at once, without asking the
// store, and a retried Release is what ends it.
func TestAfterAFailedReleaseOnlyReleaseMayFollow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := &testkit.Faulty{Store: newSQLite(t)}
	l, err := runlease.Acquire(ctx, f, "r1", "A")
	require.NoError(t, err)
	held := get(t, f, "runlease:r1")

	f.Next(testkit.Fault{Apply: false, Err: testkit.NotApplied("MetaCAS")})
	err = l.Release(ctx)
	require.ErrorIs(t, err, runlease.ErrStorage)
	require.NotErrorIs(t, err, runlease.ErrOutcomeUnknown)
	require.Equal(t, held, get(t, f, "runlease:r1"), "the release did not land: the row is still held")

	// Every call but Release answers without the store: a store that is
	// down would turn any call that asked it into a fault.
	f.SetDown(true)
	for name, call := range map[string]func() error{
		"Renew": func() error { return l.Renew(ctx) },
		"Write": func() error { return l.Write(ctx, runlease.Put("ckpt:r1", "1")) },
		"Keep": func() error {
			k, err := runlease.Keep(ctx, l)
			if k != nil {
				k.Stop()
			}
			return err
		},
	} {
		err := call()
		require.ErrorIs(t, err, runlease.ErrReleased, "%s after a failed Release", name)
		assert.ErrorIs(t, err, runlease.ErrLeaseLost, name)
		assert.NotErrorIs(t, err, runlease.ErrStorage, "%s asked the store", name)
	}
	f.SetDown(false)
	require.Equal(t, held, get(t, f, "runlease:r1"), "nothing was written meanwhile")
	_, found, err := f.MetaGet(ctx, "ckpt:r1")
	require.NoError(t, err)
	require.False(t, found)

	require.NoError(t, l.Release(ctx), "Release may follow, and ends it")
	info, err := runlease.Peek(ctx, f, "r1")
	require.NoError(t, err)
	assert.True(t, info.Released)
}

// TestARetriedReleaseAfterALostReply pins what Release's documentation
// says of a release whose reply was lost: retried, it succeeds while the
// row is its own tombstone, and once another holder took the run it
// returns RUN-E021, the run being that holder's, whose row it leaves alone.
func TestARetriedReleaseAfterALostReply(t *testing.T) {
	t.Parallel()
	// setup acquires r1 for A and releases it with the reply lost and the
	// read-back failing, so that the release's outcome stays unknown.
	setup := func(t *testing.T) (*testkit.Faulty, *runlease.Lease) {
		t.Helper()
		f := &testkit.Faulty{Store: newSQLite(t)}
		l, err := runlease.Acquire(t.Context(), f, "r1", "A")
		require.NoError(t, err)
		f.Next(testkit.Fault{Apply: true, Err: testkit.Unknown("MetaCAS")})
		f.FailReads(1)
		require.ErrorIs(t, l.Release(t.Context()), runlease.ErrOutcomeUnknown)
		info, err := runlease.Peek(t.Context(), f, "r1")
		require.NoError(t, err)
		require.True(t, info.Released, "the release landed; only its reply was lost")
		return f, l
	}

	t.Run("succeeds_while_the_row_is_its_own_tombstone", func(t *testing.T) {
		t.Parallel()
		_, l := setup(t)
		require.NoError(t, l.Release(t.Context()))
	})

	t.Run("is_a_loss_once_another_holder_took_the_run", func(t *testing.T) {
		t.Parallel()
		f, l := setup(t)
		b, err := runlease.Acquire(t.Context(), f, "r1", "B")
		require.NoError(t, err)
		row := get(t, f, "runlease:r1")

		err = l.Release(t.Context())
		require.ErrorIs(t, err, runlease.ErrLeaseLost)
		require.ErrorIs(t, err, runlease.ErrTakenOver)
		assert.Equal(t, runlease.CodeLeaseLost, runlease.Code(err))
		assert.Equal(t, row, get(t, f, "runlease:r1"), "B's lease is left alone")
		require.NoError(t, b.Renew(t.Context()), "B still holds the run")
	})
}
