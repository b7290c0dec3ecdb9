package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
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
configuration, not stored: give --limit scope=N to see used/limit; the
scope is a name drivers can claim (letters, digits, '-', '.', '/'), or
principal:<p>.

--json prints one document (with --watch, one line per refresh):
  store          the store, password redacted
  now            the instant the rows were judged at (RFC 3339, UTC)
  leases[]       run_id, state (live|expired|released|corrupt), holder,
                 fence, until (RFC 3339; null when corrupt or outside the
                 years 0-9999), until_ms (the stored milliseconds since the
                 Unix epoch; null when corrupt), expires_in_ms (until_ms -
                 now, clamped to int64; negative once expired),
                 takeover_possible, takeover_at (null as until is), row
                 (the stored text)
  scopes[]       scope, used, limit (null without --limit), slots[] of
                 slot, run_id, until, until_ms, expires_in_ms, corrupt, key
`

// limitsFlag collects --limit scope=N flags.
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
		return fmt.Errorf("want scope=N with N in [1, %d], got %q", runlease.MaxSlotLimit, s)
	}
	if _, err := parseScope(scope, limit); err != nil {
		return err
	}
	l[scope] = limit
	return nil
}

type statusOpts struct {
	store  storeFlags
	json   bool
	watch  time.Duration
	limits limitsFlag
}

func (c *cli) status(args []string) error {
	o := statusOpts{limits: limitsFlag{}}
	fs := c.newFlags("status", "[flags]", statusHelp)
	o.store.register(fs.FlagSet)
	fs.BoolVar(&o.json, "json", false, "print JSON for scripts (fields above)")
	fs.DurationVar(&o.watch, "watch", 0, "refresh every `DURATION` until interrupted")
	fs.Var(o.limits, "limit", "a scope's limit, `scope=N`, to show used/limit (repeatable)")
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) > 0:
		return usagef("status", "unexpected argument %q", pos[0])
	case o.watch < 0 || (o.watch > 0 && o.watch < 100*time.Millisecond):
		return usagef("status", "--watch %v: give at least 100ms", o.watch)
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
	if o.json {
		return r.writeJSON(c.stdout, o.watch > 0)
	}
	r.writeText(c.stdout)
	return nil
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
