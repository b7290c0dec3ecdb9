package cli

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

const statusHelp = `
Status lists every lease and the slot occupancy of every scope, judged at
one instant of the store's clock (Postgres: the server's). An embedded store
is opened read-only, without its writer lock, so status works beside the
driver that has it open; it is never created.

A lease is live (held; takeover possible once it expires), expired (its
holder stopped renewing; anyone may take over), released (given up; the next
holder continues its fence) or corrupt (the row does not parse; nobody takes
it over until a person looks). A scope's limit is the claiming host's
configuration, not stored: give --limit SCOPE=N to see used/limit; the
SCOPE is a name drivers can claim (letters, digits, '-', '.', '/'), or
principal:PRINCIPAL.

--state, --run and --max choose the leases shown (in run id order); the
scopes are always shown whole. A corrupt row shown is also named on stderr,
and status then exits with status 5 (not with --watch, which runs until
interrupted and exits 0); other exit statuses are those of every command.

--json (or -o json) prints one document (with --watch, one line per
refresh):
  store          the store, password redacted (a Postgres store's table,
                 unless the default, follows as " table NAME")
  table          the Postgres table; null for the embedded store
  now            the instant the rows were judged at (RFC 3339, UTC)
  omitted        how many leases matching --state and --run --max left out
  leases[]       run_id, state (live|expired|released|corrupt), holder,
                 fence, until (RFC 3339; null when corrupt or outside the
                 years 0-9999), until_ms (the stored milliseconds since the
                 Unix epoch; null when corrupt), expires_in_ms (until_ms -
                 now, clamped to int64; negative once expired),
                 takeover_possible, takeover_at (null as until is), row
                 (the stored text)
  scopes[]       scope, used, limit (null without --limit), slots[] of
                 slot, run_id, until, until_ms, expires_in_ms, corrupt, key,
                 and queue[] (the live waiters, first first) of position,
                 run_id, principal, weight, priority, units, tag,
                 enqueued, enqueued_ms, until, until_ms, expires_in_ms
`

// limitsFlag collects --limit SCOPE=N flags.
type limitsFlag map[string]int

func (l limitsFlag) String() string {
	parts := make([]string, 0, len(l))
	for k, v := range l {
		parts = append(parts, k+"="+strconv.Itoa(v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (l limitsFlag) Set(s string) error {
	scope, n, ok := strings.Cut(s, "=")
	limit, err := strconv.Atoi(n)
	if !ok || scope == "" || err != nil || limit < 1 || limit > runlease.MaxSlotLimit {
		return fmt.Errorf("want SCOPE=N with N in [1, %d], got %q", runlease.MaxSlotLimit, s)
	}
	if _, err := parseScope(scope, limit); err != nil {
		return err
	}
	l[scope] = limit
	return nil
}

// statesFlag collects --state flags: lease states, comma-separated or
// repeated.
type statesFlag map[string]bool

func (s statesFlag) String() string {
	out := make([]string, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func (s statesFlag) Set(v string) error {
	for _, st := range strings.Split(v, ",") {
		switch st {
		case stateLive, stateExpired, stateReleased, stateCorrupt:
			s[st] = true
		default:
			return fmt.Errorf("want live, expired, released or corrupt, got %q", st)
		}
	}
	return nil
}

// minWatch is the shortest --watch: a refresh reads every row.
const minWatch = 100 * time.Millisecond

type statusOpts struct {
	store  storeFlags
	json   bool
	watch  time.Duration
	limits limitsFlag
	filter leaseFilter
}

// leaseFilter chooses the leases status shows.
type leaseFilter struct {
	states statesFlag // empty: every state
	prefix string     // run-id prefix
	max    int        // at most this many; 0: all
}

// apply returns the leases that f keeps, and how many more matched than
// --max lets through.
func (f leaseFilter) apply(leases []runlease.LeaseInfo) (kept []runlease.LeaseInfo, omitted int) {
	// The status page's filter, so that status.json and status --json
	// choose the same leases.
	kept, matched := statuspage.Filter{States: f.states, Run: f.prefix, Max: f.max}.Apply(leases)
	return kept, matched - len(kept)
}

// active reports whether f leaves any lease out.
func (f leaseFilter) active() bool { return len(f.states) > 0 || f.prefix != "" || f.max > 0 }

func (c *cli) status(args []string) error {
	o := statusOpts{limits: limitsFlag{}, filter: leaseFilter{states: statesFlag{}}}
	fs := c.newFlags("status", "[flags]", statusHelp)
	c.registerStore(fs.FlagSet, &o.store)
	fs.outputVars(&o.json, "print JSON for scripts (fields above)")
	fs.DurationVar(&o.watch, "watch", 0, "refresh every `DURATION` (at least 100ms) until interrupted")
	fs.Var(o.limits, "limit", "a scope's limit, `SCOPE=N`, to show used/limit (repeatable)")
	fs.Var(o.filter.states, "state", "show only leases in `STATE`: live, expired, released, corrupt (comma-separated or repeated)")
	fs.StringVar(&o.filter.prefix, "run", "", "show only leases whose run id starts with `PREFIX`")
	fs.IntVar(&o.filter.max, "max", 0, "show at most `N` leases, in run id order (0: all)")
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) > 0:
		return usagef("status", "unexpected argument %q", pos[0])
	case flagSet(fs.FlagSet, "watch") && o.watch < minWatch:
		// --watch 0s would refresh without pause; it is not "no --watch".
		return usagef("status", "--watch %v: give at least %v", o.watch, minWatch)
	case o.filter.max < 0:
		return usagef("status", "--max %d: give 0 (all) or more", o.filter.max)
	}
	s, err := c.open(fs.FlagSet, &o.store, readOnly)
	if err != nil {
		return err
	}
	defer s.close()
	if o.watch > 0 {
		return c.watch(s, o)
	}
	return c.statusOnce(s, o)
}

// statusOnce reads and prints one report.
func (c *cli) statusOnce(s *openedStore, o statusOpts) error {
	ctx, cancel := c.step(&o.store)
	defer cancel()
	r, err := readReport(ctx, s.s, s.name, s.now(), o.limits)
	if err != nil {
		return err
	}
	r.table = s.table
	r.leases, r.omitted = o.filter.apply(r.leases)
	r.filtered = o.filter.active()
	if o.json {
		err = r.writeJSON(c.stdout, o.watch > 0)
	} else {
		r.writeText(c.stdout)
	}
	if err != nil {
		return err
	}
	return c.warnCorrupt(r, o.watch > 0)
}

// warnCorrupt says on stderr which corrupt rows the report shows: nobody
// takes such a run over, and nothing removes the row, until a person
// repairs it. Without --watch, status then exits with exitCorrupt.
func (c *cli) warnCorrupt(r *report, watching bool) error {
	var runs, slots []string
	for _, l := range r.leases {
		if l.Corrupt {
			runs = append(runs, l.RunID)
		}
	}
	for _, s := range r.slots {
		if s.Corrupt {
			slots = append(slots, s.Key)
		}
	}
	n := len(runs) + len(slots)
	if n == 0 {
		return nil
	}
	var what []string
	if len(runs) > 0 {
		what = append(what, "lease of "+strings.Join(quoteAll(runs), ", "))
	}
	if len(slots) > 0 {
		what = append(what, "slot "+strings.Join(quoteAll(slots), ", "))
	}
	fmt.Fprintf(c.stderr, "runlease: warning: %s (%s): a row that does not parse blocks its run or its one slot "+
		"(the scope's other slots are claimed as usual) until it is repaired; see \"runlease repair --help\"\n",
		plural(n, "corrupt row"), strings.Join(what, "; "))
	if watching {
		return nil
	}
	return exitStatus(exitCorrupt)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

// watch prints a report every o.watch until interrupted. A failed refresh
// is reported and the next one tried: a store that is briefly unreachable
// at 3 a.m. must not end the watch.
func (c *cli) watch(s *openedStore, o statusOpts) error {
	clear := !o.json && c.isTerminal(c.rawStdout)
	tick := time.NewTicker(o.watch)
	defer tick.Stop()
	for {
		if clear {
			fmt.Fprint(c.stdout, "\x1b[H\x1b[2J")
		}
		if err := c.statusOnce(s, o); err != nil && c.ctx.Err() == nil {
			c.printError(err)
		}
		if !o.json {
			fmt.Fprintf(c.stdout, "\nrefreshing every %v; interrupt to stop\n\n", o.watch)
		}
		select {
		case <-c.ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
