package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
)

const pruneHelp = `
Prune removes lease rows that were released or expired, and slot rows,
admission-queue rows (entries of waiters that died or stalled) and
fair-share marks that expired, longer than DURATION ago. Live rows and
corrupt rows are never removed, and each delete is conditional on the row
read, so a lease taken (or a queue entry renewed) meanwhile stays. It lists
what it would remove first, then asks for confirmation when stdin is a
terminal (unless --yes; answering no exits 1); --dry-run only lists it.

` + fenceWarning + `

DURATION is a Go duration (90m, 36h) or a number of days (7d). Removing
needs the store's writer (an embedded store that a driver has open is
refused with RUN-E010); --dry-run only reads.
`

// fenceWarning is what prune prints before it lists anything.
const fenceWarning = `Pruning forgets fences: a released or expired lease row remembers its
run's fence, and a pruned run id that is acquired again restarts at fence 1.
Systems that check fences would then refuse the new holder (they saw a higher
fence), or accept a stalled old holder's writes over it. Prune only run ids
that are never reused.`

// horizonFlag is a duration that also accepts whole days ("7d").
type horizonFlag struct{ d time.Duration }

func (h *horizonFlag) String() string { return h.d.String() }

func (h *horizonFlag) Set(s string) error {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 365*100 {
			return fmt.Errorf("want a duration such as 36h or 7d, got %q", s)
		}
		h.d = time.Duration(n) * 24 * time.Hour
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want a duration such as 36h or 7d, got %q", s)
	}
	h.d = d
	return nil
}

type pruneOpts struct {
	store       storeFlags
	olderThan   horizonFlag
	dryRun, yes bool
}

func (c *cli) prune(args []string) error {
	var o pruneOpts
	fs := c.newFlags("prune", "--older-than DURATION [flags]", pruneHelp)
	c.registerStore(fs.FlagSet, &o.store)
	fs.Var(&o.olderThan, "older-than", "required: remove rows and marks that ended longer than `DURATION` ago")
	fs.BoolVar(&o.dryRun, "dry-run", false, "list what would be removed; remove nothing")
	fs.BoolVar(&o.yes, "yes", false, "do not ask for confirmation on a terminal")
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) > 0:
		return usagef("prune", "unexpected argument %q", pos[0])
	case !flagSet(fs.FlagSet, "older-than"):
		return usagef("prune", "--older-than DURATION is required")
	}
	access := readWrite
	if o.dryRun {
		access = readOnly
	}
	s, err := c.open(fs.FlagSet, &o.store, access)
	if err != nil {
		return err
	}
	defer s.close()
	return c.pruneStore(s, o)
}

// pruneStore lists what would go, confirms, and prunes.
func (c *cli) pruneStore(s *openedStore, o pruneOpts) error {
	ctx, cancel := c.step(&o.store)
	defer cancel()
	now := s.now()
	want, err := runlease.PruneCandidates(ctx, s.s, o.olderThan.d, at(now))
	if err != nil {
		return err
	}
	if want.Len() == 0 {
		fmt.Fprintf(c.stdout, "nothing in %s ended more than %v ago; nothing to prune\n", s.name, o.olderThan.d)
		return nil
	}
	fmt.Fprintf(c.stdout, "%s\n\n", fenceWarning)
	err = c.listPrunable(ctx, s, want, now)
	cancel()
	if err != nil {
		return err
	}
	if o.dryRun {
		fmt.Fprintf(c.stdout, "\nDry run: %s would be removed; nothing was changed.\n", prunedCount(want))
		return nil
	}
	if !o.yes && !c.confirm(fmt.Sprintf("\nremove %s?", prunedCount(want))) {
		return errAborted
	}
	// The instant of the listing, so that nothing the operator was not
	// shown crosses the horizon while the question was on the screen.
	ctx, cancel = c.step(&o.store)
	defer cancel()
	got, err := runlease.Prune(ctx, s.s, o.olderThan.d, at(now))
	fmt.Fprintf(c.stdout, "removed %s\n", prunedCount(got))
	return err
}

// listPrunable prints the rows of p as a table, with each lease's fence
// and when it ended.
func (c *cli) listPrunable(ctx context.Context, s *openedStore, p runlease.Pruned, now time.Time) error {
	leases, err := runlease.Leases(ctx, s.s, at(now))
	if err != nil {
		return err
	}
	byRun := make(map[string]runlease.LeaseInfo, len(leases))
	for _, l := range leases {
		byRun[l.RunID] = l
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "KIND\tNAME\tFENCE\tENDED")
	for _, id := range p.Leases {
		l := byRun[id]
		fmt.Fprintf(tw, "lease\t%s\t%d\t%s\n", id, l.Fence, expiresText(l, now))
	}
	for _, key := range p.Slots {
		fmt.Fprintf(tw, "slot\t%s\t-\t-\n", key)
	}
	for _, key := range p.Queue {
		kind := "queue"
		if strings.HasPrefix(key, runlease.FairPrefix) {
			kind = "fair-share mark"
		}
		fmt.Fprintf(tw, "%s\t%s\t-\t-\n", kind, key)
	}
	return tw.Flush()
}

// prunedCount says how many rows and fair-share marks p holds, for people:
// lease and slot rows always, queue rows and marks when there are any.
func prunedCount(p runlease.Pruned) string {
	marks := 0
	for _, key := range p.Queue {
		if strings.HasPrefix(key, runlease.FairPrefix) {
			marks++
		}
	}
	parts := []string{plural(len(p.Leases), "lease row"), plural(len(p.Slots), "slot row")}
	if n := len(p.Queue) - marks; n > 0 {
		parts = append(parts, plural(n, "queue row"))
	}
	if marks > 0 {
		parts = append(parts, plural(marks, "fair-share mark"))
	}
	last := len(parts) - 1
	return strings.Join(parts[:last], ", ") + " and " + parts[last]
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// flagSet reports whether the flag called name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}
