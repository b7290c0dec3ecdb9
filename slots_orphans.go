package runlease

import (
	"context"
	"errors"
	"sync"
	"time"
)

// A slot row belongs to the one claim that wrote it: another claim of the
// same run counts it as a slot in use, never as its own, because the Slots
// that wrote it may still trust it. Some rows of the run, though, are
// provably trusted by nobody: a claim that failed wrote them (its write's
// outcome was unknown, or putting the slot back failed), or a Slots gave
// them up (a Release whose delete failed).
// The process remembers those rows, by Store value and run, with their
// exact text, which no other Slots ever sent: it carries the claim id of
// the Slots that sent it (newClaimID), which tells its rows from those of
// every other claim of the run, in this process or another, and that
// Slots stamps its rows at a key from a lineage of its own (lineage.go),
// so it never sends one row twice. A row with fence 0 (the reference's,
// or an older version's) is never remembered: it is nobody's leftover
// here. A later claim of
// the run here takes such a row as a free slot (the write over it is
// conditional on those very bytes), so a run whose claim failed is not
// kept out of a full scope by its own leftovers for a TTL; and a Release
// of any Slots of the run deletes them, so that a run that gives its slots
// back leaves none of its rows behind.
//
// A remembered row is forgotten once it is deleted or written over here,
// or once it has surely expired: its deadline on this process's monotonic
// clock is set when it is remembered, from its until_ms and the clock that
// stamped it, plus a slack. Only rows of this process are remembered: a row
// left by another process (a driver that died) is held like any other
// until it expires or is released.
//
// orphans.mu is a leaf lock, held only to read or write the map, never
// with another lock of the library's.
var orphans = struct {
	mu    sync.Mutex
	m     map[orphanRun]map[string]map[string]orphanLife // run → key → row text → its life
	count int
}{m: map[orphanRun]map[string]map[string]orphanLife{}}

// orphanLife is when a row was remembered, and when it has surely expired.
type orphanLife struct{ at, deadline time.Time }

// over reports whether the row is forgotten at now: past its deadline, or
// remembered at a later instant than now (a clock that started over, as
// each testing/synctest bubble's does; never a process's monotonic one).
func (l orphanLife) over(now time.Time) bool { return now.After(l.deadline) || now.Before(l.at) }

// maxOrphans bounds the rows remembered: past it, one more is not
// remembered (it then expires as any row no Slots renews).
const maxOrphans = 4096

// orphanSlack is how long past its until_ms a row is remembered, for the
// clocks' disagreement.
const orphanSlack = time.Minute

type orphanRun struct {
	store Store
	runID string
}

// rememberOrphan records that row, sent to key for runID with until_ms
// untilMS when the clock that stamped it read nowMS, is trusted by no
// Slots of this process. The expired rows of every run are swept first,
// so that a store no longer used is not kept reachable past its rows.
//
// lin, the lineage that stamped the row, is pinned until the row has
// expired: were it collected, a later claim of the same Slots at the key
// (a waiting claim admitted again after an admission whose outcome was
// unknown) would start a new lineage and could stamp the very same bytes
// (the same claim id and until_ms, from a clock that stood still), and the
// process would take that live claim's row for the leftover, free for
// another claim and deleted by any Release of the run.
func rememberOrphan(store Store, runID, key, row string, untilMS, nowMS int64, lin *lineage) {
	lin.pin(time.UnixMilli(nowMS), untilMS)
	now := time.Now()
	life := orphanLife{now, now.Add(time.Duration(untilMS-nowMS)*time.Millisecond + orphanSlack)}
	k := orphanRun{storeIdentity(store), runID}
	orphans.mu.Lock()
	defer orphans.mu.Unlock()
	for r, keys := range orphans.m {
		for key, rows := range keys {
			for row, l := range rows {
				if l.over(now) {
					forgetOrphanLocked(r, key, row)
				}
			}
		}
	}
	if orphans.count >= maxOrphans {
		return
	}
	keys := orphans.m[k]
	if keys == nil {
		keys = map[string]map[string]orphanLife{}
		orphans.m[k] = keys
	}
	if keys[key] == nil {
		keys[key] = map[string]orphanLife{}
	}
	if _, ok := keys[key][row]; !ok {
		orphans.count++
	}
	keys[key][row] = life
}

// forgetOrphan drops row at key, deleted or written over, and reports
// whether it was remembered.
func forgetOrphan(store Store, runID, key, row string) bool {
	k := orphanRun{storeIdentity(store), runID}
	orphans.mu.Lock()
	defer orphans.mu.Unlock()
	return forgetOrphanLocked(k, key, row)
}

func forgetOrphanLocked(k orphanRun, key, row string) bool {
	rows := orphans.m[k][key]
	if _, ok := rows[row]; !ok {
		return false
	}
	delete(rows, row)
	orphans.count--
	if len(rows) == 0 {
		delete(orphans.m[k], key)
		if len(orphans.m[k]) == 0 {
			delete(orphans.m, k)
		}
	}
	return true
}

// orphanTest returns a test of whether a row at a key is one of runID's
// that no Slots of this process trusts, or nil when the process remembers
// none of runID's on store (the common case: a claim then pays nothing per
// row).
func orphanTest(store Store, runID string) func(key, row string) bool {
	k := orphanRun{storeIdentity(store), runID}
	orphans.mu.Lock()
	n := len(orphans.m[k])
	orphans.mu.Unlock()
	if n == 0 {
		return nil
	}
	return func(key, row string) bool {
		orphans.mu.Lock()
		defer orphans.mu.Unlock()
		l, ok := orphans.m[k][key][row]
		return ok && !l.over(time.Now())
	}
}

// orphansOf returns the remembered rows of runID on store, by key.
func orphansOf(store Store, runID string) map[string][]string {
	k := orphanRun{storeIdentity(store), runID}
	now := time.Now()
	orphans.mu.Lock()
	defer orphans.mu.Unlock()
	var out map[string][]string
	for key, rows := range orphans.m[k] {
		for row, l := range rows {
			if l.over(now) {
				continue
			}
			if out == nil {
				out = map[string][]string{}
			}
			out[key] = append(out[key], row)
		}
	}
	return out
}

// releaseOrphans deletes the remembered rows of the run, each only while
// it holds the text remembered, and forgets those deleted or gone.
func (s *Slots) releaseOrphans(ctx context.Context) error {
	var errs []error
	for key, rows := range orphansOf(s.store, s.runID) {
		scope, _, _ := parseSlotKey(key)
		for _, row := range rows {
			if _, err := deleteRinging(ctx, s.store, key, row, scope); err != nil {
				errs = append(errs, err)
				continue
			}
			forgetOrphan(s.store, s.runID, key, row) // deleted, or moved on
		}
	}
	return errors.Join(errs...)
}
