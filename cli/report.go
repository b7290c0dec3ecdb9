package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/statuspage"
)

// report is what status shows: every lease and every live slot, read at one
// instant of the store's clock.
type report struct {
	store    string
	table    string // the Postgres table; "" for the embedded store
	now      time.Time
	leases   []runlease.LeaseInfo
	omitted  int  // leases that matched the filters beyond --max
	filtered bool // --state, --run or --max left leases out
	slots    []runlease.SlotInfo
	waiters  []runlease.Waiter // the queues' live entries
	limits   map[string]int    // scope limits given with --limit
	// at formats an instant in the text output; nil is timestamp. The
	// demo's simulated clock prints its own.
	at func(time.Time) string
}

// timeText formats t with r.at.
func (r *report) timeText(t time.Time) string {
	if r.at != nil {
		return r.at(t)
	}
	return timestamp(t)
}

// readReport reads every lease, slot and queue of s, judged at now, as the
// status page reads them (statuspage.Read).
func readReport(ctx context.Context, s runlease.Store, name string, now time.Time, limits map[string]int) (*report, error) {
	r, err := statuspage.Read(ctx, s, "", now)
	if err != nil {
		return nil, err
	}
	return &report{store: name, now: now, leases: r.Leases, slots: r.Slots, waiters: r.Waiters, limits: limits}, nil
}

// The --json documents are statuspage's, built by its NewStatus, so that
// status --json and the status page's status.json cannot drift apart.
type (
	statusJSON = statuspage.Document
	scopeJSON  = statuspage.Scope
	slotJSON   = statuspage.Slot
)

// scopes groups the slots by scope, adding the scopes of --limit that hold
// none, in name order.
func (r *report) scopes() []scopeJSON {
	return statuspage.AddQueues(statuspage.NewScopes(r.slots, r.limits, r.now), r.waiters, r.now)
}

// writeJSON prints the report as one JSON document: indented, or on one
// line for a stream of refreshes.
func (r *report) writeJSON(w io.Writer, compact bool) error {
	doc := statuspage.NewStatus(r.store, r.table, r.now, r.leases, r.omitted, r.slots, r.waiters, r.limits)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if !compact {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(doc)
}

// writeText prints the report as two aligned tables.
func (r *report) writeText(w io.Writer) {
	fmt.Fprintf(w, "store %s at %s\n\n", r.store, r.timeText(r.now))
	r.writeLeases(w)
	fmt.Fprintln(w)
	r.writeScopes(w)
}

func (r *report) writeLeases(w io.Writer) {
	if len(r.leases) == 0 && r.filtered {
		fmt.Fprintln(w, "no leases match --state and --run")
		return
	}
	if len(r.leases) == 0 {
		fmt.Fprintln(w, "no leases")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "RUN\tHOLDER\tFENCE\tSTATE\tEXPIRES\tTAKEOVER")
	for _, l := range r.leases {
		fence := strconv.FormatUint(l.Fence, 10)
		if l.Corrupt {
			fence = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.RunID, orDash(l.Holder), fence,
			leaseState(l), expiresText(l, r.now), takeoverText(l, r.timeText))
	}
	tw.Flush()
	if r.omitted > 0 {
		more := "leases"
		if r.omitted == 1 {
			more = "lease"
		}
		fmt.Fprintf(w, "… and %d more %s, beyond --max\n", r.omitted, more)
	}
}

func (r *report) writeScopes(w io.Writer) {
	scopes := r.scopes()
	if len(scopes) == 0 {
		fmt.Fprintln(w, "no slots held")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "SCOPE\tUSED\tHOLDERS")
	for _, sc := range scopes {
		used := strconv.Itoa(sc.Used)
		if sc.Limit != nil {
			used += "/" + strconv.Itoa(*sc.Limit)
			if sc.Used > *sc.Limit {
				used += " (over: the limit was lowered)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", sc.Scope, used, orDash(slotHolders(sc.Slots, r.now)))
	}
	tw.Flush()
	r.writeQueues(w, scopes)
}

// writeQueues prints the waiters of every scope that has any, first first.
func (r *report) writeQueues(w io.Writer, scopes []scopeJSON) {
	if len(r.waiters) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := newTable(w)
	fmt.Fprintln(tw, "QUEUE\tPOS\tRUN\tPRINCIPAL\tPRIORITY\tUNITS\tWAITING SINCE")
	for _, sc := range scopes {
		for _, q := range sc.Queue {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\n", sc.Scope, q.Position, q.RunID, orDash(q.Principal),
				q.Priority, q.Units, r.timeText(time.UnixMilli(q.EnqueuedMS)))
		}
	}
	tw.Flush()
}

// slotHolders lists who holds a scope's slots, and until when.
func slotHolders(slots []slotJSON, now time.Time) string {
	parts := make([]string, 0, len(slots))
	for _, s := range slots {
		if s.Corrupt {
			parts = append(parts, fmt.Sprintf("corrupt row %q", s.Key))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s (slot %d, %s)", s.RunID, s.Slot,
			"in "+spanText(time.UnixMilli(*s.UntilMS), now)))
	}
	return strings.Join(parts, ", ")
}
