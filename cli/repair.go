package cli

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"

	"github.com/areev/runlease"
)

const repairHelp = `
Repair replaces a corrupt lease row, one that does not parse, which nobody
can take over and that release and prune leave alone. It shows the row,
asks for confirmation when stdin is a terminal (unless --yes), then writes
a released tombstone at the fence given with --fence, conditional on the
exact corrupt text: if the row changed since it was shown, nothing is
written (RUN-E021). The next holder of the run gets fence N+1.

The fence must not be lower than any fence the run may have had, or a
system that checks fences would accept a stalled old holder's writes over
the next holder's. Repair reads what it can of the row: when it shows a
fence ("fence":17), --fence must be at least that. When it shows none, or
its digits are cut off at the end of the row, no lower bound is known, and
repair refuses to guess: find the highest fence that outside systems saw
for the run, give a --fence at least that high, and confirm that you did
with --fence-unknown.

--slot KEY repairs a corrupt slot row instead (such as runslot:mem:3),
which blocks its slot: a slot row's fence is a claim id, not an order,
so the row is deleted, conditional on its exact text.

It needs the store's writer: an embedded store that a driver has open is
refused with RUN-E010. Answering no at the prompt changes nothing and exits
1; a run or slot whose row parses, or that has no row, is a usage error
(exit status 2).
`

type repairOpts struct {
	store        storeFlags
	fence        uint64
	fenceUnknown bool
	slot         string
	yes          bool
}

func (c *cli) repair(args []string) error {
	var o repairOpts
	fs := c.newFlags("repair", "--fence N [flags] RUN | --slot KEY [flags]", repairHelp)
	c.registerStore(fs.FlagSet, &o.store)
	fs.Uint64Var(&o.fence, "fence", 0, "required with a RUN: the tombstone's fence `N`, at least any fence the run may have had")
	fs.BoolVar(&o.fenceUnknown, "fence-unknown", false, "the row shows no fence: confirm that --fence is above every fence outside systems saw")
	fs.StringVar(&o.slot, "slot", "", "repair the corrupt slot row at `KEY` (it is deleted) instead of a lease")
	fs.BoolVar(&o.yes, "yes", false, "do not ask for confirmation on a terminal")
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case o.slot != "" && len(pos) > 0:
		return usagef("repair", "give a RUN or --slot KEY, not both")
	case o.slot != "" && (flagSet(fs.FlagSet, "fence") || o.fenceUnknown):
		return usagef("repair", "a slot row has no fence: --slot takes no --fence")
	case o.slot == "" && len(pos) != 1:
		return usagef("repair", "want one RUN argument (or --slot KEY), got %d", len(pos))
	case o.slot == "" && !flagSet(fs.FlagSet, "fence"):
		return usagef("repair", "--fence N is required: the tombstone's fence, at least any fence run %q may have had", pos[0])
	case o.slot == "" && (o.fence == 0 || o.fence == math.MaxUint64):
		return usagef("repair", "--fence %d: give a fence from 1 to %d", o.fence, uint64(math.MaxUint64-1))
	}
	s, err := c.open(fs.FlagSet, &o.store, readWrite)
	if err != nil {
		return err
	}
	defer s.close()
	if o.slot != "" {
		return c.repairSlot(s, o)
	}
	return c.repairLease(s, pos[0], o)
}

// fenceField matches a fence the text of a corrupt row still shows.
var fenceField = regexp.MustCompile(`(?i)fence"?\s*[:=]\s*"?(\d+)`)

// fenceBound returns the highest fence that row shows, and whether that is
// a lower bound of every fence the run may have had: it is not when the
// row shows none, or when its digits run to the end of the row, which may
// have been cut off in the middle of the number.
func fenceBound(row string) (bound uint64, known bool) {
	for _, m := range fenceField.FindAllStringSubmatchIndex(row, -1) {
		if m[1] == len(row) {
			return 0, false
		}
		n, err := strconv.ParseUint(row[m[2]:m[3]], 10, 64)
		if err != nil {
			n = math.MaxUint64 // more digits than a fence can have
		}
		bound, known = max(bound, n), true
	}
	return bound, known
}

// repairLease shows the corrupt lease row of runID, checks o.fence against
// what the row shows, confirms, and writes the tombstone over exactly that
// row.
func (c *cli) repairLease(s *openedStore, runID string, o repairOpts) error {
	ctx, cancel := c.step(&o.store)
	defer cancel()
	now := s.now()
	info, err := runlease.Peek(ctx, s.s, runID, at(now))
	cancel()
	switch {
	case err != nil && !errors.Is(err, runlease.ErrCorruptRow):
		return err
	case !info.Found:
		return fmt.Errorf("%w: run %q has no lease row in %s; nothing to repair",
			runlease.ErrInvalidArgument, runID, s.name)
	case !info.Corrupt:
		return fmt.Errorf("%w: the lease row of run %q parses (%s, fence %d); repair only replaces corrupt rows: "+
			"see \"runlease release --help\"", runlease.ErrInvalidArgument, runID, leaseState(info), info.Fence)
	}
	bound, known := fenceBound(info.Row)
	refusal := checkFence(o, runID, bound, known)
	tomb := fmt.Sprintf(`{"holder":"","fence":%d,"until_ms":%d}`, o.fence, now.UnixMilli())
	tw := newTable(c.stdout)
	fmt.Fprintf(tw, "run\t%s\n", runID)
	fmt.Fprintf(tw, "state\t%s\n", stateCorrupt)
	fmt.Fprintf(tw, "row\t%q\n", info.Row)
	if known {
		fmt.Fprintf(tw, "fence\tthe row shows fence %d\n", bound)
	} else {
		fmt.Fprintf(tw, "fence\tunknown: the row shows no whole fence\n")
	}
	// The row is shown either way, to find the fence by; the tombstone
	// only when repair is going to write it.
	if refusal == nil {
		fmt.Fprintf(tw, "tombstone\t%s\n", tomb)
	}
	tw.Flush()
	fmt.Fprintln(c.stdout)
	if refusal != nil {
		return refusal
	}
	if !o.yes && !c.confirm(fmt.Sprintf("replace the corrupt row of run %s by a released tombstone at fence %d?", runID, o.fence)) {
		return errAborted
	}
	ctx, cancel = c.step(&o.store)
	defer cancel()
	ok, err := s.s.MetaCAS(ctx, runlease.LeasePrefix+runID, &info.Row, tomb)
	switch {
	case err != nil:
		return err
	case !ok:
		return withHint(&runlease.LeaseLostError{RunID: runID, Cause: runlease.ErrRowChanged},
			"the row changed since it was shown; nothing was written. Run repair again to see it")
	}
	fmt.Fprintf(c.stdout, "repaired run %s: released at fence %d; the next holder gets fence %d\n",
		runID, o.fence, o.fence+1)
	return nil
}

// checkFence refuses o.fence for the lease of runID when it is below the
// bound that the row shows, or when no bound is known and the operator did
// not say --fence-unknown.
func checkFence(o repairOpts, runID string, bound uint64, known bool) error {
	switch {
	case known && o.fence < bound:
		return fmt.Errorf("%w: --fence %d is lower than fence %d, which the row shows; give --fence %d or higher",
			runlease.ErrInvalidArgument, o.fence, bound, bound)
	case !known && !o.fenceUnknown:
		return fmt.Errorf("%w: the row shows no whole fence, so repair cannot check --fence %d: find the highest "+
			"fence that outside systems saw for run %q, and give --fence at least that high with --fence-unknown",
			runlease.ErrInvalidArgument, o.fence, runID)
	}
	return nil
}

// repairSlot shows the corrupt slot row at o.slot, confirms, and deletes
// exactly that row.
func (c *cli) repairSlot(s *openedStore, o repairOpts) error {
	ctx, cancel := c.step(&o.store)
	defer cancel()
	slots, err := runlease.Occupancy(ctx, s.s, at(s.now()))
	if err != nil {
		return err
	}
	raw, found, err := s.s.MetaGet(ctx, o.slot)
	cancel()
	if err != nil {
		return err
	}
	corrupt := false
	for _, sl := range slots {
		corrupt = corrupt || sl.Key == o.slot && sl.Corrupt
	}
	switch {
	case !found:
		return fmt.Errorf("%w: no slot row at %q in %s; nothing to repair", runlease.ErrInvalidArgument, o.slot, s.name)
	case !corrupt:
		return fmt.Errorf("%w: the row at %q is not a corrupt slot row; repair --slot only deletes those",
			runlease.ErrInvalidArgument, o.slot)
	}
	tw := newTable(c.stdout)
	fmt.Fprintf(tw, "slot\t%s\n", o.slot)
	fmt.Fprintf(tw, "row\t%q\n", raw)
	tw.Flush()
	fmt.Fprintln(c.stdout)
	if !o.yes && !c.confirm(fmt.Sprintf("delete the corrupt slot row %s?", o.slot)) {
		return errAborted
	}
	ctx, cancel = c.step(&o.store)
	defer cancel()
	ok, err := s.s.MetaDelete(ctx, o.slot, raw)
	switch {
	case err != nil:
		return err
	case !ok:
		return withHint(fmt.Errorf("%s: the slot row at %q changed since it was shown; nothing was deleted",
			runlease.CodeLeaseLost, o.slot), "run repair again to see it")
	}
	fmt.Fprintf(c.stdout, "repaired slot %s: the corrupt row is deleted and the slot is free\n", o.slot)
	return nil
}
