package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/areev/runlease"
)

// play runs the scenario step by step. Each step's refusals are the point
// of the demo; an error returned here means the store failed or the library
// did not behave as the scenario expects.
func (d *demo) play() error {
	fmt.Fprintf(d.c.stdout, "runlease demo: five drivers share one embedded store; time is simulated.\n")
	fmt.Fprintf(d.c.stdout, "store %s\nTTL %v; slot limits: mem %d, principal:<name> %d\n\n",
		d.path, demoTTL, demoMemLimit, demoPrincipalLimit)
	a := d.newDriver("driver-a", "reports", "node-a")
	b := d.newDriver("driver-b", "reports", "node-b")
	c := d.newDriver("driver-c", "audit", "node-c")
	x := d.newDriver("driver-d", "adhoc", "node-d")
	e := d.newDriver("driver-e", "cleanup", "node-e")
	steps := []func() error{
		func() error { return d.begin(a, e) },
		func() error { return d.refuse(b) },
		func() error { return d.stall(a) },
		func() error { return d.takeOver(b, a) },
		func() error { return d.wake(a) },
		func() error { return d.fill(c) },
		func() error { return d.overLimit(x) },
		func() error { return d.superstep(b, c, x) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// demoCheckpoint is the key of the nightly-report run's checkpoint, which
// its drivers write with fenced writes (Lease.Write).
const demoCheckpoint = "ckpt:nightly-report"

// unexpected reports a step whose outcome was not the scenario's.
func unexpected(what string, err error) error {
	return fmt.Errorf("demo: %s: the scenario expects a refusal, got %v", what, err)
}

// acquire takes the lease on run for dr.
func (d *demo) acquire(dr *driver, run string) error {
	l, err := runlease.Acquire(d.ctx, d.store, run, dr.holder, d.opts()...)
	if err != nil {
		return err
	}
	dr.lease = l
	d.say("%s (%s) acquires run %s: fence %d, held until %s", dr.name, dr.holder, run, l.Fence(), d.rel(l.Expiry()))
	return nil
}

// claim claims the slots of dr's run in the scopes of principal.
func (d *demo) claim(dr *driver, principal, note string) error {
	s, err := runlease.ClaimSlots(d.ctx, d.store, dr.lease.RunID(), scopes(principal), d.opts()...)
	if err != nil {
		return err
	}
	dr.slots = s
	d.say("%s claims slots for %s: %s%s", dr.name, dr.lease.RunID(), heldSlots(s), note)
	return nil
}

// begin: driver-a starts run nightly-report; driver-e starts a run and dies.
func (d *demo) begin(a, e *driver) error {
	if err := d.acquire(a, "nightly-report"); err != nil {
		return err
	}
	if err := d.claim(a, "reports", ""); err != nil {
		return err
	}
	if err := d.acquire(e, "cleanup-tmp"); err != nil {
		return err
	}
	d.detail("then %s's process dies: nobody will renew cleanup-tmp", e.name)
	return nil
}

// refuse: a second driver wants the same run and is told when to retry.
func (d *demo) refuse(b *driver) error {
	d.until(5 * time.Second)
	_, err := runlease.Acquire(d.ctx, d.store, "nightly-report", b.holder, d.opts()...)
	var lost *runlease.LeaseLostError
	if !errors.As(err, &lost) {
		return unexpected("driver-b acquires nightly-report", err)
	}
	d.say("%s (%s) tries run nightly-report: refused", b.name, b.holder)
	d.detail("%v", err)
	d.detail("takeover possible at %s, in %s", d.rel(lost.Until), shortDuration(lost.Until.Sub(d.clock.Now())))
	return nil
}

// stall: driver-a checkpoints once, then stops renewing until its lease
// expires.
func (d *demo) stall(a *driver) error {
	d.until(10 * time.Second)
	if err := a.lease.Write(d.ctx, runlease.Put(demoCheckpoint, "step 1 done by driver-a")); err != nil {
		return err
	}
	if err := a.slots.Renew(d.ctx); err != nil {
		return err
	}
	d.say("%s checkpoints step 1 with a fenced write, which renews its lease: held until %s",
		a.name, d.rel(a.lease.Expiry()))
	d.say("%s stalls (a long GC pause, a frozen VM) and stops renewing", a.name)
	d.until(40 * time.Second)
	info, err := runlease.Peek(d.ctx, d.store, "nightly-report", runlease.WithClock(d.clock.Now))
	if err != nil {
		return err
	}
	d.say("%s's lease expires: \"runlease peek nightly-report\" now says %s (exit status %d)",
		a.name, leaseState(info), exitFree)
	return nil
}

// takeOver: the waiting driver takes the run over at a higher fence.
func (d *demo) takeOver(b, a *driver) error {
	d.until(41 * time.Second)
	if err := d.acquire(b, "nightly-report"); err != nil {
		return err
	}
	d.detail("a takeover: fence %d is higher than %s's fence %d", b.lease.Fence(), a.name, a.lease.Fence())
	if err := d.claim(b, "reports", " (the run's own slots, expired)"); err != nil {
		return err
	}
	ckpt, _, err := d.store.MetaGet(d.ctx, demoCheckpoint)
	if err != nil {
		return err
	}
	if err := b.lease.Write(d.ctx, runlease.Put(demoCheckpoint, "step 2 done by driver-b")); err != nil {
		return err
	}
	d.say("%s resumes after %q and checkpoints step 2 at fence %d", b.name, ckpt, b.lease.Fence())
	return nil
}

// wake: the stalled driver resumes where it stopped and learns, from its
// checkpoint and its renewal, that it must stop.
func (d *demo) wake(a *driver) error {
	d.until(42 * time.Second)
	err := a.lease.Write(d.ctx, runlease.Put(demoCheckpoint, "step 2 done by driver-a"))
	if !errors.Is(err, runlease.ErrLeaseLost) {
		return unexpected("driver-a's checkpoint after the takeover", err)
	}
	d.say("%s wakes up and checkpoints step 2 at fence %d: refused", a.name, a.lease.Fence())
	d.detail("%v", err)
	ckpt, _, err := d.store.MetaGet(d.ctx, demoCheckpoint)
	if err != nil {
		return err
	}
	d.detail("nothing was written: the checkpoint is still %q", ckpt)
	err = a.lease.Renew(d.ctx)
	if !errors.Is(err, runlease.ErrLeaseLost) {
		return unexpected("driver-a renews after the takeover", err)
	}
	d.say("%s renews: refused (%s); it stops: it must not advance the run at fence %d",
		a.name, runlease.Code(err), a.lease.Fence())
	return nil
}

// fill: a third driver's run takes the last free slot of scope mem.
func (d *demo) fill(c *driver) error {
	d.until(45 * time.Second)
	if err := d.acquire(c, "weekly-audit"); err != nil {
		return err
	}
	return d.claim(c, "audit", fmt.Sprintf("; mem is full (%d of %d)", demoMemLimit, demoMemLimit))
}

// overLimit: a run beyond the limit of scope mem is refused its slots.
func (d *demo) overLimit(x *driver) error {
	d.until(46 * time.Second)
	if err := d.acquire(x, "adhoc-export"); err != nil {
		return err
	}
	_, err := runlease.ClaimSlots(d.ctx, d.store, "adhoc-export", scopes("adhoc"), d.opts()...)
	var full *runlease.ConcurrencyLimitError
	if !errors.As(err, &full) {
		return unexpected("driver-d claims slots", err)
	}
	d.say("%s claims slots for adhoc-export: refused", x.name)
	d.detail("%v", err)
	if err := x.lease.Release(d.ctx); err != nil {
		return err
	}
	d.detail("%s holds no slot (claims are all or nothing); it releases its lease to retry later", x.name)
	return nil
}
