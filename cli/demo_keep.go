package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/areev/runlease"
)

// The superstep: two drivers hand their leases to keepers and work for
// demoSuperstep of simulated time, longer than the TTL, in demoKeepSteps
// steps; after each, the demo waits (a few real milliseconds) until both
// keepers have renewed at the new simulated time.
const (
	demoSuperstep = 60 * time.Second
	demoKeepSteps = 4
)

// renewal is a keeper's report of one renewal: the lease's expiry right
// after it, read on the keeper's goroutine before the next renewal starts.
type renewal struct {
	dr    *driver
	until time.Time
	err   error
}

// keep starts a keeper for dr's lease and slots that reports each renewal
// on d.events.
func (d *demo) keep(dr *driver) (*runlease.Keeper, error) {
	report := func(ev runlease.RenewEvent) {
		select {
		case d.events <- renewal{dr: dr, until: dr.lease.Expiry(), err: ev.Err}:
		default: // the demo is not waiting; a later renewal will report
		}
	}
	return runlease.Keep(d.ctx, dr.lease, runlease.KeepInterval(demoKeepInterval),
		runlease.KeepSlots(dr.slots), runlease.WithHooks(runlease.Hooks{Renewed: report}))
}

// superstep: keepers hold two runs through work longer than the TTL, and a
// third driver is refused one of them midway.
func (d *demo) superstep(b, c, x *driver) error {
	d.until(50 * time.Second)
	kb, err := d.keep(b)
	if err != nil {
		return err
	}
	defer kb.Stop()
	kc, err := d.keep(c)
	if err != nil {
		return err
	}
	defer kc.Stop()
	d.say("%s and %s hand their leases to keepers (runlease.Keep) and run a %s superstep",
		b.name, c.name, shortDuration(demoSuperstep))
	for i := 1; i <= demoKeepSteps; i++ {
		d.clock.Advance(demoSuperstep / demoKeepSteps)
		if err := d.awaitRenewals(b, c); err != nil {
			return err
		}
		d.say("keepers renewed %s and %s with their slots: held until %s",
			b.lease.RunID(), c.lease.RunID(), d.rel(c.lease.Expiry()))
		if i == demoKeepSteps/2 {
			if err := d.intrude(x, c); err != nil {
				return err
			}
		}
	}
	kb.Stop()
	kc.Stop()
	d.say("superstep done after %s, twice the TTL; neither lease lapsed", shortDuration(demoSuperstep))
	d.detail("the keepers stop; the leases stay held until they expire or are released")
	return nil
}

// awaitRenewals waits until every driver's keeper has renewed at the
// current simulated time.
func (d *demo) awaitRenewals(drivers ...*driver) error {
	want := d.clock.Now().Add(demoTTL)
	pending := map[*driver]bool{}
	for _, dr := range drivers {
		pending[dr] = true
	}
	timeout := time.NewTimer(demoStepTimeout)
	defer timeout.Stop()
	for len(pending) > 0 {
		select {
		case r := <-d.events:
			if r.err != nil {
				return fmt.Errorf("demo: the keeper of %s failed to renew: %w", r.dr.name, r.err)
			}
			if !r.until.Before(want) {
				delete(pending, r.dr)
			}
		case <-timeout.C:
			return fmt.Errorf("demo: the keepers did not renew within %v", demoStepTimeout)
		case <-d.ctx.Done():
			return d.ctx.Err()
		}
	}
	return nil
}

// intrude: a driver wants a run whose keeper holds it, and is refused.
func (d *demo) intrude(x, c *driver) error {
	_, err := runlease.Acquire(d.ctx, d.store, c.lease.RunID(), x.holder, d.opts()...)
	var lost *runlease.LeaseLostError
	if !errors.As(err, &lost) {
		return unexpected("driver-d acquires a kept run", err)
	}
	d.say("%s tries run %s: refused (%s): its keeper holds it at fence %d until %s",
		x.name, c.lease.RunID(), runlease.Code(err), lost.Fence, d.rel(lost.Until))
	return nil
}
