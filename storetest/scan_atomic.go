package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// moveFillers is how many rows sit between the two places a token moves
// between, so that a scan that reads its range in pages, at different
// instants, reads the two places in different pages.
const moveFillers = 1100

// movePlaces are the two keys a token moves between: one sorts before
// every filler, the other after.
var movePlaces = [2]string{"move/a/token", "move/z/token"}

// moveFunc moves the token from key from, where it holds old, to the absent
// key to, where it will hold next.
type moveFunc func(ctx context.Context, s runlease.Store, from, to, old, next string) error

// atomicScans is how many scans a moving-token test makes. Each scan
// reads over a thousand rows while the token moves many times, so a scan
// that is not one snapshot shows within a few. atomicScansOverride, when
// above zero, replaces the count.
func atomicScans() int {
	switch {
	case atomicScansOverride > 0:
		return atomicScansOverride
	case testing.Short():
		return 20
	}
	return 40
}

// atomicScansOverride is set only by this package's own tests. A scan
// that reads its range page by page is caught by a moving token in only a
// share of scans, about one in sixteen for a token moved by copies, so the
// test that requires the suite to fail such a store makes enough scans for
// the catch to be certain in practice, many more than a run against a real
// store needs.
var atomicScansOverride int

func testAtomicScan(t *testing.T, newStore newStoreFunc) {
	withBatcher := withCapability[runlease.Batcher](newStore)
	t.Run("a_scan_sees_a_row_moved_by_batches_exactly_once", withBatcher(func(t *testing.T, s runlease.Store, b runlease.Batcher) {
		testScanUnderMoves(t, s, moveByBatch(b), 1, 1)
	}))
	// Without batches, a move is a create and then a delete, so the token
	// is in one place or two at every instant, never in none.
	t.Run("a_scan_never_misses_a_row_copied_before_its_old_copy_is_deleted", parallel(newStore, func(t *testing.T, s runlease.Store) {
		testScanUnderMoves(t, s, moveByCopy, 1, 2)
	}))
}

func moveByBatch(b runlease.Batcher) moveFunc {
	return func(ctx context.Context, _ runlease.Store, from, to, old, next string) error {
		ok, err := b.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals(from, old), runlease.IfAbsent(to)},
			[]runlease.Op{runlease.Delete(from), runlease.Put(to, next)})
		if err == nil && !ok {
			err = fmt.Errorf("the batch moving %s from %q to %q was refused, though only it writes them", old, from, to)
		}
		return err
	}
}

func moveByCopy(ctx context.Context, s runlease.Store, from, to, old, next string) error {
	ok, err := s.MetaCAS(ctx, to, nil, next)
	if err == nil && ok {
		ok, err = s.MetaDelete(ctx, from, old)
	}
	if err == nil && !ok {
		err = fmt.Errorf("moving %s from %q to %q was refused, though only the mover writes them", old, from, to)
	}
	return err
}

// testScanUnderMoves scans the prefix holding the fillers and the token
// while another goroutine moves the token back and forth with move, and
// requires every scan to see every filler and between least and most
// copies of the token.
func testScanUnderMoves(t *testing.T, s runlease.Store, move moveFunc, least, most int) {
	fillers := make([]string, moveFillers)
	for i := range fillers {
		fillers[i] = fmt.Sprintf("move/m/%04d", i)
	}
	fill(t, s, fillers)
	create(t, s, movePlaces[0], "token/0")

	stop, done := make(chan struct{}), make(chan error, 1)
	moves := 0
	go func() {
		for n := 0; ; n++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			from, to := movePlaces[n%2], movePlaces[1-n%2]
			if err := move(t.Context(), s, from, to, fmt.Sprint("token/", n), fmt.Sprint("token/", n+1)); err != nil {
				done <- err
				return
			}
			moves = n + 1
		}
	}()
	var stopped bool
	finish := func() error {
		if !stopped {
			stopped = true
			close(stop)
		}
		return <-done
	}
	defer func() {
		if !stopped {
			finish()
		}
	}()
	for i := range atomicScans() {
		rows := scan(t, s, "move/")
		tokens := 0
		for _, r := range rows {
			if strings.HasSuffix(r.Key, "/token") {
				tokens++
			}
		}
		require.Equal(t, moveFillers, len(rows)-tokens, "scan %d of %q during moves lost or repeated fillers", i, "move/")
		require.True(t, tokens >= least && tokens <= most,
			"scan %d of %q during moves saw the token %d times; an atomic scan sees it %d to %d times", i, "move/", tokens, least, most)
	}
	require.NoError(t, finish(), "the mover")
	t.Logf("%d scans of %d rows during %d moves", atomicScans(), moveFillers+1, moves)
}
