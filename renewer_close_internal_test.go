package runlease

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// blockingHandler is a slog handler whose Warn records block until release
// is closed.
type blockingHandler struct {
	entered atomic.Int32
	release chan struct{}
}

func (h *blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *blockingHandler) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level == slog.LevelWarn {
		h.entered.Add(1)
		<-h.release
	}
	return nil
}
func (h *blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *blockingHandler) WithGroup(string) slog.Handler      { return h }

// TestRenewerCloseWaitsForItsGoroutineReportingALossWithoutAHook: a lease's
// loss found by a Renewer's renewal is reported at unlock, on the renewal's
// goroutine: the keeper's end is logged (slowly, here), then its Lost hook
// runs. While the logger runs no hook does, and Close, called meanwhile
// from another goroutine, must return only once its goroutines have
// exited, as its godoc says: no hook of its keepers runs after it.
func TestRenewerCloseWaitsForItsGoroutineReportingALossWithoutAHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		raw, err := OpenSQLite(filepath.Join(t.TempDir(), "runs.db"))
		require.NoError(t, err)
		t.Cleanup(func() { raw.Close() })
		ctx := t.Context()
		l, err := Acquire(ctx, raw, "r", "A", WithTTL(5*time.Second))
		require.NoError(t, err)
		h := &blockingHandler{release: make(chan struct{})}
		var r Renewer
		var closed, hookAfterClose atomic.Bool
		lost := WithHooks(Hooks{Lost: func(LossEvent) { hookAfterClose.Store(closed.Load()) }})
		_, err = r.Keep(ctx, l, KeepInterval(time.Second), WithLogger(slog.New(h)), lost)
		require.NoError(t, err)

		info, err := Peek(ctx, raw, "r")
		require.NoError(t, err)
		require.NoError(t, ForceRelease(ctx, raw, info))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Equal(t, int32(1), h.entered.Load(), "the renewal logs the loss")

		go func() {
			r.Close()
			closed.Store(true)
		}()
		synctest.Wait()
		returnedEarly := closed.Load()
		close(h.release)
		synctest.Wait()
		require.True(t, closed.Load())
		require.False(t, returnedEarly, "Close returned while the Renewer's renewal goroutine was still running (logging the loss), with no hook running; the keeper's Lost hook then ran after Close returned: %v", hookAfterClose.Load())
	})
}
