package cli

import (
	"errors"
	"fmt"

	"github.com/areev/runlease"
)

const releaseHelp = `
Release force-releases a stuck lease: it shows the lease row, asks for
confirmation when stdin is a terminal (unless --yes), then writes a released
tombstone over exactly that row. The fence is kept, so the next holder gets
a higher one and outside systems still refuse the old holder's writes. If
the row changed since it was shown (the holder renewed, or another driver
took over), nothing is written and release fails with RUN-E021; if its
holder released it meanwhile, release says so and succeeds.

The old holder learns of the release at its next renewal (RUN-E021, lease
released) and must stop then; until that renewal it may still be working.

It needs the store's writer: an embedded store that a driver has open is
refused with RUN-E010; stop the driver, or use a shared Postgres store.
Refuses to run without --force. Answering no at the prompt changes nothing
and exits 1. Releasing a lease that is already released does nothing and
succeeds.
`

func (c *cli) release(args []string) error {
	var sf storeFlags
	var force, yes bool
	fs := c.newFlags("release", "--force [flags] RUN", releaseHelp)
	c.registerStore(fs.FlagSet, &sf)
	fs.BoolVar(&force, "force", false, "required: release a lease its holder did not give up")
	fs.BoolVar(&yes, "yes", false, "do not ask for confirmation on a terminal")
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) != 1:
		return usagef("release", "want one RUN argument, got %d", len(pos))
	case !force:
		return usagef("release", "refusing without --force: another driver may take run %q over "+
			"while its holder still runs", pos[0])
	}
	s, err := c.open(fs.FlagSet, &sf, readWrite)
	if err != nil {
		return err
	}
	defer s.close()
	return c.forceRelease(&sf, s, pos[0], yes)
}

// forceRelease shows the lease of runID, confirms, and releases it
// conditional on the row shown.
func (c *cli) forceRelease(sf *storeFlags, s *openedStore, runID string, yes bool) error {
	ctx, cancel := c.step(sf)
	defer cancel()
	now := s.now()
	info, err := runlease.Peek(ctx, s.s, runID, at(now))
	cancel()
	if err != nil {
		return err
	}
	if !info.Found {
		return fmt.Errorf("%w: run %q has no lease row in %s; nothing to release",
			runlease.ErrInvalidArgument, runID, s.name)
	}
	writeLeaseDetail(c.stdout, info, now)
	fmt.Fprintln(c.stdout)
	if info.Released {
		fmt.Fprintf(c.stdout, "run %s is already released (fence %d); nothing to do\n", runID, info.Fence)
		return nil
	}
	if info.Live {
		fmt.Fprintf(c.stdout, "warning: %s may still be running; it learns of the release at its next renewal\n", info.Holder)
	}
	if !yes {
		if !c.confirm(fmt.Sprintf("release run %s held by %s at fence %d?", runID, info.Holder, info.Fence)) {
			return errAborted
		}
	}
	ctx, cancel = c.step(sf)
	defer cancel()
	wrote, err := runlease.ForceReleaseOutcome(ctx, s.s, info)
	if runlease.IsOutcomeUnknown(err) {
		if now, perr := runlease.Peek(ctx, s.s, runID); perr == nil && now.Released && now.Fence >= info.Fence {
			fmt.Fprintf(c.stdout, "run %s is released (fence %d kept), by this command or by its holder at the same moment: "+
				"the reply was lost and the two write the same row\n", runID, now.Fence)
			return nil
		}
	}
	if err != nil {
		if errors.Is(err, runlease.ErrLeaseLost) {
			return withHint(err, "the row changed since it was shown; nothing was written. Run peek again")
		}
		return err
	}
	if !wrote {
		fmt.Fprintf(c.stdout, "run %s was already released meanwhile (fence %d or above); nothing to do\n",
			runID, info.Fence)
		return nil
	}
	fmt.Fprintf(c.stdout, "released run %s: fence %d kept; the next holder continues above it\n",
		runID, info.Fence)
	return nil
}
