package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// FaultKind says where in a write an injected fault strikes.
type FaultKind int

const (
	// NoFault disarms a fault that has not struck yet.
	NoFault FaultKind = iota
	// FaultBeforeApply makes the next write fail without changing anything,
	// as when no connection can be made or storage refuses the commit.
	FaultBeforeApply
	// FaultAfterApply makes the next write take effect and then fail, as
	// when its reply is lost after the commit or its context ends while it
	// commits.
	FaultAfterApply
)

// String returns the kind's name, as the suite's messages use it.
func (k FaultKind) String() string {
	switch k {
	case NoFault:
		return "no fault"
	case FaultBeforeApply:
		return "a fault before the write applies"
	case FaultAfterApply:
		return "a fault after the write applies"
	}
	return "FaultKind(" + strconv.Itoa(int(k)) + ")"
}

// Fault is a fault the suite asks a store to suffer on its next write.
type Fault struct {
	// Kind is where the fault strikes; NoFault disarms.
	Kind FaultKind
	// Cancel ends the context of the write the fault is meant for. A store
	// whose faults are a context that ends at the wrong moment calls it when
	// the fault strikes (an embedded store, during its commit); one that
	// fails in its own way ignores it. It is nil for NoFault.
	Cancel context.CancelFunc
}

// FaultyStore is a store under test with the means to make its writes
// fail; see [Harness].Faulty.
type FaultyStore struct {
	// Store is a fresh, empty store that no other subtest uses.
	Store runlease.Store
	// Inject arms f for the next write through Store (a MetaCAS,
	// MetaDelete, MetaBatch or MetaCASMany whose arguments are valid),
	// replacing any fault armed before; Inject(Fault{}) disarms it. The
	// suite makes that write at once, then disarms, then reads the keys back
	// through Store. A fault that does not always strike is allowed (the
	// suite tries again), but one that never does fails the subtest. Inject
	// is only called from one goroutine at a time.
	Inject func(f Fault)
}

// faultTries is how many times a fault subtest tries each kind of write
// until the injected fault surfaces as an error.
const faultTries = 20

func testFaultLabels(t *testing.T, h Harness) {
	t.Run("a_fault_before_a_write_applies_is_labelled_truthfully", func(t *testing.T) {
		t.Parallel()
		testInjected(t, h, FaultBeforeApply)
	})
	t.Run("a_write_applied_before_a_fault_is_labelled_unknown", func(t *testing.T) {
		t.Parallel()
		testInjected(t, h, FaultAfterApply)
	})
	t.Run("a_write_cut_short_by_its_context_is_labelled_truthfully", parallel(h.New, testCutWrites))
}

// testInjected makes each kind of write suffer a fault of kind, and checks
// each outcome against what storage holds afterwards.
func testInjected(t *testing.T, h Harness, kind FaultKind) {
	if h.Faulty == nil {
		t.Skip("Harness.Faulty is not set: set it to check how the store labels the outcome of a failed write")
	}
	fs := h.Faulty(t)
	require.NotNil(t, fs.Store, "Harness.Faulty returned a nil Store")
	require.NotNil(t, fs.Inject, "Harness.Faulty returned a nil Inject")
	struck := 0
	for _, c := range writeCases(fs.Store) {
		for try := range faultTries {
			p := fmt.Sprintf("fault/%s/%d/", c.name, try)
			c.prepare(t, fs.Store, p)
			ctx, cancel := context.WithCancel(t.Context())
			fs.Inject(Fault{Kind: kind, Cancel: cancel})
			ok, err := c.write(ctx, fs.Store, p)
			fs.Inject(Fault{})
			cancel()
			judge(t, c, kind.String(), ok, err, c.effect(t, fs.Store, p))
			if err != nil {
				t.Logf("%s: %s struck on try %d: %v", c.name, kind, try+1, err)
				struck++
				break
			}
		}
	}
	require.Positive(t, struck, "%s never surfaced as an error, in %d tries of each write: Harness.Faulty's Inject does not reach the store", kind, faultTries)
}

// testCutWrites gives writes a deadline within twice the time such a write
// takes, so that some contexts end before, some during and some after the
// call, and checks
// every outcome against storage. (The cancelled_context group checks that
// the errors match the context's.)
func testCutWrites(t *testing.T, s runlease.Store) {
	failed := 0
	cutRounds(t, s, func(c writeCase, p string, cut func() (context.Context, context.CancelFunc)) {
		ctx, cancel := cut()
		ok, err := c.write(ctx, s, p)
		cancel()
		judge(t, c, "a context that ended", ok, err, c.effect(t, s, p))
		if err != nil {
			failed++
		}
	})
	t.Logf("%d of %d writes were cut short", failed, cutCalls())
}

// effect is what a write did, as read back from storage afterwards.
type effect int

const (
	effectNone effect = iota // storage is as it was before the write
	effectAll                // every change the write asked for is there
	effectPart               // some of them are
)

func (e effect) String() string {
	return [...]string{"nothing changed", "the write applied", "the write applied in part"}[e]
}

// judge checks the outcome of a write whose conditions held: a call that
// returned no error must have applied it, and a fault must be a
// *StorageError whose label agrees with what storage shows.
func judge(t *testing.T, c writeCase, with string, ok bool, err error, e effect) {
	t.Helper()
	if err == nil {
		assert.True(t, ok && e == effectAll, "%s with %s returned (%v, nil) for a write whose conditions held, and storage shows %s",
			c.name, with, ok, e)
		return
	}
	var se *runlease.StorageError
	if !assert.True(t, errors.As(err, &se), "%s with %s: every fault must be a *runlease.StorageError, got %T: %v", c.name, with, err, err) {
		return
	}
	if !se.Unknown {
		assert.Equal(t, effectNone, e, "%s with %s failed with a fault labelled not applied (Unknown false), but storage shows %s: %v",
			c.name, with, e, err)
	}
	if c.atomic {
		assert.NotEqual(t, effectPart, e, "%s with %s failed and was applied in part: %v", c.name, with, err)
	}
}
