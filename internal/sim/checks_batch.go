package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// ackedRow is a lease row whose write the store applied and acknowledged:
// the library was told it landed.
type ackedRow struct {
	row      row
	epoch    int       // the run's lineage when it landed
	sent, at time.Time // when the write was sent, and when its reply came
}

// maxAcked is how many acknowledged rows are kept per run: the checks look
// only at the latest of a lease's.
const maxAcked = 8

// acked is the store's report of a write that applied and whose success
// reached the library. The store's mutex is held.
func (w *World) acked(key, value string, sent, at time.Time) {
	if !strings.HasPrefix(key, runlease.LeasePrefix) {
		return
	}
	r, ok := decode(value)
	if !ok || r.Holder == "" {
		return
	}
	run := strings.TrimPrefix(key, runlease.LeasePrefix)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.acks == nil {
		w.acks = map[string][]ackedRow{}
	}
	rows := append(w.acks[run], ackedRow{row: r, epoch: w.epoch[run], sent: sent, at: at})
	if len(rows) > maxAcked {
		rows = rows[len(rows)-maxAcked:]
	}
	w.acks[run] = rows
}

// checkLandedTrust: a trust window cannot run out sooner than TTL minus the
// margin after the start of a write of the lease that the store applied and
// acknowledged (a renewal in a batch whose reply reached the library, say),
// unless the row it wrote expires, by the store's clock, within the margin.
// The lease learns of such a write when its reply comes back, whatever
// else the call carrying it still waits for.
//
// Only writes acknowledged at an earlier instant count, as in
// checkTrustExpiry.
func (w *World) checkLandedTrust(call string, now time.Time, l Lease, run string, err error) {
	snow := w.storeNow().Add(-time.Since(now)) // the store's clock then
	holder, fence, epoch := l.Holder(), l.Fence(), w.epochOf(l)
	w.mu.Lock()
	var last ackedRow
	found := false
	for _, a := range w.acks[run] {
		if a.row.Holder == holder && a.row.Fence == fence && a.epoch == epoch && a.at.Before(now) &&
			(!found || a.sent.After(last.sent)) {
			last, found = a, true
		}
	}
	w.mu.Unlock()
	margin := w.mode.Margin()
	if !found || !now.Before(last.sent.Add(w.mode.TTL-margin)) || last.row.remaining(snow) <= margin+time.Millisecond {
		return
	}
	w.violate("landed-trust-expiry", fmt.Sprintf("%s|%s", run, call),
		"%s of %s reported the trust window run out, %s after a write of the lease sent at t=%s landed and was acknowledged at t=%s (its row live %s more): %v",
		call, run, fmtDur(now.Sub(last.sent)), fmtDur(last.sent.Sub(w.start)), fmtDur(last.at.Sub(w.start)),
		fmtDur(last.row.remaining(snow)), err)
}

// checkReleaseWait: a release whose context ended before it sent anything
// for the lease's row waited all that time for the lease's write token
// (since from, or its last store call after it). Only a call on that row in
// the store may hold the token that long (a hung renewal, a fenced write):
// a stretch of the wait with no call on the row in flight means the token
// was held while its holder waited for something else, another lease's
// write or a place among the renewals in flight, so that a hung write on
// one lease delayed a call on another (CONCURRENCY.md, rule 2).
func (w *World) checkReleaseWait(o *op, call, run string, from time.Time, err error) {
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || runlease.IsOutcomeUnknown(err) || errors.Is(err, runlease.ErrLeaseLost) {
		return
	}
	key := runlease.LeasePrefix + run
	for _, c := range w.store.log(o.id) {
		if c.key == key {
			return // it wrote or read the row: it had the token
		}
		if c.at.After(from) {
			from = c.at
		}
	}
	if idle := w.store.IdleDuring(key, from, time.Now()); idle > 0 {
		w.violate("release-held-up", fmt.Sprintf("op%d", o.id),
			"%s #%d of %s failed on its context's end (%v), waiting for the lease's write token while no call on its row was in the store for %s",
			call, o.id, run, errText(err), fmtDur(idle))
	}
}
