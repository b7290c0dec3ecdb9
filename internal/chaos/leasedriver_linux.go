package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/history"
)

// Sink is the downstream system of the lease test: one row per run,
// holding the (fence, seq) of the last superstep written, outside runlease.
// A fenced sink applies a write only when the row's fence is at most the
// write's, in one atomic step of its own (an UPDATE … WHERE fence <= $2, an
// etcd Txn comparing the stored value); the sink of [BreakDownUnfenced]
// applies every write.
type Sink interface {
	// Put writes (fence, seq) as run's row and reports whether it was
	// applied: false, nil when the fence condition refused it. An error
	// means the write may or may not have been applied.
	Put(ctx context.Context, run string, fence uint64, seq int) (applied bool, err error)
}

// LeaseTest is the shape of the lease chaos test, the same on every store:
// Procs child processes of Drivers drivers each compete for Runs runs with
// leases of TTL, kept by a Keeper at its default interval (TTL/3). The
// parent side is [LeaseTest.Run]; the children run [LeaseTest.Child].
type LeaseTest struct {
	Procs, Drivers, Runs int
	TTL                  time.Duration
	// Bound is the takeover latency that 99% of takeovers must beat,
	// counted from the fault.
	Bound time.Duration
}

// RunName is the id of run i.
func RunName(i int) string { return fmt.Sprintf("run-%d", i) }

// Child runs one process's drivers until r.StopAt: driver g drives run g
// mod Runs, writing downstream to r.Down.
func (lt LeaseTest) Child(r *Run) {
	mode := BreakMode()
	var wg sync.WaitGroup
	for g := range lt.Drivers {
		d := &leaseDriver{r: r, ttl: lt.TTL, run: RunName(g % lt.Runs), mode: mode,
			holder: runlease.HolderFor("chaos", fmt.Sprintf("gen%d-slot%d-d%d", r.Gen, r.Slot, g))}
		wg.Go(func() {
			for time.Now().Before(r.StopAt) {
				d.tenure()
			}
		})
	}
	wg.Wait()
}

// leaseDriver is one run driver. Pinning each driver to one run keeps two
// drivers of every process waiting on every run, so a takeover never waits
// for a driver to come round to the run: its latency measures the lease.
type leaseDriver struct {
	r      *Run
	ttl    time.Duration
	run    string
	holder string
	mode   string
}

// ignoresKeeper reports whether this driver is a broken one that acts
// whatever its keeper says.
func (d *leaseDriver) ignoresKeeper() bool { return d.mode != "" }

// tenure acquires the run, advances it a few supersteps and releases it.
func (d *leaseDriver) tenure() {
	acqCtx, cancel := context.WithDeadline(d.r.Ctx, d.r.StopAt)
	defer cancel()
	t0 := history.Mono()
	lease, err := runlease.AcquireWait(acqCtx, d.r.Store, d.run, d.holder, runlease.WithTTL(d.ttl))
	t1 := history.Mono() // after Acquire returned: see Tenure
	if err != nil {
		// A deadline counts as ended once it has passed, before the
		// context's own timer says so: AcquireWait then returns the
		// deadline's error, which is the end of the tenures, not a fault.
		if acqCtx.Err() == nil && time.Now().Before(d.r.StopAt) {
			d.r.Out.Errorf("acquire %s: %v", d.run, err)
			Sleep(acqCtx, 100*time.Millisecond)
		}
		return
	}
	// Keep is given the process's context, not acqCtx: the run must not
	// stop renewing when the time to start new tenures is over.
	keeper, err := runlease.Keep(d.r.Ctx, lease)
	if err != nil {
		d.r.Out.Errorf("keep %s at fence %d: %v", d.run, lease.Fence(), err)
		return
	}
	d.emit(Event{Kind: KindGrant, T0: t0, T1: t1, Trust: d.trust(keeper)}, lease)
	why := d.supersteps(lease, keeper)
	// Read before Release is called, and after the loss was seen: the
	// earliest of this and TrustedUntil ends the trusted window.
	stop := history.Mono()
	d.emit(Event{Kind: KindEnd, T0: stop, Trust: d.trust(keeper), Res: why}, lease)
	relCtx, cancel := context.WithTimeout(d.r.Ctx, 20*time.Second)
	defer cancel()
	if err := keeper.Release(relCtx); err != nil && !errors.Is(err, runlease.ErrLeaseLost) {
		d.r.Out.Errorf("release %s at fence %d: %v", d.run, lease.Fence(), err)
	}
}

// supersteps advances the run 2 to 4 steps: work, a downstream write, a
// checkpoint. A correct driver, as the README shows one, works under
// keeper.Context() and stops at the first sign of loss: the context ends,
// a fenced write is refused. A driver resumed from a pause may still begin
// a write before the keeper's goroutine has run and cancelled the context;
// the test counts those writes (zombie acts) and the fences must refuse
// them. It returns why it stopped.
func (d *leaseDriver) supersteps(lease *runlease.Lease, keeper *runlease.Keeper) string {
	ctx := keeper.Context()
	if d.ignoresKeeper() {
		ctx = d.r.Ctx
	}
	steps := 2 + rand.IntN(3)
	for seq := 1; seq <= steps && time.Now().Before(d.r.StopAt); seq++ {
		if !Sleep(ctx, time.Duration(100+rand.IntN(500))*time.Millisecond) {
			return Reason(keeper.Err())
		}
		if res := d.downstream(ctx, lease, seq); res != ResOK && !d.ignoresKeeper() {
			return "downstream " + res
		}
		if res := d.checkpoint(ctx, lease, keeper, seq); res != ResOK && !d.ignoresKeeper() {
			return "checkpoint " + res
		}
	}
	if err := keeper.Err(); err != nil && !d.ignoresKeeper() {
		return Reason(err)
	}
	return "release"
}

// downstream writes the step to the sink, which refuses a fence lower than
// the one it holds.
func (d *leaseDriver) downstream(ctx context.Context, lease *runlease.Lease, seq int) string {
	t0 := history.Mono()
	applied, err := d.r.Down.Put(ctx, d.run, lease.Fence(), seq)
	t1 := history.Mono()
	res := ResRefused
	switch {
	case err != nil: // cancelled or failed in flight: it may have been applied
		res = ResUnknown
	case applied:
		res = ResOK
	}
	d.emit(Event{Kind: KindDown, Seq: seq, T0: t0, T1: t1, Res: res}, lease)
	return res
}

// checkpoint writes the step's checkpoint, and its entry in the checkpoint
// log, with lease.Write: atomically with a renewal of the lease, or not at
// all.
func (d *leaseDriver) checkpoint(ctx context.Context, lease *runlease.Lease, keeper *runlease.Keeper, seq int) string {
	trust := d.trust(keeper)
	key, value := CkptKey(d.run), CkptValue(lease.Fence(), seq)
	logKey := CkptLogKey(d.run, lease.Fence(), seq)
	t0 := history.Mono()
	var res string
	if d.mode == BreakCkptUnfenced {
		res = d.unfencedCheckpoint(ctx, key, value, logKey)
	} else {
		err := lease.Write(ctx, runlease.Put(key, value), runlease.Put(logKey, d.holder))
		res = ResOK
		switch {
		case runlease.IsOutcomeUnknown(err):
			// Also when the lease is lost: the checkpoint may have
			// landed just before (a keeper that ended cut the call short).
			res = ResUnknown
		case errors.Is(err, runlease.ErrLeaseLost):
			res = ResLost
		case err != nil:
			res = ResUnknown
		}
	}
	t1 := history.Mono()
	d.emit(Event{Kind: KindCkpt, Seq: seq, T0: t0, T1: t1, Trust: trust, Res: res}, lease)
	return res
}

// unfencedCheckpoint is the broken checkpoint of BreakCkptUnfenced: a read
// and a compare-and-swap on the checkpoint key alone, which nothing ties to
// the lease.
func (d *leaseDriver) unfencedCheckpoint(ctx context.Context, key, value, logKey string) string {
	cur, found, err := d.r.Store.MetaGet(ctx, key)
	if err != nil {
		return ResUnknown
	}
	var expected *string
	if found {
		expected = &cur
	}
	ok, err := d.r.Store.MetaCAS(ctx, key, expected, value)
	switch {
	case err != nil:
		return ResUnknown
	case !ok:
		return ResLost
	}
	if _, err := d.r.Store.MetaCAS(ctx, logKey, nil, d.holder); err != nil {
		return ResUnknown
	}
	return ResOK
}

// trust returns the keeper's TrustedUntil on the Mono clock, or 0 for a
// driver that does not consult it.
func (d *leaseDriver) trust(k *runlease.Keeper) int64 {
	if d.mode == BreakIgnoreKeeper {
		return 0
	}
	return MonoOf(k.TrustedUntil())
}

func (d *leaseDriver) emit(ev Event, lease *runlease.Lease) {
	ev.Run, ev.Holder, ev.Fence = d.run, d.holder, lease.Fence()
	d.r.Out.Emit(ev)
}
