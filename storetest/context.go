package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// endedContext is a context that has ended before the call, and the error
// it ends with.
type endedContext struct {
	name string
	want error
	ctx  func(t *testing.T) context.Context
}

var endedContexts = []endedContext{
	{"cancelled", context.Canceled, func(t *testing.T) context.Context {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		return ctx
	}},
	{"past_deadline", context.DeadlineExceeded, func(t *testing.T) context.Context {
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
		t.Cleanup(cancel)
		return ctx
	}},
}

// ctxCall is one call of a Store method, or of an optional capability's,
// made with ctx, on the rows seedRows puts in place.
type ctxCall struct {
	name string
	call func(ctx context.Context, s runlease.Store) error
}

// ctxCalls returns every call s supports, each of which would change or
// read the seeded rows if it ran.
func ctxCalls(s runlease.Store) []ctxCall {
	calls := []ctxCall{
		{"MetaGet", func(ctx context.Context, s runlease.Store) error { _, _, err := s.MetaGet(ctx, "seed/1"); return err }},
		{"MetaCAS creating", func(ctx context.Context, s runlease.Store) error {
			_, err := s.MetaCAS(ctx, "new", nil, "v")
			return err
		}},
		{"MetaCAS swapping", func(ctx context.Context, s runlease.Store) error {
			_, err := s.MetaCAS(ctx, "seed/1", ptr("one"), "v")
			return err
		}},
		{"MetaDelete", func(ctx context.Context, s runlease.Store) error {
			_, err := s.MetaDelete(ctx, "seed/1", "one")
			return err
		}},
		{"MetaScan", func(ctx context.Context, s runlease.Store) error { _, err := s.MetaScan(ctx, ""); return err }},
	}
	if b, ok := s.(runlease.Batcher); ok {
		calls = append(calls, ctxCall{"MetaBatch", func(ctx context.Context, _ runlease.Store) error {
			_, err := b.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals("seed/1", "one")},
				[]runlease.Op{runlease.Put("seed/1", "v"), runlease.Put("new", "v"), runlease.Delete("seed/2")})
			return err
		}})
	}
	if m, ok := s.(runlease.MultiCASer); ok {
		calls = append(calls, ctxCall{"MetaCASMany", func(ctx context.Context, _ runlease.Store) error {
			_, err := m.MetaCASMany(ctx, []runlease.CASWrite{{Key: "seed/1", Expected: ptr("one"), Value: "v"}, {Key: "new", Value: "v"}})
			return err
		}})
	}
	return calls
}

func testCancelledContext(t *testing.T, newStore newStoreFunc) {
	for _, c := range endedContexts {
		t.Run("every_method_fails_on_a_"+c.name+"_context_and_changes_nothing", parallel(newStore, func(t *testing.T, s runlease.Store) {
			want := seedRows(t, s)
			for _, call := range ctxCalls(s) {
				err := call.call(c.ctx(t), s)
				require.ErrorIs(t, err, c.want, call.name)
				// The call never reached storage, so its outcome is known.
				assert.False(t, runlease.IsOutcomeUnknown(err), "%s: a call stopped before it was sent has a known outcome", call.name)
				assert.False(t, errors.Is(err, runlease.ErrInvalidArgument), "%s: a context error is not an invalid argument", call.name)
				require.Equal(t, want, scan(t, s, ""), "%s must leave the store unchanged", call.name)
			}
		}))
	}

	t.Run("every_context_error_is_a_StorageError_that_matches_the_context", parallel(newStore, func(t *testing.T, s runlease.Store) {
		seedRows(t, s)
		for _, c := range endedContexts {
			for _, call := range ctxCalls(s) {
				ctx := c.ctx(t)
				err := call.call(ctx, s)
				if err == nil {
					continue // the subtests above fail it
				}
				var se *runlease.StorageError
				assert.True(t, errors.As(err, &se), "%s on a %s context: a fault must be a *runlease.StorageError, got %T: %v",
					call.name, c.name, err, err)
				assert.ErrorIs(t, err, ctx.Err(), "%s on a %s context", call.name, c.name)
			}
		}
	}))

	t.Run("a_call_whose_context_ends_midway_fails_with_a_StorageError_that_matches_the_context", parallel(newStore, testCutCalls))
}

// testCutCalls makes calls whose context ends within twice the time the
// write of the round takes, so that some end before, some during and some
// after the call. Only the
// context can make a call fail here, so every error must be a
// *StorageError that matches the context's error, whichever step of the
// call the context ended in.
func testCutCalls(t *testing.T, s runlease.Store) {
	failed := 0
	cutRounds(t, s, func(c writeCase, p string, cut func() (context.Context, context.CancelFunc)) {
		calls := []ctxCall{
			{c.name, func(ctx context.Context, s runlease.Store) error { _, err := c.write(ctx, s, p); return err }},
			{"MetaGet", func(ctx context.Context, s runlease.Store) error { _, _, err := s.MetaGet(ctx, p+"a"); return err }},
			{"MetaScan", func(ctx context.Context, s runlease.Store) error { _, err := s.MetaScan(ctx, p); return err }},
		}
		for _, call := range calls {
			ctx, cancel := cut()
			err := call.call(ctx, s)
			cerr := ctx.Err()
			cancel()
			if err == nil {
				continue
			}
			failed++
			require.Error(t, cerr, "%s failed although its context had not ended: %v", call.name, err)
			var se *runlease.StorageError
			require.True(t, errors.As(err, &se), "%s cut short: a fault must be a *runlease.StorageError, got %T: %v", call.name, err, err)
			require.ErrorIs(t, err, cerr, "%s cut short: the error of a call whose context ended must match the context's error", call.name)
		}
	})
	t.Logf("%d of %d calls were cut short", failed, 3*cutCalls())
}
