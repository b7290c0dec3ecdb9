package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// The end of a keeper forced at each moment of its ClaimSlotsWait's
// admission and of the clean-up that follows, on both built-in stores:
// whatever the moment, and whatever faults that change nothing the
// clean-up meets within its bound, the call returns the keeper's Err (or
// slots the keeper keeps, which its Release frees), and once both calls
// returned the run holds no slot and waits in no queue.

// endCall is one store call of a keeper's hand-over race, seen by a
// claimEndHooks hook before it runs (after false) and after (after true).
type endCall struct {
	op    string // MetaBatch, MetaGet, MetaDeleteNotify or MetaCASNotify
	key   string // the key; for MetaBatch the first slot row it puts, "" when none
	after bool
	ctx   context.Context
	conds []runlease.Cond // of a MetaBatch
	ops   []runlease.Op
	// err is, after the call, what it returned; a hook may replace it
	// (a reply lost). Before, a hook that sets it fails the call with it
	// without running it.
	err error
	res string // after the call, what else it returned, for a trace
}

// claimEndHooks runs hook, when set, around the calls of endCall's ops.
type claimEndHooks struct {
	mu   sync.Mutex
	hook func(c *endCall)
}

func (h *claimEndHooks) set(hook func(c *endCall)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hook = hook
}

// around runs call between the hook's two looks at it.
func (h *claimEndHooks) around(ctx context.Context, op, key string, call func() (string, error)) error {
	return h.aroundBatch(ctx, op, key, nil, nil, call)
}

func (h *claimEndHooks) aroundBatch(ctx context.Context, op, key string, conds []runlease.Cond, ops []runlease.Op, call func() (string, error)) error {
	h.mu.Lock()
	hook := h.hook
	h.mu.Unlock()
	if hook == nil {
		_, err := call()
		return err
	}
	c := &endCall{op: op, key: key, ctx: ctx, conds: conds, ops: ops}
	if hook(c); c.err != nil {
		return c.err
	}
	c.res, c.err = call()
	c.after = true
	hook(c)
	return c.err
}

func slotPut(ops []runlease.Op) string {
	for _, op := range ops {
		if strings.HasPrefix(op.Key, runlease.SlotPrefix) && !op.Delete {
			return op.Key
		}
	}
	return ""
}

// pgEndHooks and sqliteEndHooks are the built-in stores, every method and
// optional interface of theirs kept, with the hooks around four methods.
type pgEndHooks struct {
	*runlease.PostgresStore
	h *claimEndHooks
}

type sqliteEndHooks struct {
	*runlease.SQLiteStore
	h *claimEndHooks
}

func (s *pgEndHooks) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (ok bool, err error) {
	err = s.h.aroundBatch(ctx, "MetaBatch", slotPut(ops), conds, ops, func() (string, error) {
		ok, err = s.PostgresStore.MetaBatch(ctx, conds, ops)
		return fmt.Sprintf("ok=%v", ok), err
	})
	return ok && err == nil, err
}

func (s *pgEndHooks) MetaGet(ctx context.Context, key string) (v string, found bool, err error) {
	err = s.h.around(ctx, "MetaGet", key, func() (string, error) {
		v, found, err = s.PostgresStore.MetaGet(ctx, key)
		return fmt.Sprintf("found=%v %s", found, v), err
	})
	return v, found && err == nil, err
}

func (s *pgEndHooks) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (ok bool, err error) {
	err = s.h.around(ctx, "MetaDeleteNotify", key, func() (string, error) {
		ok, err = s.PostgresStore.MetaDeleteNotify(ctx, key, expected, wakeKey)
		return fmt.Sprintf("ok=%v", ok), err
	})
	return ok && err == nil, err
}

func (s *pgEndHooks) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (ok bool, err error) {
	err = s.h.around(ctx, "MetaCASNotify", key, func() (string, error) {
		ok, err = s.PostgresStore.MetaCASNotify(ctx, key, expected, value)
		return fmt.Sprintf("ok=%v", ok), err
	})
	return ok && err == nil, err
}

func (s *sqliteEndHooks) MetaBatch(ctx context.Context, conds []runlease.Cond, ops []runlease.Op) (ok bool, err error) {
	err = s.h.aroundBatch(ctx, "MetaBatch", slotPut(ops), conds, ops, func() (string, error) {
		ok, err = s.SQLiteStore.MetaBatch(ctx, conds, ops)
		return fmt.Sprintf("ok=%v", ok), err
	})
	return ok && err == nil, err
}

func (s *sqliteEndHooks) MetaGet(ctx context.Context, key string) (v string, found bool, err error) {
	err = s.h.around(ctx, "MetaGet", key, func() (string, error) {
		v, found, err = s.SQLiteStore.MetaGet(ctx, key)
		return fmt.Sprintf("found=%v %s", found, v), err
	})
	return v, found && err == nil, err
}

func (s *sqliteEndHooks) MetaDeleteNotify(ctx context.Context, key, expected, wakeKey string) (ok bool, err error) {
	err = s.h.around(ctx, "MetaDeleteNotify", key, func() (string, error) {
		ok, err = s.SQLiteStore.MetaDeleteNotify(ctx, key, expected, wakeKey)
		return fmt.Sprintf("ok=%v", ok), err
	})
	return ok && err == nil, err
}

func (s *sqliteEndHooks) MetaCASNotify(ctx context.Context, key string, expected *string, value string) (ok bool, err error) {
	err = s.h.around(ctx, "MetaCASNotify", key, func() (string, error) {
		ok, err = s.SQLiteStore.MetaCASNotify(ctx, key, expected, value)
		return fmt.Sprintf("ok=%v", ok), err
	})
	return ok && err == nil, err
}

// Faults a hook injects: a reply lost (the call ran), and a fault that a
// retry is expected to clear and that changed nothing (the call did not
// run), as a connection refused or a server out of connection slots gives.
var (
	errReplyLost   = &runlease.StorageError{Op: "MetaBatch", Unknown: true, Err: errors.New("reply lost")}
	errRefusedConn = &runlease.StorageError{Op: "MetaDeleteNotify", Retryable: true, Err: errors.New("connection refused")}
)

// claimEndRace is one moment at which the keeper ends, with the faults
// the calls meet. Its hook sees every call of the round's ClaimSlotsWait
// and of the keeper's Release, one at a time.
type claimEndRace struct {
	name string
	// holdsBack says the race lands the admission late (holdBack): the
	// keeper's Release then writes the lease row only after it landed.
	holdsBack bool
	hook      func(r *claimEndRound, c *endCall)
}

// claimEndRound is the state of one race: the keeper, its Release, and
// what the hook has done so far.
type claimEndRound struct {
	k        *runlease.Keeper
	batch    func([]runlease.Cond, []runlease.Op) (bool, error) // the store's, unhooked
	released chan error                                         // Release's result
	ended    bool
	late     func() // the admission held back, to land after the clean-up looked
	landed   chan struct{}
	deletes  int // the clean-up's deletes of the slot so far
	faults   int // faults injected so far
}

// end releases the keeper in the background, once, and waits until it
// has ended.
func (r *claimEndRound) end() {
	if r.ended {
		return
	}
	r.ended = true
	go func() { r.released <- r.k.Release(context.Background()) }()
	<-r.k.Done()
}

func isSlot(c *endCall) bool { return strings.HasPrefix(c.key, runlease.SlotPrefix) }

var claimEndRaces = []claimEndRace{
	{"ended_before_the_admission_is_sent", false, func(r *claimEndRound, c *endCall) {
		if c.op == "MetaBatch" && c.key != "" && !c.after {
			r.end()
			<-c.ctx.Done() // the wait is cut short before the batch leaves
		}
	}},
	{"ended_as_the_admission_is_sent", false, func(r *claimEndRound, c *endCall) {
		if c.op == "MetaBatch" && c.key != "" && !c.after {
			r.end()
		}
	}},
	{"ended_after_the_admission_landed", false, func(r *claimEndRound, c *endCall) {
		if c.op == "MetaBatch" && c.key != "" && c.after {
			r.end()
		}
	}},
	{"ended_after_the_admission_landed_reply_lost", false, func(r *claimEndRound, c *endCall) {
		r.landedReplyLost(c)
	}},
	{"admission_lands_after_the_clean_up_looked", true, func(r *claimEndRound, c *endCall) {
		r.holdBack(c)
	}},
	{"clean_up_delete_meets_a_fault_that_changed_nothing", false, func(r *claimEndRound, c *endCall) {
		if r.landedReplyLost(c) {
			return
		}
		if r.ended && c.op == "MetaDeleteNotify" && isSlot(c) && !c.after && r.faults == 0 {
			r.faults++
			c.err = errRefusedConn
		}
	}},
	{"clean_up_read_meets_a_fault_that_changed_nothing", true, func(r *claimEndRound, c *endCall) {
		if r.holdBack(c) {
			return
		}
		if c.op == "MetaGet" && isSlot(c) && !c.after && r.faults == 0 {
			r.faults++
			c.err = &runlease.StorageError{Op: "MetaGet", Key: c.key, Retryable: true, Err: errors.New("connection refused")}
		}
	}},
	{"clean_up_second_delete_meets_a_fault_that_changed_nothing", true, func(r *claimEndRound, c *endCall) {
		if r.holdBack(c) {
			return
		}
		if c.op == "MetaDeleteNotify" && isSlot(c) && !c.after && r.deletes == 2 && r.faults == 0 {
			r.faults++
			c.err = errRefusedConn
		}
	}},
	{"release_of_slots_admitted_as_it_ended_meets_a_fault", false, func(r *claimEndRound, c *endCall) {
		if c.op == "MetaBatch" && c.key != "" && c.after {
			r.end()
			return
		}
		if r.ended && c.op == "MetaDeleteNotify" && isSlot(c) && !c.after && r.faults == 0 {
			r.faults++
			c.err = errRefusedConn
		}
	}},
}

// landedReplyLost plays an admission that landed, whose reply is lost as
// the keeper ends: the wait's context has ended by the time the call
// returns, so the lease's read-back cannot resolve it, and the wait's
// clean-up must. It reports whether c was that call.
func (r *claimEndRound) landedReplyLost(c *endCall) bool {
	if c.op != "MetaBatch" || c.key == "" || !c.after || c.err != nil {
		return false
	}
	r.end()
	<-c.ctx.Done()
	c.err = errReplyLost
	return true
}

// holdBack plays an admission whose write is cut short and commits only
// after the clean-up's first delete looked for its rows, before the
// clean-up's read of the slot (which, on Postgres, waits for such a write
// while its backend runs), and before the keeper's Release writes the
// lease row. It reports whether c was one of the calls it played.
func (r *claimEndRound) holdBack(c *endCall) bool {
	switch {
	case c.op == "MetaBatch" && c.key != "" && !c.after && r.late == nil:
		r.end()
		<-c.ctx.Done()
		conds, ops := c.conds, c.ops
		r.late = func() { _, _ = r.batch(conds, ops) }
		c.err = errReplyLost
		return true
	case c.op == "MetaDeleteNotify" && isSlot(c) && !c.after:
		r.deletes++
		return false
	case c.op == "MetaDeleteNotify" && isSlot(c) && c.after && r.deletes == 1:
		r.landLate()
		return true
	case c.op == "MetaGet" && isSlot(c) && !c.after:
		r.landLate()
		return false
	}
	return false
}

// landLate lands the held-back admission, if any, once, and lets the
// keeper's Release write the lease row.
func (r *claimEndRound) landLate() {
	select {
	case <-r.landed:
	default:
		if r.late != nil {
			r.late()
		}
		close(r.landed)
	}
}

// TestAKeeperEndingAtAnyMomentOfItsClaimSlotsWaitLeavesNoSlot releases a
// keeper at each moment of its ClaimSlotsWait's admission: before the
// batch leaves, as it leaves, once it landed (its reply kept or lost), and
// with the batch landing only after the clean-up's delete looked for its
// rows; and with the clean-up meeting, once, a fault that changed nothing
// in its delete, its read or its second delete. The clean-up has its
// bound (leaveTimeout) to retry such a fault: giving up at the first one
// left the slot live for its TTL, with the call returning the keeper's
// Err as if nothing had been admitted.
func TestAKeeperEndingAtAnyMomentOfItsClaimSlotsWaitLeavesNoSlot(t *testing.T) {
	t.Parallel()
	stores := []struct {
		name string
		open func(t *testing.T, h *claimEndHooks) (runlease.Store, func(conds []runlease.Cond, ops []runlease.Op) (bool, error))
	}{
		{"sqlite", func(t *testing.T, h *claimEndHooks) (runlease.Store, func([]runlease.Cond, []runlease.Op) (bool, error)) {
			s := newSQLite(t)
			return &sqliteEndHooks{SQLiteStore: s, h: h}, func(conds []runlease.Cond, ops []runlease.Op) (bool, error) {
				return s.MetaBatch(context.Background(), conds, ops)
			}
		}},
		{"postgres", func(t *testing.T, h *claimEndHooks) (runlease.Store, func([]runlease.Cond, []runlease.Op) (bool, error)) {
			s := pgStore(t, pgtest.Pool(t))
			return &pgEndHooks{PostgresStore: s, h: h}, func(conds []runlease.Cond, ops []runlease.Op) (bool, error) {
				return s.MetaBatch(context.Background(), conds, ops)
			}
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			for _, race := range claimEndRaces {
				t.Run(race.name, func(t *testing.T) {
					t.Parallel()
					h := &claimEndHooks{}
					s, batch := st.open(t, h)
					claimEndRaceOnce(t, s, h, batch, race)
				})
			}
		})
	}
}

func claimEndRaceOnce(t *testing.T, s runlease.Store, h *claimEndHooks, batch func([]runlease.Cond, []runlease.Op) (bool, error), race claimEndRace) {
	ctx := t.Context()
	k := hoKept(t, ctx, s, "r")
	r := &claimEndRound{k: k, batch: batch, released: make(chan error, 1), landed: make(chan struct{})}
	var mu sync.Mutex // the waiter's calls and the Release's see one round
	h.set(func(c *endCall) {
		if race.holdsBack && c.op == "MetaCASNotify" && strings.HasPrefix(c.key, runlease.LeasePrefix) && !c.after {
			<-r.landed // the Release's write of the lease row goes after the late batch
			return
		}
		mu.Lock()
		defer mu.Unlock()
		race.hook(r, c)
	})
	callCtx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	sl, err := k.ClaimSlotsWait(callCtx, []runlease.Scope{runlease.NamedScope("one", 1)}, runlease.WithWaitPoll(runlease.MinWaitPoll))
	mu.Lock()
	r.landLate() // a race that held the batch back lands it now at the latest
	ended := r.ended
	mu.Unlock()
	var rerr error
	if ended {
		rerr = <-r.released
	} else {
		rerr = k.Release(ctx)
	}
	h.set(nil)
	require.NoError(t, rerr, "the keeper's Release")
	if err == nil {
		require.Same(t, sl, k.Slots(), "slots returned are the keeper's")
		require.Empty(t, sl.Held(), "the keeper's Release released them")
	} else {
		require.ErrorIs(t, err, runlease.ErrKeeperStopped)
		require.Nil(t, sl)
		require.Nil(t, k.Slots(), "the keeper took no slots")
	}
	require.Empty(t, liveSlotRows(t, s, "r"), "slots admitted as the keeper ended were left live (ClaimSlotsWait: %v)", err)
	require.Empty(t, hoRunQueued(t, s, "r"), "the run still waits")
}

// liveSlotRows returns the live slot rows of run, key and value.
func liveSlotRows(t *testing.T, s runlease.Store, run string) []string {
	t.Helper()
	var out []string
	for _, key := range hoLive(t, s, run) {
		v, _, err := s.MetaGet(context.Background(), key)
		require.NoError(t, err)
		out = append(out, fmt.Sprintf("%s=%s", key, v))
	}
	return out
}

// callTrace records the store calls of one round, for a failure to show.
type callTrace struct {
	start time.Time
	mu    sync.Mutex
	lines []string
}

func newCallTrace() *callTrace { return &callTrace{start: time.Now()} }

// note records what happened, with the time since the round began.
func (tr *callTrace) note(what string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf("%9s %s", time.Since(tr.start).Round(time.Microsecond), what))
}

// record is a claimEndHooks hook that notes each call and its result.
func (tr *callTrace) record(c *endCall) {
	ended := ""
	if c.ctx.Err() != nil {
		ended = " (its context has ended)"
	}
	if !c.after {
		tr.note(fmt.Sprintf("%s %s%s", c.op, c.key, ended))
		return
	}
	tr.note(fmt.Sprintf("%s %s returned %s, %v%s", c.op, c.key, c.res, c.err, ended))
}

func (tr *callTrace) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.lines, "\n")
}
