package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/manualclock"
)

const demoHelp = `
Demo plays a short scenario on an embedded SQLite store and prints its
timeline: drivers acquire runs and claim concurrency slots, a second driver
is refused (RUN-E021) and told when takeover becomes possible, a stalled
driver's lease expires and is taken over at a higher fence, the stalled
driver's fenced checkpoint write and its renewal are refused, a run beyond a
slot limit is refused (RUN-E022),
keepers renew two leases through a superstep longer than the TTL, and the
final status table is printed.

Time is simulated (runlease.WithClock with a manual clock), so the demo
takes a second or two. The store is a file in a fresh temporary folder,
removed at the end, unless --db names one, which must be new or empty; it is
kept, for "runlease status --db PATH".
`

// The demo's settings.
const (
	demoTTL            = 30 * time.Second
	demoMemLimit       = 2
	demoPrincipalLimit = 1
	// demoKeepInterval is how often, in real time, the demo's keepers
	// renew: as often as a keeper may, so each simulated step waits little.
	demoKeepInterval = runlease.MinKeepInterval
	// demoStepTimeout bounds the real wait for a keeper's renewal.
	demoStepTimeout = 10 * time.Second
	// demoDuration is the scenario's length in simulated time.
	demoDuration = 50*time.Second + demoSuperstep
)

func (c *cli) demo(args []string) error {
	var path string
	fs := c.newFlags("demo", "[--db PATH]", demoHelp)
	fs.StringVar(&path, "db", "", "keep the demo's store in `PATH` (new or empty) instead of a temporary folder")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("demo", "unexpected argument %q", pos[0])
	}
	keep := path != ""
	if err := notDirectory("demo", path); keep && err != nil {
		return err
	}
	if !keep {
		dir, err := os.MkdirTemp("", "runlease-demo-")
		if err != nil {
			return fmt.Errorf("%s: demo: %w", runlease.CodeStorage, err)
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "demo.db")
	}
	store, err := openDemoStore(c.ctx, path)
	if err != nil {
		return err
	}
	defer store.Close()
	d := newDemo(c, store, path)
	if err := d.play(); err != nil {
		return err
	}
	return d.outro(keep)
}

// openDemoStore opens the embedded store at path and checks it is empty:
// the scenario's run ids and simulated times must not meet older rows.
func openDemoStore(ctx context.Context, path string) (*runlease.SQLiteStore, error) {
	s, err := runlease.OpenSQLite(path)
	if errors.Is(err, runlease.ErrStoreLocked) {
		return nil, withHint(err, lockedHint)
	}
	if err != nil {
		return nil, err
	}
	rows, err := s.MetaScan(ctx, "")
	if err == nil && len(rows) > 0 {
		err = fmt.Errorf("%s: demo: %q already holds %s; give a new file or none",
			runlease.CodeInvalidArgument, path, plural(len(rows), "row"))
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// driver is one simulated run driver.
type driver struct {
	name   string // as the timeline calls it: "driver-a"
	holder string
	lease  *runlease.Lease
	slots  *runlease.Slots
}

// demo is one playing of the scenario.
type demo struct {
	c      *cli
	ctx    context.Context
	store  runlease.Store
	path   string
	clock  *manualclock.Clock // the simulated time; keepers read it from their goroutines
	start  time.Time
	events chan renewal // keepers' renewals
}

func newDemo(c *cli, store runlease.Store, path string) *demo {
	// The simulated clock ends about now, so that "runlease status" on a
	// store kept with --db shows what the demo's final table shows.
	start := time.Now().UTC().Truncate(time.Second).Add(-demoDuration)
	return &demo{c: c, ctx: c.ctx, store: store, path: path,
		clock: manualclock.New(start), start: start, events: make(chan renewal, 64)}
}

// opts are the options of every lease and slot call of the demo.
func (d *demo) opts() []runlease.Option {
	return []runlease.Option{runlease.WithTTL(demoTTL), runlease.WithClock(d.clock.Now)}
}

// newDriver returns a driver whose holder is principal#node.
func (d *demo) newDriver(name, principal, node string) *driver {
	return &driver{name: name, holder: runlease.HolderFor(principal, node)}
}

// rel formats t as simulated time since the start: "t+1m5s".
func (d *demo) rel(t time.Time) string { return "t+" + shortDuration(t.Sub(d.start)) }

// say prints one timeline entry at the current simulated time.
func (d *demo) say(format string, a ...any) {
	fmt.Fprintf(d.c.stdout, "%-8s %s\n", d.rel(d.clock.Now()), d.simulated(fmt.Sprintf(format, a...)))
}

// detail prints a line under the last timeline entry.
func (d *demo) detail(format string, a ...any) {
	fmt.Fprintf(d.c.stdout, "%-8s   %s\n", "", d.simulated(fmt.Sprintf(format, a...)))
}

// rfc3339 matches the instants the library's messages carry.
var rfc3339 = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})`)

// simulated rewrites the instants in s, such as a refusal's "until …", in
// the timeline's simulated time: the timeline never mixes in dates.
func (d *demo) simulated(s string) string {
	return rfc3339.ReplaceAllStringFunc(s, func(m string) string {
		t, err := time.Parse(time.RFC3339Nano, m)
		if err != nil {
			return m
		}
		return d.rel(t)
	})
}

// until sets the simulated clock to start+offset.
func (d *demo) until(offset time.Duration) {
	d.clock.Advance(d.start.Add(offset).Sub(d.clock.Now()))
}

// heldSlots describes the slots a driver holds: "mem #0, principal:x #0".
func heldSlots(s *runlease.Slots) string {
	out := ""
	for i, h := range s.Held() {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%s #%d", h.Scope, h.Slot)
	}
	return out
}

// scopes are the slot scopes a run of principal claims.
func scopes(principal string) []runlease.Scope {
	return []runlease.Scope{runlease.MemScope(demoMemLimit), runlease.PrincipalScope(principal, demoPrincipalLimit)}
}

// outro prints the final status table and where the store went.
func (d *demo) outro(kept bool) error {
	limits := map[string]int{"mem": demoMemLimit}
	for _, p := range []string{"reports", "audit", "adhoc"} {
		limits["principal:"+p] = demoPrincipalLimit
	}
	fmt.Fprintf(d.c.stdout, "\nFinal status at %s, as \"runlease status\" shows it:\n\n", d.rel(d.clock.Now()))
	r, err := readReport(d.ctx, d.store, "sqlite:"+d.path, d.clock.Now(), limits)
	if err != nil {
		return err
	}
	r.at = d.rel
	r.writeText(d.c.stdout)
	if kept {
		fmt.Fprintf(d.c.stdout, "\nThe store is kept: runlease status --db %s\n", d.path)
	} else {
		fmt.Fprintln(d.c.stdout, "\nThe store was temporary and is removed; --db PATH keeps one.")
	}
	return nil
}
