package runlease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/simstore"
)

// TestSimulation runs many random schedules of concurrent lease, keeper,
// slot and waiting calls, inside synctest bubbles, against a store whose
// faults a seed decides (not applied, applied with the reply lost, not
// applied with the reply lost, failing reads, calls that hang until their
// context ends, and, with simLateApplies, writes that apply late, after
// their caller was told the outcome was unknown) and whose clock steps
// forward (within the keepers' margin, see simClockRise) and back. After
// every step it checks the README's promises:
//
//   - no two keepers of different leases trust one run at one instant, and
//     a trusting keeper's run is, by the store's rows and clock, live and its
//     own; no more runs than a scope's limit believe they hold its slots;
//   - no call reports success for a fenced write that did not land, and none
//     reports a loss while the row is the caller's own;
//   - no call, Stop, Close or Release blocks more than simBound past its
//     context's end;
//   - fences never go backwards;
//
// and, once everything has stopped and every Slots the drivers got is
// released, that no run's slot row is left live that no Slots of the
// process answers for (checkLeaks).
//
// A failure names its seed; RUNLEASE_SIM_SEED=N replays that one schedule
// with its trace. The seed fixes the schedule's draws, not the order in
// which goroutines woken at one instant run, so a failure that turns on
// that order shows in some replays only: repeat them with -count.
// RUNLEASE_SIM_SCHEDULES sets how many run (default 10,000,
// or 2,000 under the race detector, or simShortRandomSchedules under
// -short), and a quarter as many again whose seeds carry simHandOvers,
// which also hand slots to running keepers and wait for slots under them,
// and a quarter as many again that do so under writes that apply late
// (simLateApplies); the seeds in testdata/sim/seeds.txt always run.
func TestSimulation(t *testing.T) {
	if s := os.Getenv("RUNLEASE_SIM_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RUNLEASE_SIM_SEED=%q: %v", s, err)
		}
		runSchedule(t, seed, true)
		return
	}
	n := 10_000
	switch {
	case testing.Short():
		n = simShortRandomSchedules
	case raceEnabled:
		n = 2_000
	}
	if s := os.Getenv("RUNLEASE_SIM_SCHEDULES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			t.Fatalf("RUNLEASE_SIM_SCHEDULES=%q: %v", s, err)
		}
	}
	seeds := committedSeeds(t)
	for i := range n {
		seeds = append(seeds, uint64(i)+1)
	}
	// A quarter as many again hand slots to running keepers.
	for i := range max(n/4, 1) {
		seeds = append(seeds, (uint64(i)+1)|simHandOvers)
	}
	// And as many again do so under writes that apply late.
	for i := range max(n/4, 1) {
		seeds = append(seeds, (uint64(i)+1)|simHandOvers|simLateApplies)
	}
	failed := 0
	for _, seed := range seeds {
		if !runSchedule(t, seed, false) {
			failed++
			if failed == 5 {
				t.Fatalf("stopping after %d failed schedules", failed)
			}
		}
	}
	t.Logf("%d schedules checked", len(seeds))
}

// simShortRandomSchedules is how many random schedules TestSimulation
// runs under -short, after the committed seeds: the first of the full
// run's, well under a second.
const simShortRandomSchedules = 500

// committedSeeds reads the regression seeds kept in testdata/sim.
func committedSeeds(t *testing.T) []uint64 {
	data, err := os.ReadFile("testdata/sim/seeds.txt")
	if err != nil {
		t.Fatalf("reading the regression seeds: %v", err)
	}
	var seeds []uint64
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			seed, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				t.Fatalf("testdata/sim/seeds.txt: %q: %v", line, err)
			}
			seeds = append(seeds, seed)
		}
	}
	return seeds
}

// simHandOvers is the bit of a seed whose schedule also hands slots to
// running keepers (Keeper.KeepSlots, KeepSlotsStrict) and waits for slots
// under them (Keeper.ClaimSlotsWait). Schedules without it draw as they
// did before those calls existed, so the committed seeds replay as they
// were found.
const simHandOvers = 1 << 62

// simLateApplies is the bit of a seed whose store also lets writes apply
// late (simstore.Late, HangLate): a write its caller was told ended with an
// outcome unknown, or gave up when its context ended, applies a few
// milliseconds later, after the caller's clean-up may have looked for its
// rows, as a server may run a call its client gave up on. The store's reads
// of a key such a write covers wait for it, as the Postgres store's reads
// of a key in doubt do. Schedules without the bit draw the other faults as
// before.
const simLateApplies = 1 << 61

// simLeaveTimeout is how long a wait for slots may spend leaving its
// queues after its context ended (leaveTimeout, CONCURRENCY.md rule 9).
const simLeaveTimeout = 2 * time.Second

// simBound is how long after its context ends (or, for Stop, after it is
// called) a call may still run.
const simBound = time.Second

var simRuns = []string{"r1", "r2"}

const simTTL = 5 * time.Second

// runSchedule runs the schedule of seed in a bubble of its own, and reports
// whether every check held. verbose prints the trace even when they did.
func runSchedule(t *testing.T, seed uint64, verbose bool) (ok bool) {
	ok = true
	passed := t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := newWorld(t, seed)
			defer w.cleanup()
			for step := 0; step < 40 && len(w.violations) == 0; step++ {
				w.step()
				synctest.Wait()
				w.check()
			}
			if len(w.violations) == 0 {
				w.cleanup()
				w.checkLeaks()
			}
			if len(w.violations) > 0 || verbose {
				w.report(seed)
			}
			if len(w.violations) > 0 {
				ok = false
				t.Errorf("seed %d: %s\nreplay: RUNLEASE_SIM_SEED=%d go test -run 'TestSimulation' -v .\n"+
					"(if that replay passes, the order of goroutines woken at one instant matters: add -count=1000)",
					seed, strings.Join(w.violations, "\n"), seed)
			}
		})
	})
	return ok && passed
}

// simClockRise bounds how far the store clock may run ahead of real time,
// within any stretch of simTTL plus simBound, over where it stood at the
// start of that stretch: less than a keeper's margin (simTTL/10). The
// README states the assumption: expiry is judged by a clock that does not
// jump. Beyond the margin no keeper can see a jump that lets a successor in
// between two of its judgements (sim_test.go's clock mode covers that, as
// a fault); back steps, of any size, are always allowed.
const simClockRise = 400 * time.Millisecond

// stepClock steps the store clock by d, cutting a forward step down to
// what simClockRise allows.
func (w *world) stepClock(d time.Duration) {
	now := time.Now()
	keep := w.offsets[:0]
	low := w.offset
	for _, o := range w.offsets {
		if now.Sub(o.at) <= simTTL+simBound {
			keep = append(keep, o)
			low = min(low, o.offset)
		}
	}
	w.offsets = keep
	if d > 0 {
		d = min(d, low+simClockRise-w.offset)
		if d <= 0 {
			return
		}
	}
	w.offsets = append(w.offsets, clockOffset{now, w.offset})
	w.offset += d
	w.offsets = append(w.offsets, clockOffset{now, w.offset})
	w.store.StepClock(d)
}

// clockOffset is where the store clock stood against real time, from at.
type clockOffset struct {
	at     time.Time
	offset time.Duration
}

// world is one schedule: the store, the drivers, and what is in flight.
type world struct {
	t       *testing.T
	rng     *rand.Rand
	store   *simstore.Store
	renewer *runlease.Renewer
	// handOvers: the schedule hands slots to running keepers too.
	handOvers bool
	cancel    context.CancelFunc
	ctx       context.Context
	seq       int
	cleaned   bool // cleanup has run

	mu         sync.Mutex
	held       map[string]*heldRun // by holder + run
	plain      []*runlease.Slots   // slots claimed without a lease
	allSlots   []*runlease.Slots   // every Slots a call returned, for checkLeaks
	flights    map[int]*flight
	log        []string
	violations []string

	offset  time.Duration // the store clock's steps so far, summed
	offsets []clockOffset // its offsets of the last simTTL+simBound
}

type heldRun struct {
	holder, run string
	lease       *runlease.Lease
	keepers     []*runlease.Keeper
	work        []context.Context // each keeper's work context, taken at once as drivers do
	slots       *runlease.Slots
	waited      []*runlease.Slots // admitted by a wait under a keeper while slots was set
	released    bool              // the driver called Release: ErrReleased is its own doing
}

type flight struct {
	what     string
	deadline time.Time // when it must have returned, plus simBound
}

func newWorld(t *testing.T, seed uint64) *world {
	ctx, cancel := context.WithCancel(context.Background())
	rates := simstore.Rates{NotApplied: 5, AppliedUnknown: 6, NotAppliedUnknown: 6, Hang: 2, ReadFail: 8}
	if seed&simLateApplies != 0 {
		rates.Late, rates.HangLate = 4, 3
	}
	return &world{handOvers: seed&simHandOvers != 0,
		t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		store:   simstore.New(seed, rates),
		renewer: &runlease.Renewer{}, ctx: ctx, cancel: cancel,
		held: map[string]*heldRun{}, flights: map[int]*flight{},
	}
}

func (w *world) logf(format string, a ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("%6d ", time.Now().UnixMilli()%1_000_000)+fmt.Sprintf(format, a...))
}

func (w *world) violate(format string, a ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, fmt.Sprintf(format, a...))
}

// launch runs fn on a goroutine of its own with a context that ends after
// timeout, and watches that it returns within simBound of that.
func (w *world) launch(what string, timeout time.Duration, fn func(ctx context.Context)) {
	w.launchBounded(what, timeout, 0, fn)
}

// launchBounded is launch for a call that may run extra longer after its
// context ended, as its contract says.
func (w *world) launchBounded(what string, timeout, extra time.Duration, fn func(ctx context.Context)) {
	w.mu.Lock()
	w.seq++
	id := w.seq
	w.flights[id] = &flight{what: what, deadline: time.Now().Add(timeout + extra + simBound)}
	w.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(w.ctx, timeout)
		defer cancel()
		fn(ctx)
		w.mu.Lock()
		delete(w.flights, id)
		w.mu.Unlock()
	}()
}

// step does one random thing: a call, a pause, or a clock step.
func (w *world) step() {
	n := w.rng.IntN(100)
	switch {
	case n < 12:
		// Microseconds, so that clock readings fall between milliseconds.
		time.Sleep(time.Duration(w.rng.IntN(3_000_000)) * time.Microsecond)
		return
	case n < 16:
		w.stepClock(time.Duration(w.rng.IntN(4000)-2000) * time.Millisecond)
		return
	case n < 31:
		holder := "D" + strconv.Itoa(w.rng.IntN(3))
		run := simRuns[w.rng.IntN(len(simRuns))]
		if w.heldBy(holder, run) == nil {
			w.acquire(holder, run, n < 24)
		}
		return
	case n < 36:
		w.claimPlain()
		return
	case n < 40:
		w.renewPlain()
		return
	}
	h := w.pickHeld()
	if h == nil {
		time.Sleep(time.Duration(w.rng.IntN(1000)) * time.Millisecond)
		return
	}
	run := h.run
	switch {
	case w.handOvers && n < 48 && len(h.keepers) > 0:
		w.handOver(h)
	case n < 52 && len(h.keepers) < 2:
		w.keep(h)
	case n < 62:
		w.launch("renew "+run, 3*time.Second, func(ctx context.Context) { w.checkLoss(h, "Renew", h.lease.Renew(ctx)) })
	case n < 77:
		w.write(h)
	case n < 85 && h.slots == nil:
		w.claim(h)
	case n < 85:
		sl := h.slots
		w.launch("slots renew "+run, 3*time.Second, func(ctx context.Context) { _ = sl.Renew(ctx) })
	case n < 91 && len(h.keepers) > 0:
		k := h.keepers[w.rng.IntN(len(h.keepers))]
		w.launch("stop "+run, 0, func(context.Context) { k.Stop() })
	default:
		w.release(h)
	}
}

// pickHeld returns a random run a driver holds (or held), or nil.
func (w *world) pickHeld() *heldRun {
	w.mu.Lock()
	var keys []string
	for k, h := range w.held {
		if h.lease != nil {
			keys = append(keys, k)
		}
	}
	w.mu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys) // map order is random: sort for a replayable choice
	key := keys[w.rng.IntN(len(keys))]
	return w.heldBy(key[:strings.IndexByte(key, '/')], key[strings.IndexByte(key, '/')+1:])
}

func (w *world) heldBy(holder, run string) *heldRun {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.held[holder+"/"+run]
	if h != nil && h.lease != nil && h.lease.Err() != nil && allEnded(h.keepers) {
		delete(w.held, holder+"/"+run) // lost or released: the driver may start again
		return nil
	}
	return h
}

func allEnded(ks []*runlease.Keeper) bool {
	for _, k := range ks {
		select {
		case <-k.Done():
		default:
			return false
		}
	}
	return true
}

func (w *world) acquire(holder, run string, wait bool) {
	key := holder + "/" + run
	w.mu.Lock()
	w.held[key] = &heldRun{holder: holder, run: run} // reserved, so no second acquire starts
	w.mu.Unlock()
	w.launch("acquire "+key, 3*time.Second, func(ctx context.Context) {
		var l *runlease.Lease
		var err error
		if wait {
			// Half the waits (by key, so the schedule's draws stay as
			// they were) are woken without rows, and re-read each time.
			var store runlease.Store = w.store
			if crc32.ChecksumIEEE([]byte(key))%2 == 0 {
				store = wakeOnly{w.store}
			}
			l, err = runlease.AcquireWait(ctx, store, run, holder, runlease.WithTTL(simTTL))
			if err != nil && ctx.Err() != nil && err != ctx.Err() {
				w.violate("AcquireWait returned %v, not ctx.Err(), when its context ended", err)
			}
		} else {
			l, err = runlease.Acquire(ctx, w.store, run, holder, runlease.WithTTL(simTTL))
		}
		w.logf("acquire %s wait=%v: fence %d %v", key, wait, fenceOf(l), err)
		w.mu.Lock()
		defer w.mu.Unlock()
		if err != nil {
			delete(w.held, key)
			return
		}
		w.held[key].lease = l
	})
}

// wakeOnly is the simulated store as a [runlease.Notifier] that is not a
// [runlease.RowNotifier]: its SubscribeRows, of another signature, hides
// the store's.
type wakeOnly struct{ *simstore.Store }

func (wakeOnly) SubscribeRows() {}

// Unwrap says that a wakeOnly is the store it wraps, so that drivers
// reaching it either way are told apart as drivers of one store.
func (w wakeOnly) Unwrap() runlease.Store { return w.Store }

func fenceOf(l *runlease.Lease) uint64 {
	if l == nil {
		return 0
	}
	return l.Fence()
}

func (w *world) keep(h *heldRun) {
	if h.lease == nil {
		return
	}
	var opts []runlease.Option
	if h.slots != nil {
		if w.rng.IntN(2) == 0 {
			opts = append(opts, runlease.KeepSlotsStrict(h.slots))
		} else {
			opts = append(opts, runlease.KeepSlots(h.slots))
		}
	}
	var k *runlease.Keeper
	var err error
	if w.rng.IntN(2) == 0 {
		k, err = w.renewer.Keep(w.ctx, h.lease, opts...)
	} else {
		k, err = runlease.Keep(w.ctx, h.lease, opts...)
	}
	w.logf("keep %s/%s: %v", h.holder, h.run, err)
	if err == nil {
		w.mu.Lock()
		h.keepers = append(h.keepers, k)
		h.work = append(h.work, k.Context())
		w.mu.Unlock()
	}
}

// handOver gives a running keeper of h the run's slots, kept strictly or
// not, or, when the driver holds none, waits for a slot under the keeper.
func (w *world) handOver(h *heldRun) {
	w.mu.Lock()
	k, slots := h.keepers[w.rng.IntN(len(h.keepers))], h.slots
	w.mu.Unlock()
	if slots != nil {
		strict := w.rng.IntN(2) == 0
		var err error
		if strict {
			err = k.KeepSlotsStrict(slots)
		} else {
			err = k.KeepSlots(slots)
		}
		w.logf("hand over %s/%s strict=%v: %v", h.holder, h.run, strict, err)
		switch {
		case err == nil:
			if k.Slots() != slots {
				w.violate("KeepSlots of %s/%s returned nil, but the keeper keeps %p, not %p", h.holder, h.run, k.Slots(), slots)
			}
		case errors.Is(err, runlease.ErrInvalidArgument), strict && errors.Is(err, runlease.ErrSlotLost) && k.Slots() != slots:
			// keeps other slots, or the claim is no longer whole
		case err != k.Err():
			w.violate("KeepSlots of %s/%s refused with %v, not the keeper's reason %v", h.holder, h.run, err, k.Err())
		}
		return
	}
	w.launchBounded("wait "+h.run, 3*time.Second, simLeaveTimeout, func(ctx context.Context) {
		s, err := k.ClaimSlotsWait(ctx, []runlease.Scope{runlease.MemScope(1)})
		w.logf("wait under a keeper %s/%s: %v", h.holder, h.run, err)
		if err != nil {
			w.checkLoss(h, "Keeper.ClaimSlotsWait", err)
			return
		}
		if k.Slots() != s {
			w.violate("Keeper.ClaimSlotsWait of %s/%s returned slots its keeper does not keep", h.holder, h.run)
		}
		w.mu.Lock()
		w.allSlots = append(w.allSlots, s)
		if h.slots == nil {
			h.slots = s
		} else {
			h.waited = append(h.waited, s)
		}
		w.mu.Unlock()
	})
}

func (w *world) write(h *heldRun) {
	if h.lease == nil {
		return
	}
	w.seq++
	value := "v" + strconv.Itoa(w.seq)
	w.launch("write "+h.run, 3*time.Second, func(ctx context.Context) {
		err := h.lease.Write(ctx, runlease.Put("ckpt:"+h.run, value))
		w.logf("write %s/%s %s: %v", h.holder, h.run, value, err)
		if err == nil && !w.store.Applied(value) {
			w.violate("Write of %s by %s returned nil, but the value never landed", value, h.holder)
		}
		w.checkLoss(h, "Write", err)
	})
}

func (w *world) release(h *heldRun) {
	if h.lease == nil {
		return
	}
	w.mu.Lock()
	h.released = true
	w.mu.Unlock()
	w.launch("release "+h.run, 3*time.Second, func(ctx context.Context) {
		// A claim launched before may still set h.slots: read it, and
		// the keepers, under the lock the claim writes them under.
		w.mu.Lock()
		slots, keepers, waited := h.slots, h.keepers, slices.Clone(h.waited)
		w.mu.Unlock()
		var err error
		if len(keepers) > 0 {
			err = keepers[0].Release(ctx)
		} else {
			err = h.lease.Release(ctx)
		}
		if slots != nil {
			_ = slots.Release(ctx) // a no-op when the keeper released them
		}
		for _, s := range waited {
			_ = s.Release(ctx)
		}
		w.logf("release %s/%s: %v", h.holder, h.run, err)
		w.checkLoss(h, "Release", err)
	})
}

func (w *world) claim(h *heldRun) {
	if h.lease == nil {
		return
	}
	w.launch("claim "+h.run, 3*time.Second, func(ctx context.Context) {
		s, err := h.lease.ClaimSlots(ctx, []runlease.Scope{runlease.MemScope(1)})
		w.logf("claim %s/%s: %v", h.holder, h.run, err)
		if err == nil {
			w.mu.Lock()
			w.allSlots = append(w.allSlots, s)
			h.slots = s
			w.mu.Unlock()
		}
	})
}

func (w *world) claimPlain() {
	w.seq++
	run := "p" + strconv.Itoa(w.seq)
	w.launch("claim plain "+run, 3*time.Second, func(ctx context.Context) {
		s, err := runlease.ClaimSlots(ctx, w.store, run, []runlease.Scope{runlease.MemScope(1)}, runlease.WithTTL(simTTL))
		w.logf("claim plain %s: %v", run, err)
		if err == nil {
			w.mu.Lock()
			w.allSlots = append(w.allSlots, s)
			w.plain = append(w.plain, s)
			w.mu.Unlock()
		}
	})
}

func (w *world) renewPlain() {
	w.mu.Lock()
	plain := append([]*runlease.Slots(nil), w.plain...)
	w.mu.Unlock()
	for _, s := range plain {
		release := w.rng.IntN(4) == 0
		w.launch("slots renew "+s.RunID(), 3*time.Second, func(ctx context.Context) {
			if release {
				w.logf("release plain %s: %v", s.RunID(), s.Release(ctx))
				return
			}
			w.logf("renew plain %s: %v", s.RunID(), s.Renew(ctx))
		})
	}
}

// storeRow decodes the lease row of run as the store holds it.
func (w *world) storeRow(key string) (row struct {
	Holder  string `json:"holder"`
	Fence   uint64 `json:"fence"`
	UntilMS int64  `json:"until_ms"`
}, found bool) {
	raw, found := w.store.Row(key)
	if found {
		_ = json.Unmarshal([]byte(raw), &row)
	}
	return row, found
}

// checkLoss fails the schedule when a call reported a loss (other than the
// trust window's end) while the lease row is the caller's own.
func (w *world) checkLoss(h *heldRun, call string, err error) {
	if !errors.Is(err, runlease.ErrLeaseLost) || errors.Is(err, runlease.ErrTrustExpired) {
		return
	}
	w.mu.Lock()
	released := h.released
	w.mu.Unlock()
	if released && errors.Is(err, runlease.ErrReleased) {
		return // the driver gave the lease up itself
	}
	row, found := w.storeRow(runlease.LeasePrefix + h.run)
	if found && row.Holder == h.lease.Holder() && row.Fence == h.lease.Fence() {
		w.violate("%s by %s reported %v, but the row is its own: %+v", call, h.holder, err, row)
	}
}

// check tests every promise at this instant.
func (w *world) check() {
	now, _ := w.store.ClockNow()
	nowMS := now.UnixMilli()
	w.mu.Lock()
	held := make([]*heldRun, 0, len(w.held))
	for _, h := range w.held {
		held = append(held, h)
	}
	plain := append([]*runlease.Slots(nil), w.plain...)
	var late []string
	for _, f := range w.flights {
		if time.Now().After(f.deadline) {
			late = append(late, f.what)
		}
	}
	w.mu.Unlock()
	for _, what := range late {
		w.violate("%s still running %v after its context ended", what, simBound)
	}
	trusting := map[string][]*heldRun{}
	believers := map[string]bool{}
	for _, h := range held {
		if h.lease == nil {
			continue
		}
		if lost := h.lease.Err(); lost != nil {
			for i, work := range h.work {
				if work.Err() == nil {
					w.violate("keeper %d of %s/%s: its lease is lost (%v), its work context still live", i, h.holder, h.run, lost)
				}
			}
		}
		trusted := false
		for _, k := range h.keepers {
			err := k.Err()
			if err == nil {
				trusted = true
				trusting[h.run] = append(trusting[h.run], h)
				row, _ := w.storeRow(runlease.LeasePrefix + h.run)
				if row.Holder != h.holder || row.Fence != h.lease.Fence() || row.UntilMS <= nowMS {
					w.violate("keeper of %s/%s (fence %d) trusts, but the row is %+v at %d", h.holder, h.run, h.lease.Fence(), row, nowMS)
				}
				break
			}
			if !errors.Is(err, runlease.ErrTrustExpired) && errors.Is(err, runlease.ErrLeaseLost) {
				w.checkLoss(h, "Keeper", err)
			}
		}
		// Slot rows belong to runs, not drivers: a replaced driver's Slots
		// describe its run's slots, which its successor now keeps and may
		// release. Only a driver whose keeper trusts its lease speaks for
		// the run's slots (the README's way of using them).
		if h.slots != nil && trusted {
			w.checkBeliever(h.slots, nowMS, believers)
		}
		if trusted {
			w.mu.Lock()
			waited := slices.Clone(h.waited)
			w.mu.Unlock()
			for _, s := range waited {
				w.checkBeliever(s, nowMS, believers)
			}
		}
	}
	for _, s := range plain {
		w.checkBeliever(s, nowMS, believers)
	}
	for run, hs := range trusting {
		if len(hs) > 1 {
			w.violate("%d keepers of different leases trust run %s at once: %s and %s", len(hs), run, hs[0].holder, hs[1].holder)
		}
	}
	if len(believers) > 1 {
		w.violate("%d runs believe they hold the only slot of mem", len(believers))
	}
	for _, b := range w.store.Broken() {
		w.violate("fence went backwards: %s", b)
	}
}

func (w *world) checkBeliever(s *runlease.Slots, nowMS int64, believers map[string]bool) {
	for _, info := range s.Held() {
		believers[s.RunID()] = true
		row, _ := w.storeRow(info.Key)
		if row.Holder != s.RunID() || row.UntilMS <= nowMS {
			w.violate("run %s believes it holds %s, but the row is %+v at %d", s.RunID(), info.Key, row, nowMS)
		}
	}
}

// cleanup ends everything the schedule started, so that the bubble can end.
// It runs once.
func (w *world) cleanup() {
	if w.cleaned {
		return
	}
	w.cleaned = true
	w.store.SetFaulty(false)
	w.cancel()
	w.mu.Lock()
	var keepers []*runlease.Keeper
	for _, h := range w.held {
		keepers = append(keepers, h.keepers...)
	}
	w.mu.Unlock()
	for _, k := range keepers {
		k.Stop()
	}
	w.renewer.Close()
	// Every call returns within simBound of its context's end (an
	// acquisition may spend part of it releasing what it wrote), and a
	// wait for slots within simLeaveTimeout more.
	if w.handOvers {
		time.Sleep(simLeaveTimeout)
	}
	time.Sleep(simBound)
	synctest.Wait()
}

// checkLeaks runs after cleanup, with faults off and every call returned:
// it releases every Slots a call returned (a driver may have forgotten
// one: a claim that returned after its driver's lease was lost), then, for each run that still
// has a live slot row, clears the queues and claims and releases a slot of
// the run afresh (which takes over and deletes the rows the process
// remembers as its failed claims' leftovers, trusted by nobody). A live
// slot row left after that is a leak: a row no Slots answers for and the
// process does not know of, which keeps the scope full until its TTL.
func (w *world) checkLeaks() {
	ctx := context.Background()
	w.mu.Lock()
	all := slices.Clone(w.allSlots)
	w.mu.Unlock()
	for _, s := range all {
		_ = s.Release(ctx)
	}
	live := func() []runlease.Row {
		now, _ := w.store.ClockNow()
		rows, err := w.store.MetaScan(ctx, runlease.SlotPrefix)
		if err != nil {
			w.violate("scanning the slot rows: %v", err)
			return nil
		}
		var out []runlease.Row
		for _, r := range rows {
			var row struct {
				Holder  string `json:"holder"`
				UntilMS int64  `json:"until_ms"`
			}
			if json.Unmarshal([]byte(r.Value), &row) == nil && row.UntilMS > now.UnixMilli() {
				out = append(out, r)
			}
		}
		return out
	}
	// A queue entry left live (its delete failed, or its write applied
	// late, after its waiter left) keeps a plain claim out until it
	// expires: such entries are not what this checks, and go first.
	for _, prefix := range []string{runlease.QueuePrefix, runlease.PlacePrefix, runlease.LegacyQueuePrefix} {
		rows, err := w.store.MetaScan(ctx, prefix)
		if err != nil {
			w.violate("scanning %s: %v", prefix, err)
		}
		for _, r := range rows {
			_, _ = w.store.MetaDelete(ctx, r.Key, r.Value)
		}
	}
	for _, r := range live() {
		var row struct {
			Holder string `json:"holder"`
		}
		_ = json.Unmarshal([]byte(r.Value), &row)
		s, err := runlease.ClaimSlots(ctx, w.store, row.Holder, []runlease.Scope{runlease.MemScope(1)}, runlease.WithTTL(simTTL))
		w.logf("leak check: claim of %s over %s: %v", row.Holder, r.Key, err)
		if err == nil {
			_ = s.Release(ctx)
		}
	}
	for _, r := range live() {
		w.violate("slot row %s = %s left live after every Slots was released: no Slots answers for it", r.Key, r.Value)
	}
}

func (w *world) report(seed uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Logf("seed %d: schedule", seed)
	for _, l := range w.log {
		w.t.Log("  ", l)
	}
	w.t.Logf("seed %d: store", seed)
	for _, l := range w.store.Trace() {
		w.t.Log("  ", l)
	}
}
