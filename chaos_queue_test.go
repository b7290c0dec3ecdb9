//go:build linux

package runlease_test

// The admission queue under pauses and kills, on the shared Postgres
// store: three child processes of eight competitors each wait for slots of
// two scopes (gpu, limit 4; db, limit 2) with ClaimSlotsWait, as three
// principals of weights 1, 1 and 2. A quarter of them take 2 gpu units, a
// quarter need both scopes, the rest one unit of one scope. Once admitted,
// a competitor acquires a lease on its own run id, keeps lease and slots
// with a strict keeper for a short random time, and releases them. The
// parent pauses and kills the children at random and scans the slot rows
// and the queues every 50 ms. Afterwards it checks what the competitors
// believed against the limits (chaos.QueueBeliefs says why that is sound),
// the store's own view of the limits, and first-come-first-served within a
// principal (chaos.CheckQueueOrder), and reports the longest wait against
// the documented bound, the fair shares, and the time from a release to
// the next admission.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/chaos"
	"github.com/areev/runlease/internal/history"
	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
)

var roleChaosQueue = proctest.Register("chaos-queue-competitor", func() int { return chaos.RunChild(chaosOpener(qcConns), qcChild) })

const (
	qcProcs       = 3
	qcCompetitors = 8 // per process
	qcConns       = 8
	qcTTL         = runlease.MinTTL
	qcPoll        = 50 * time.Millisecond
	qcWaitFor     = 30 * time.Second // a wait longer than this gives up
	qcMaxHold     = 2 * time.Second
)

var (
	qcLimits     = map[string]int{"gpu": 4, "db": 2}
	qcPrincipals = []string{"team-a", "team-b", "team-c"}
	qcWeights    = map[string]int{"team-a": 1, "team-b": 1, "team-c": 2}
)

// qcScopes is what competitor g asks for: 2 gpu units, one of gpu and one
// of db, one gpu unit, or one db unit.
func qcScopes(g int) []runlease.Scope {
	gpu, db := runlease.NamedScope("gpu", qcLimits["gpu"]), runlease.NamedScope("db", qcLimits["db"])
	switch g % 4 {
	case 0:
		return []runlease.Scope{gpu.Take(2)}
	case 1:
		return []runlease.Scope{gpu, db}
	case 2:
		return []runlease.Scope{gpu}
	default:
		return []runlease.Scope{db}
	}
}

func qcChild(r *chaos.Run) {
	var wg sync.WaitGroup
	for g := range qcCompetitors {
		principal := qcPrincipals[(g+r.Slot)%len(qcPrincipals)]
		run := fmt.Sprintf("q-gen%d-slot%d-c%d", r.Gen, r.Slot, g)
		c := &qcCompetitor{r: r, run: run, holder: runlease.HolderFor("chaos", run), principal: principal,
			scopes: qcScopes(g), ignoreKeeper: chaos.BreakMode() == chaos.BreakQueueIgnoreKeeper}
		wg.Go(func() {
			// Competitors start spread over a second, as runs of a busy
			// engine arrive.
			chaos.Sleep(r.Ctx, time.Duration(rand.IntN(1000))*time.Millisecond)
			for time.Now().Before(r.StopAt) {
				c.round()
			}
		})
	}
	wg.Wait()
}

// qcCompetitor is one run that waits for slots, round after round.
type qcCompetitor struct {
	r            *chaos.Run
	run, holder  string
	principal    string
	scopes       []runlease.Scope
	ignoreKeeper bool
}

func (c *qcCompetitor) emit(ev chaos.Event) {
	ev.Run, ev.Holder = c.run, c.holder
	c.r.Out.Emit(ev)
}

// round waits for the slots, then holds them under a strict keeper of the
// run's lease for a while, and gives both back.
func (c *qcCompetitor) round() {
	names := make([]string, len(c.scopes))
	for i, sc := range c.scopes {
		names[i] = sc.Name()
	}
	t0 := history.Mono()
	c.emit(chaos.Event{Kind: chaos.KindWait, T0: t0, Principal: c.principal, Scopes: names})
	ctx, cancel := context.WithDeadline(c.r.Ctx, earliestTime(time.Now().Add(qcWaitFor), c.r.StopAt.Add(5*time.Second)))
	slots, err := runlease.ClaimSlotsWait(ctx, c.r.Store, c.run, c.scopes, runlease.WithTTL(qcTTL),
		runlease.WithFairShare(c.principal, qcWeights[c.principal]),
		runlease.WithHooks(runlease.Hooks{SlotsRequeued: func(runlease.RequeueEvent) {
			c.emit(chaos.Event{Kind: chaos.KindRequeue, T0: history.Mono()})
		}}),
		runlease.WithLogger(slog.New(slog.DiscardHandler)))
	t1 := history.Mono()
	cancel()
	if err != nil {
		c.emit(chaos.Event{Kind: chaos.KindGiveUp, T0: t0, T1: t1, Res: chaos.Reason(err)})
		if !errors.Is(err, context.DeadlineExceeded) {
			c.r.Out.Errorf("wait of %s: %v", c.run, err)
			chaos.Sleep(c.r.Ctx, 100*time.Millisecond)
		}
		return
	}
	var keys []string
	for _, h := range slots.Held() {
		keys = append(keys, h.Key)
	}
	c.emit(chaos.Event{Kind: chaos.KindAdmit, T0: t0, T1: t1, Keys: keys, Trust: c.trust(slots.TrustedUntil())})
	if len(keys) != qcUnits(c.scopes) {
		c.r.Out.Errorf("run %s holds %v after asking for %d units", c.run, keys, qcUnits(c.scopes))
	}

	lease, err := runlease.Acquire(c.r.Ctx, c.r.Store, c.run, c.holder, runlease.WithTTL(qcTTL))
	if err != nil {
		c.r.Out.Errorf("acquire %s: %v", c.run, err)
		c.emit(chaos.Event{Kind: chaos.KindEnd, T0: history.Mono(), Trust: c.trust(slots.TrustedUntil()), Res: "acquire"})
		c.release(keys, slots.Release)
		return
	}
	keeper, err := runlease.Keep(c.r.Ctx, lease, runlease.KeepSlotsStrict(slots), runlease.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		c.r.Out.Errorf("keep %s: %v", c.run, err)
		c.emit(chaos.Event{Kind: chaos.KindEnd, T0: history.Mono(), Trust: c.trust(slots.TrustedUntil()), Res: "keep"})
		c.release(keys, func(ctx context.Context) error { return errors.Join(slots.Release(ctx), lease.Release(ctx)) })
		return
	}
	why := c.hold(keeper)
	stop := history.Mono() // after the loss was seen, before Release is called
	c.emit(chaos.Event{Kind: chaos.KindEnd, T0: stop, Trust: c.trust(keeper.TrustedUntil()), Res: why})
	c.release(keys, keeper.Release)
}

// hold waits for a random short time, or until the keeper ends.
func (c *qcCompetitor) hold(keeper *runlease.Keeper) string {
	d := time.Duration(200+rand.IntN(int(qcMaxHold/time.Millisecond)-200)) * time.Millisecond
	if c.ignoreKeeper {
		chaos.Sleep(c.r.Ctx, 2*d) // longer, so that pauses catch it holding
		return "release"
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return "release"
	case <-keeper.Done():
		return chaos.Reason(keeper.Err())
	}
}

func (c *qcCompetitor) release(keys []string, release func(context.Context) error) {
	c.emit(chaos.Event{Kind: chaos.KindRelease, T0: history.Mono(), Keys: keys})
	ctx, cancel := context.WithTimeout(c.r.Ctx, 20*time.Second)
	defer cancel()
	if err := release(ctx); err != nil && !errors.Is(err, runlease.ErrLeaseLost) && !errors.Is(err, runlease.ErrSlotLost) {
		c.r.Out.Errorf("release %s: %v", c.run, err)
	}
}

// trust converts a TrustedUntil to the Mono clock: 0 for a competitor that
// ignores it, and the belief's end at once for a zero one (nothing held).
func (c *qcCompetitor) trust(t time.Time) int64 {
	switch {
	case c.ignoreKeeper:
		return 0
	case t.IsZero():
		return 1
	}
	return chaos.MonoOf(t)
}

func qcUnits(scopes []runlease.Scope) int {
	n := 0
	for _, sc := range scopes {
		n += sc.Units()
	}
	return n
}

func earliestTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// qcPoller scans the slot rows and the queues until stopped: the store's
// own view of the limits, and the queue order.
type qcPoller struct {
	snaps    []chaos.QueueSnap
	problems []string
	peak     map[string]int
	done     chan struct{}
}

// qcEntry is the part of a queue entry's JSON the checks read (README,
// "Queue entries").
type qcEntry struct {
	Run       string `json:"run"`
	Waiter    string `json:"waiter"`
	Principal string `json:"principal"`
	Priority  int    `json:"priority"`
	Units     int    `json:"units"`
	Tag       int64  `json:"tag"`
	UntilMS   int64  `json:"until_ms"`
}

func qcStartPoller(ctx context.Context, store *runlease.PostgresStore, stop <-chan struct{}) *qcPoller {
	p := &qcPoller{done: make(chan struct{}), peak: map[string]int{}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(qcPoll)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if err := p.scan(ctx, store); err != nil {
				p.problems = append(p.problems, err.Error())
			}
		}
	}()
	return p
}

func (p *qcPoller) scan(ctx context.Context, store *runlease.PostgresStore) error {
	live, err := runlease.Occupancy(ctx, store)
	if err != nil {
		return err
	}
	// One scan is one statement: a consistent snapshot of the slot rows.
	units := map[string]int{}
	for _, s := range live {
		units[s.Scope]++
	}
	for scope, n := range units {
		p.peak[scope] = max(p.peak[scope], n)
		if n > qcLimits[scope] {
			p.problems = append(p.problems, fmt.Sprintf("%d live slots of scope %q (limit %d): %+v", n, scope, qcLimits[scope], live))
		}
	}
	start := history.Mono()
	rows, err := store.MetaScan(ctx, runlease.QueuePrefix)
	if err != nil {
		return err
	}
	at := history.Mono()
	now, _ := store.ClockNow() // after the scan: an entry live now was live when read
	snap := chaos.QueueSnap{Start: start, At: at}
	for _, r := range rows {
		var e qcEntry
		scope, ok := qcQueueScope(r.Key)
		if err := json.Unmarshal([]byte(r.Value), &e); err != nil || !ok {
			return fmt.Errorf("queue row %q = %q does not parse: %v", r.Key, r.Value, err)
		}
		if e.UntilMS > now.UnixMilli() {
			snap.Entries = append(snap.Entries, chaos.QueueEntry{Scope: scope, Run: e.Run, Waiter: e.Waiter,
				Principal: e.Principal, Priority: e.Priority, Units: e.Units, Tag: e.Tag})
		}
	}
	p.snaps = append(p.snaps, snap)
	return nil
}

// qcQueueScope returns the scope of a line key,
// runline:<n>:<scope>:<rank>:<run>.
func qcQueueScope(key string) (string, bool) {
	var n int
	var rest string
	if _, err := fmt.Sscanf(key, runlease.QueuePrefix+"%d:%s", &n, &rest); err != nil || n <= 0 || n >= len(rest) {
		return "", false
	}
	return rest[:n], true
}

func TestChaosQueueUnderPausesAndKills(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	mode := chaos.BreakMode()
	if mode != "" && mode != chaos.BreakQueueIgnoreKeeper {
		t.Skipf("%s=%s breaks another test's holders", chaos.EnvBreak, mode)
	}
	window := chaosWindow(t)
	_, store := chaosStore(t)
	stop := make(chan struct{})
	poller := qcStartPoller(t.Context(), store, stop)
	stopPolling := sync.OnceFunc(func() { close(stop); <-poller.done })
	t.Cleanup(stopPolling)

	// The children go on a little after the last fault; every wait begun
	// before they stop ends 5 s later at the latest, and a hold and its
	// release follow.
	drive := window + 3*time.Second
	tail := 5*time.Second + qcMaxHold + time.Second
	var stopAt time.Time
	env := chaos.Env{Table: store.Table(), StopIn: drive}
	plan := chaos.Plan{For: window, MaxDown: 2, KillOdds: 0.3,
		Pause: [2]time.Duration{qcTTL / 5, 2 * qcTTL}, Gap: [2]time.Duration{500 * time.Millisecond, 2 * time.Second}}
	in := chaos.NewInjector(t, plan, qcProcs, chaos.Spawner(t, roleChaosQueue, env, &stopAt))
	stopAt = time.Now().Add(drive)
	in.Run(t)
	events := in.Collect(t, time.Until(stopAt)+tail+90*time.Second)
	stopPolling()

	killed := chaos.KillTimes(in.Faults)
	beliefs, problems := chaos.QueueBeliefs(events, killed)
	peaks, violations := chaos.CheckQueueCap(beliefs, qcLimits)
	checked, order := chaos.CheckQueueOrder(poller.snaps, events)
	stats := chaos.QueueMeasure(poller.snaps, events, qcPrincipals, in.Faults, qcTTL)
	qcReport(t, in, events, peaks, poller, checked, stats)
	for _, v := range violations[:min(len(violations), 10)] {
		t.Logf("violation: %s", v)
	}
	if mode != "" {
		assert.NotEmpty(t, violations, "the broken holder %q went unnoticed", mode)
		return
	}
	assert.Empty(t, problems, "histories that do not add up")
	assert.Empty(t, csErrors(events), "errors no fault explains")
	assert.Empty(t, violations, "slot cap violations")
	assert.Empty(t, poller.problems, "the store's own view broke a limit")
	assert.Empty(t, order, "waiters out of queue order within a principal")
	assert.Empty(t, chaos.UnexplainedRequeues(events, in.Faults, qcTTL), "places lost with no stall")
	assert.Positive(t, in.Count(chaos.FaultPause), "no pause was injected")
	assert.Positive(t, checked, "no pair of waiters could be checked for order")
	require.NotEmpty(t, beliefs, "nobody was admitted")

	// Nothing is left behind: once every entry and slot had a TTL to
	// expire, none is live, and Prune removes the queue's rows.
	time.Sleep(qcTTL + time.Second)
	require.NoError(t, poller.scan(t.Context(), store))
	last := poller.snaps[len(poller.snaps)-1]
	assert.Empty(t, last.Entries, "live queue entries after every waiter ended")
	live, err := runlease.Occupancy(t.Context(), store)
	require.NoError(t, err)
	assert.Empty(t, live, "live slots after every holder ended")
	_, err = runlease.Prune(t.Context(), store, 0)
	require.NoError(t, err)
	for _, prefix := range []string{runlease.QueuePrefix, runlease.PlacePrefix, runlease.FairPrefix, runlease.ClockPrefix} {
		rows, err := store.MetaScan(t.Context(), prefix)
		require.NoError(t, err)
		assert.Empty(t, rows, "rows under %s after Prune", prefix)
	}
}

func qcReport(t *testing.T, in *chaos.Injector, events []chaos.Event, peaks map[string]int, p *qcPoller, checked int, st chaos.QueueStats) {
	t.Helper()
	waits, gaveUp, requeued := 0, 0, 0
	why := map[string]int{}
	for _, ev := range events {
		switch ev.Kind {
		case chaos.KindWait:
			waits++
		case chaos.KindGiveUp:
			gaveUp++
		case chaos.KindRequeue:
			requeued++
		case chaos.KindEnd:
			why[ev.Res]++
		}
	}
	t.Logf("queue chaos: %d processes x %d competitors, 3 principals (weights 1, 1, 2), limits %v; %d pauses, %d kills",
		qcProcs, qcCompetitors, qcLimits, in.Count(chaos.FaultPause), in.Count(chaos.FaultKill))
	t.Logf("%d waits: %d admitted, %d gave up after %v, %d places lost and re-queued; ends %v",
		waits, st.Admissions, gaveUp, qcWaitFor, requeued, why)
	t.Logf("peak units believed %v, seen in the store %v; %d pairs checked for order; %d admissions overtook a waiter of their principal (backfill)",
		peaks, p.peak, checked, st.Inversions)
	// The documented bound for unit claims of one scope: k waiters ahead,
	// limit L, holders that release within T are admitted within
	// ceil((k+1)/L)*T. Here T is the longest hold plus a TTL for a holder
	// paused or killed, and every competitor may be ahead.
	k := qcProcs*qcCompetitors - 1
	bound := time.Duration(math.Ceil(float64(k+1)/float64(qcLimits["db"]))) * (qcMaxHold + qcTTL)
	t.Logf("wait for admission (calls never re-queued): %s; bound with all %d others ahead in db: %v",
		chaos.Summary(st.Waits), k, bound)
	t.Logf("release to the next admission in its scope: %s", chaos.Summary(st.Released))
	for _, scope := range []string{"gpu", "db"} {
		var shares []string
		for _, pr := range qcPrincipals {
			n := st.Units[scope][pr]
			shares = append(shares, fmt.Sprintf("%s %d (%.1f per weight)", pr, n, float64(n)/float64(qcWeights[pr])))
		}
		t.Logf("%s units admitted while every principal had a waiter not paused within a TTL: %s", scope, strings.Join(shares, ", "))
	}
}
