package cli

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

const explainHelp = `
Explain tells why a run is not starting: for each scope it claims (give
each with --limit SCOPE=N, the limit its drivers claim with), the limit,
the units other runs hold, the scope's queue and the run's place in it,
the waiters ahead of it, who holds the slots and until when, and what
holds it back:
  capacity  other runs hold too many units: it would wait with nobody ahead
  order     units are free, but waiters ranked ahead reserve them
  -         nothing: a claim made now would be admitted here
A run that is not queued is explained where a claim made now would rank,
with --units, --priority, --principal and --weight as its drivers claim.
It reads each scope once and writes nothing; an embedded store is opened
read-only, beside its running driver.

--json (or -o json) prints run_id, now, admissible, and scopes[] of
scope, limit, units, used, own, queue_length, queued, position, priority,
tag, reserved, blocked_by ("" when none), ahead[] (the fields of a status
--json queue entry) and holders[] (the fields of a status --json slot).
`

// explainJSON is the document explain --json prints.
type explainJSON struct {
	RunID      string             `json:"run_id"`
	Now        time.Time          `json:"now"`
	Admissible bool               `json:"admissible"`
	Scopes     []explainScopeJSON `json:"scopes"`
}

type explainScopeJSON struct {
	Scope     string              `json:"scope"`
	Limit     int                 `json:"limit"`
	Units     int                 `json:"units"`
	Used      int                 `json:"used"`
	Own       int                 `json:"own"`
	QueueLen  int                 `json:"queue_length"`
	Queued    bool                `json:"queued"`
	Position  int                 `json:"position"`
	Priority  int                 `json:"priority"`
	Tag       int64               `json:"tag"`
	Reserved  int                 `json:"reserved"`
	BlockedBy string              `json:"blocked_by"`
	Ahead     []statuspage.Waiter `json:"ahead"`
	Holders   []slotJSON          `json:"holders"`
}

func (c *cli) explain(args []string) error {
	var sf storeFlags
	var asJSON bool
	limits, units := limitsFlag{}, limitsFlag{}
	var priority, weight int
	var principal string
	fs := c.newFlags("explain", "[flags] RUN", explainHelp)
	c.registerStore(fs.FlagSet, &sf)
	fs.outputVars(&asJSON, "print JSON for scripts (fields above)")
	fs.Var(limits, "limit", "a scope the run claims and its limit, `SCOPE=N` (repeatable; one at least)")
	fs.Var(units, "units", "the units the run claims of a scope, `SCOPE=N` (repeatable; 1 unit of each scope not given)")
	fs.IntVar(&priority, "priority", 0, "the claim's priority `N`, as WithPriority")
	fs.StringVar(&principal, "principal", "", "the claim's `PRINCIPAL`, as WithFairShare")
	fs.IntVar(&weight, "weight", 1, "the principal's weight `N`, as WithFairShare")
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) != 1:
		return usagef("explain", "want one RUN argument, got %d", len(pos))
	case len(limits) == 0:
		return usagef("explain", "give the scopes the run claims with --limit SCOPE=N")
	}
	names := make([]string, 0, len(limits))
	for name := range limits {
		names = append(names, name)
	}
	slices.Sort(names)
	scopes := make([]runlease.Scope, 0, len(names))
	for _, name := range names {
		sc, _ := parseScope(name, limits[name]) // checked by limitsFlag
		if n, ok := units[name]; ok {
			sc = sc.Take(n)
		}
		scopes = append(scopes, sc)
	}
	for name := range units {
		if _, ok := limits[name]; !ok {
			return usagef("explain", "--units %s: give the scope's --limit too", name)
		}
	}
	s, err := c.open(fs.FlagSet, &sf, readOnly)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := c.step(&sf)
	defer cancel()
	now := s.now()
	ex, err := runlease.ExplainSlots(ctx, s.s, pos[0], scopes, at(now), runlease.WithPriority(priority),
		runlease.WithFairShare(principal, weight))
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(c.stdout, newExplainJSON(ex, now))
	}
	writeExplanation(c.stdout, ex, now)
	return nil
}

func newExplainJSON(ex *runlease.Explanation, now time.Time) explainJSON {
	doc := explainJSON{RunID: ex.RunID, Now: now.UTC(), Admissible: ex.Admissible, Scopes: []explainScopeJSON{}}
	for _, se := range ex.Scopes {
		j := explainScopeJSON{Scope: se.Scope, Limit: se.Limit, Units: se.Units, Used: se.Used, Own: se.Own,
			QueueLen: se.QueueLen, Queued: se.Queued, Position: se.Position, Priority: se.Priority, Tag: se.Tag,
			Reserved: se.Reserved, BlockedBy: se.BlockedBy, Ahead: []statuspage.Waiter{}, Holders: []slotJSON{}}
		if sc := statuspage.AddQueues(nil, se.Ahead, now); len(sc) == 1 {
			j.Ahead = sc[0].Queue
		}
		if sc := statuspage.NewScopes(se.Holders, nil, now); len(sc) == 1 {
			j.Holders = sc[0].Slots
		}
		doc.Scopes = append(doc.Scopes, j)
	}
	return doc
}

func writeExplanation(w io.Writer, ex *runlease.Explanation, now time.Time) {
	var blocked []string
	for _, se := range ex.Scopes {
		if se.BlockedBy != "" {
			blocked = append(blocked, se.Scope+" ("+se.BlockedBy+")")
		}
	}
	if ex.Admissible {
		fmt.Fprintf(w, "run %s would be admitted now\n\n", ex.RunID)
	} else {
		fmt.Fprintf(w, "run %s waits: held back in %s\n\n", ex.RunID, strings.Join(blocked, ", "))
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "SCOPE\tUSED\tASKS\tQUEUE\tPLACE\tRESERVED AHEAD\tBLOCKED BY")
	for _, se := range ex.Scopes {
		place := strconv.Itoa(se.Position) + " ahead"
		if !se.Queued {
			place += " (not queued)"
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%s\t%d\t%s\n", se.Scope, se.Used, se.Limit, se.Units, se.QueueLen,
			place, se.Reserved, orDash(se.BlockedBy))
	}
	tw.Flush()
	for _, se := range ex.Scopes {
		if len(se.Ahead) == 0 && len(se.Holders) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", se.Scope)
		for _, a := range se.Ahead {
			fmt.Fprintf(w, "  ahead    %s (principal %s, priority %d, %s, waiting since %s)\n",
				a.RunID, orDash(a.Principal), a.Priority, plural(a.Units, "unit"), timestamp(a.Enqueued))
		}
		for _, h := range se.Holders {
			fmt.Fprintf(w, "  holding  %s slot %d until %s\n", h.RunID, h.Slot, timestamp(h.Until))
		}
	}
}
