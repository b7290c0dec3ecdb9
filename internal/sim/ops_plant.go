package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/areev/runlease"
)

// beginBurst starts, at one instant, a wait of a and of up to three other
// idle drivers, all of one principal at one priority, so that their
// enqueues overlap: each reads the principal's mark before any writes it.
// A third of the bursts are of one run: all but one of its waits must
// fail with ErrAlreadyQueued, or end, while one waits (run-waits-twice).
func (w *World) beginBurst(a *actor) {
	q := w.mode.Queue
	p := q.Principals[w.rng.IntN(len(q.Principals))]
	prio := q.Priorities[w.rng.IntN(len(q.Priorities))]
	n := 2 + w.rng.IntN(3)
	run := ""
	if w.mode.Queue.Twins && w.rng.IntN(3) == 0 {
		w.mu.Lock()
		run = fmt.Sprintf("q%d.%dt", a.id, len(w.waits))
		w.mu.Unlock()
	}
	w.mu.Lock()
	group := []*actor{a}
	for _, b := range w.actors {
		if len(group) < n && b != a && b.busy == 0 && b.slots == nil && b.wait == nil && !b.lost {
			group = append(group, b)
		}
	}
	w.mu.Unlock()
	w.tracef("burst: %d waits of principal %q at priority %d (of one run: %q)", len(group), p.Name, prio, run)
	for _, b := range group {
		w.beginWaitAs(b, "wait", nil, "", 0, 0, &waitRank{p, prio, run})
	}
}

// legacyFences are the fences of the legacy entries the schedule plants:
// below, at and far above those of the leases.
var legacyFences = []uint64{0, 0, 1, 2, 5, 1 << 40}

// plantLegacy writes a queue entry at the legacy key (runqueue:…), as a
// waiter of a runlease version before the line left it or still renews
// it: for a run a wait may be for (a lease's run, a waiting run, the run
// of a's next unfenced wait) or for one nothing waits for, live or
// expired, of a fence drawn from low to far above any lease's. Such an
// entry holds no place in the line; a waiter of its run reads it and
// fails with ErrAlreadyQueued while it is live, of another waiter and of
// the waiter's fence or a newer one (legacy-overtaken checks that it
// never queues or is admitted beside it; slot-limit and claim-limit that
// it causes no admission over the limit).
func (w *World) plantLegacy(a *actor) {
	q := w.mode.Queue
	sc := w.mode.Scopes[w.rng.IntN(len(w.mode.Scopes))]
	w.mu.Lock()
	runs := []string{fmt.Sprintf("r%d", w.rng.IntN(max(w.mode.Runs, 1))), fmt.Sprintf("q%d.%d", a.id, len(w.waits)), "legacy-only"}
	for _, rec := range w.waits {
		if rec.o != nil && !rec.ended {
			runs = append(runs, rec.run)
		}
	}
	w.mu.Unlock()
	run := runs[w.rng.IntN(len(runs))]
	snow := w.storeNow()
	until := snow.Add(time.Duration(w.rng.Int64N(int64(2 * w.mode.TTL))))
	if w.rng.IntN(4) == 0 {
		until = snow.Add(-time.Duration(1+w.rng.IntN(3000)) * time.Millisecond) // expired
	}
	p := q.Principals[w.rng.IntN(len(q.Principals))]
	e := map[string]any{"run": run, "waiter": fmt.Sprintf("legacy%d", w.rng.IntN(1000)), "fence": legacyFences[w.rng.IntN(len(legacyFences))],
		"seq": 1, "principal": p.Name, "weight": max(p.Weight, 1), "priority": q.Priorities[w.rng.IntN(len(q.Priorities))],
		"units": 1, "tag": w.rng.Int64N(5_000_000), "enq_ms": snow.UnixMilli() - 1, "until_ms": until.UnixMilli(), "scopes": []string{sc.Name}}
	b, _ := json.Marshal(e)
	key := legacyKey(sc.Name, run)
	w.launch(a, fmt.Sprintf("plant the legacy entry %s %s", key, b), promptly, func(ctx context.Context, o *op) error {
		return w.put(key, string(b))
	})
}

// plantGhosts writes, at the head of a scope's line, entries of waiters
// that died (their runs, g<n>, wait no more): more than the scope's limit
// plus one of them, at the highest priority of the mode and the smallest
// tags, live for a while or already expired, each with its place row. A
// claim must read past the expired ones, however many, to the live
// entries behind them, and rank behind the live ones until they expire
// (queue-order, head-bound).
func (w *World) plantGhosts(a *actor) {
	q := w.mode.Queue
	sc := w.mode.Scopes[w.rng.IntN(len(w.mode.Scopes))]
	prio := q.Priorities[0]
	for _, p := range q.Priorities {
		prio = max(prio, p)
	}
	n := sc.Limit + 1 + w.rng.IntN(sc.Limit+3)
	snow := w.storeNow()
	var life time.Duration // 0: already expired
	if w.rng.IntN(3) == 0 {
		life = time.Duration(200+w.rng.IntN(1500)) * time.Millisecond
	}
	w.mu.Lock()
	base := len(w.ops)
	w.mu.Unlock()
	type row struct{ key, value string }
	var rows []row
	for i := range n {
		run := fmt.Sprintf("g%d.%d", base, i)
		until := snow.Add(life)
		if life == 0 {
			until = snow.Add(-time.Duration(1+w.rng.IntN(2000)) * time.Millisecond)
		}
		e := entry{Run: run, Waiter: "ghost" + run, Principal: ghostPrincipal, Weight: 1, Priority: prio, Units: 1 + w.rng.IntN(sc.Limit),
			Tag: int64(i), EnqMS: snow.UnixMilli() - int64(n-i), UntilMS: until.UnixMilli()}
		v, _ := json.Marshal(map[string]any{"run": e.Run, "waiter": e.Waiter, "fence": 0, "seq": 1, "principal": e.Principal,
			"weight": e.Weight, "priority": e.Priority, "units": e.Units, "tag": e.Tag, "enq_ms": e.EnqMS, "until_ms": e.UntilMS,
			"scopes": []string{sc.Name}})
		key := lineKey(sc.Name, e)
		pv, _ := json.Marshal(map[string]any{"waiter": e.Waiter, "fence": 0, "key": key, "until_ms": e.UntilMS})
		rows = append(rows, row{key, string(v)}, row{placeKey(sc.Name, run), string(pv)})
	}
	w.launch(a, fmt.Sprintf("plant %d entries of dead waiters at the head of %s (live for %v)", n, sc.Name, life), promptly,
		func(ctx context.Context, o *op) error {
			for _, r := range rows {
				if err := w.put(r.key, r.value); err != nil {
					return err
				}
			}
			return nil
		})
}

// ghostPrincipal is the principal of the entries of dead waiters the
// schedule plants: they share tags, as no library would write them.
const ghostPrincipal = "ghost"

// put writes a row as the schedule's own, not through the library and
// without a fault.
func (w *World) put(key, value string) error {
	if err := firstErr(runlease.CheckKey(key), runlease.CheckValue(value)); err != nil {
		return err
	}
	s := w.store
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(key, &value)
	return nil
}
