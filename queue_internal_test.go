package runlease

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fairModel is one scope's queue driven the way waiters drive it: entries
// ranked by rankIn when they queue, each moving its principal's mark, the
// first in rank order admitted next, moving the clock (unit claims, one
// slot freed at a time).
type fairModel struct {
	queue   []queuedRow
	nowMS   int64
	seq     int
	weights map[string]int
	marks   map[string]int64 // as the fair-share marks keep them
	clock   int64            // as the scope's clock keeps it
}

func (m *fairModel) enqueue(principal string, priority int) string {
	m.seq++
	m.nowMS++
	run := principal + "-" + strconv.Itoa(m.seq)
	e := queueEntry{Run: run, Waiter: run, Principal: principal, Weight: m.weights[principal],
		Priority: priority, Units: 1, EnqMS: m.nowMS, UntilMS: 1 << 62}
	if m.marks == nil {
		m.marks = map[string]int64{}
	}
	st := &scopeState{marks: map[string]int64{principal: m.marks[principal]}, clock: m.clock}
	for _, q := range m.queue {
		if q.e.Priority == priority && (!st.prioSeen || q.e.Tag < st.prioTag) {
			st.prioTag, st.prioSeen = q.e.Tag, true
		}
	}
	e.Tag = rankIn([]*scopeState{st}, run, principal, priority)
	m.marks[principal] = max(m.marks[principal], e.finish())
	m.queue = append(m.queue, queuedRow{key: run, e: e})
	return run
}

// admit takes the entry that ranks first out of the queue.
func (m *fairModel) admit() queueEntry {
	best := 0
	for i := range m.queue {
		if m.queue[i].e.before(&m.queue[best].e) {
			best = i
		}
	}
	e := m.queue[best].e
	m.queue = slices.Delete(m.queue, best, best+1)
	m.clock = max(m.clock, e.finish())
	return e
}

func (m *fairModel) waiting(principal string) int {
	n := 0
	for _, q := range m.queue {
		if q.e.Principal == principal {
			n++
		}
	}
	return n
}

// TestFairShareProperties checks, over many random schedules of arrivals
// and admissions, what the README promises of the order: a principal's
// runs are admitted in the order they queued; a higher priority always
// goes first; and over any stretch of admissions during which two
// principals both had runs waiting, their admissions divided by their
// weights differ by at most 1/w1 + 1/w2 (start-time fair queueing's bound).
// Under -short it checks the first 60 of its 300 schedules.
func TestFairShareProperties(t *testing.T) {
	t.Parallel()
	seeds := uint64(300)
	if testing.Short() {
		seeds = 60
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(seed, 7))
		principals := []string{"a", "b", "c"}[:2+rng.IntN(2)]
		m := &fairModel{weights: map[string]int{}}
		for _, p := range principals {
			m.weights[p] = 1 + rng.IntN(4)
		}
		lastAdmitted := map[string]int{} // principal: seq of its last admission
		// epoch counts, per principal, the times it had nothing waiting
		// after an admission: a stretch is backlogged for a principal
		// only while its epoch stays the same (a principal left idle
		// loses its credit, by design).
		epoch := map[string]int{}
		type step struct {
			principal string
			backlog   map[string]bool // who had runs waiting at the admission
			epoch     map[string]int
		}
		var admitted []step
		for range 300 {
			if rng.IntN(3) > 0 || len(m.queue) == 0 {
				m.enqueue(principals[rng.IntN(len(principals))], 0)
				continue
			}
			backlog := map[string]bool{}
			for _, p := range principals {
				backlog[p] = m.waiting(p) > 0
			}
			ep := map[string]int{}
			for p, n := range epoch {
				ep[p] = n
			}
			e := m.admit()
			seq, _ := strconv.Atoi(e.Run[len(e.Principal)+1:])
			require.Greater(t, seq, lastAdmitted[e.Principal], "seed %d: %s admitted out of its principal's queue order", seed, e.Run)
			lastAdmitted[e.Principal] = seq
			admitted = append(admitted, step{e.Principal, backlog, ep})
			if m.waiting(e.Principal) == 0 {
				epoch[e.Principal]++
			}
		}
		// Every window of admissions during which both i and j were
		// backlogged at every admission.
		for _, i := range principals {
			for _, j := range principals {
				if i >= j {
					continue
				}
				wi, wj := float64(m.weights[i]), float64(m.weights[j])
				for from := range admitted {
					ni, nj := 0.0, 0.0
					a0 := admitted[from]
					for to := from; to < len(admitted) && admitted[to].backlog[i] && admitted[to].backlog[j] &&
						admitted[to].epoch[i] == a0.epoch[i] && admitted[to].epoch[j] == a0.epoch[j]; to++ {
						switch admitted[to].principal {
						case i:
							ni++
						case j:
							nj++
						}
						d := ni/wi - nj/wj
						require.LessOrEqual(t, max(d, -d), 1/wi+1/wj+1e-9,
							"seed %d: %s (weight %v) and %s (weight %v) got %v and %v admissions in one backlogged stretch", seed, i, wi, j, wj, ni, nj)
					}
				}
			}
		}
	}
}

func TestPriorityIsStrictAndTiesGoToTheEarlierRun(t *testing.T) {
	t.Parallel()
	m := &fairModel{weights: map[string]int{"a": 1, "b": 1}}
	low := m.enqueue("a", 0)
	high := m.enqueue("b", 2)
	m.enqueue("a", 0)
	assert.Equal(t, high, m.admit().Run)
	assert.Equal(t, low, m.admit().Run)
}

func TestAPrincipalsFirstRunIsNotHeldBackByAnothersBacklog(t *testing.T) {
	t.Parallel()
	m := &fairModel{weights: map[string]int{"big": 1, "new": 1}}
	for range 1000 {
		m.enqueue("big", 0)
	}
	first := m.enqueue("new", 0)
	ahead := 0
	for e := m.admit(); e.Run != first; e = m.admit() {
		ahead++
	}
	assert.Equal(t, 1, ahead, "only the backlog's head, which ties with it and queued first")
}

func TestJudgeReservesForWaitersAhead(t *testing.T) {
	t.Parallel()
	heavy := queuedRow{e: queueEntry{Run: "heavy", Weight: 1, Units: 2, EnqMS: 1}}
	me := &queueEntry{Run: "me", Weight: 1, Units: 1, EnqMS: 2}
	v := judge(1, []queuedRow{heavy}, me)
	assert.False(t, v.admits(1, 3), "1 held + 2 reserved + 1 asked is over 3")
	assert.Equal(t, "order", v.blockedBy(1, 3))
	assert.True(t, v.admits(1, 4))
	// A waiter ahead that already holds a slot of the scope (counted in
	// used) reserves both its units: its admission takes rows of its own.
	v = judge(2, []queuedRow{heavy}, me)
	assert.False(t, v.admits(1, 4), "2 held + 2 reserved + 1 asked is over 4")
	assert.Equal(t, "capacity", judge(3, nil, me).blockedBy(1, 3))
}
