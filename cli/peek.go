package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/areev/runlease"
)

const peekHelp = `
Peek shows one run's lease in detail, read at one instant of the store's
clock. An embedded store is opened read-only, beside its running driver.

Exit status, for scripts:
  0  held: a live lease; another driver would be refused until it expires
  3  free: the lease expired or was released; a driver may take over now
  4  absent: the run has no lease row (never acquired, or pruned)
  1  error, such as an unreachable store or a corrupt row (RUN-E002)
  2  usage error: every RUN-E001, such as an empty RUN

--json (or -o json) prints the lease with the fields of status --json
(run_id, state, holder, fence, until, until_ms, expires_in_ms,
takeover_possible, takeover_at, row), state "absent" (and
takeover_possible true) for a run with no row, and now.
`

// peekJSON is the document peek --json prints.
type peekJSON struct {
	Now time.Time `json:"now"`
	leaseJSON
}

func (c *cli) peek(args []string) error {
	var sf storeFlags
	var asJSON bool
	fs := c.newFlags("peek", "[flags] RUN", peekHelp)
	c.registerStore(fs.FlagSet, &sf)
	fs.outputVars(&asJSON, "print JSON for scripts (fields above)")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("peek", "want one RUN argument, got %d", len(pos))
	}
	s, err := c.open(fs.FlagSet, &sf, readOnly)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := c.step(&sf)
	defer cancel()
	now := s.now()
	info, err := runlease.Peek(ctx, s.s, pos[0], at(now))
	if err != nil {
		return err
	}
	if asJSON {
		if err := writeJSON(c.stdout, peekJSON{Now: now.UTC(), leaseJSON: newLeaseJSON(info, now)}); err != nil {
			return err
		}
	} else {
		writeLeaseDetail(c.stdout, info, now)
	}
	return peekStatus(info)
}

// peekStatus is peek's exit status for what it found.
func peekStatus(info runlease.LeaseInfo) error {
	switch leaseState(info) {
	case stateLive:
		return exitStatus(exitHeld)
	case stateAbsent:
		return exitStatus(exitAbsent)
	}
	return exitStatus(exitFree)
}

// writeLeaseDetail prints one lease as aligned name/value lines.
func writeLeaseDetail(w io.Writer, info runlease.LeaseInfo, now time.Time) {
	tw := newTable(w)
	defer tw.Flush()
	state := leaseState(info)
	fmt.Fprintf(tw, "run\t%s\n", info.RunID)
	fmt.Fprintf(tw, "state\t%s\n", state)
	if state == stateAbsent {
		fmt.Fprintf(tw, "takeover\t%s\n", takeoverText(info, timestamp))
		return
	}
	fmt.Fprintf(tw, "holder\t%s\n", orDash(info.Holder))
	fmt.Fprintf(tw, "fence\t%d\n", info.Fence)
	fmt.Fprintf(tw, "until\t%s (%s)\n", timestamp(info.Until), expiresText(info, now))
	fmt.Fprintf(tw, "takeover\t%s\n", takeoverText(info, timestamp))
	fmt.Fprintf(tw, "row\t%s\n", info.Row)
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
