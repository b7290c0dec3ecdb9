//go:build linux

package runlease_test

// The fair-share bound of the admission queue (README "Waiting for
// slots"), checked on real admissions: while two principals both have runs
// waiting, their admissions divided by their weights never differ by more
// than 1/w_A + 1/w_B over any stretch of admissions, with any overlap of
// their enqueues. Many goroutines per principal wait for one scope, hold a
// unit a few milliseconds, release and queue again at once, so each
// principal's enqueues overlap all the time: on Postgres from two processes
// (the test binary re-executed in a role, as in multiproc_test.go), on
// SQLite from the goroutines of one process through two Store values (a
// second opener of the file is refused).
//
// The order of the admissions is taken from the store itself, not from
// clocks: a trigger on the store's table appends every write of a slot row
// or a line entry to a log table, in the writing transaction, so the log
// orders the writes as the database applied them. Two grants of one slot
// are logged in the order they were made, whichever process made them: a
// grant is a write of the row under its row lock (Postgres) or under the
// one writer's lock (SQLite), and the next grant of the row waits for the
// release. The same log says, at every grant, which principals had an
// entry in the line, and which entries ranked ahead of the admitted one.
//
// Two grants of different slots can race: units free at once go to the
// first waiters of the line together (README: one ranked behind may be
// admitted first into units nobody ahead of it needs), and which of their
// batches commits first is the database's choice, not the queue's. In the
// order of the grants the bound is then exceeded by a run's share (1/3
// here) now and then; the bound is checked on the admissions in the order
// of their ranks where their grants raced (fairByRank), and the difference
// in the order of the grants is logged.
//
// Stretches are judged where the principals' waiters are all in the loop
// (fairSteady): from the first admission after which every goroutine has
// been admitted once, to the first that is a goroutine's last. Within that,
// a stretch ends where a principal had no entry in the line (its credit
// is lost, by design), which the log shows exactly.

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
)

var roleFairWaiter = proctest.Register("mp-fair-share-waiter", fairWaiterChild)

const (
	fairProcs     = 2 // Postgres: processes
	fairPerProc   = 6 // Postgres: goroutines per principal and process
	fairLimit     = 2
	fairScopeName = "fair"
)

// fairRaceFor is how long the waiters loop: long enough, under the race
// detector too, for every goroutine to be admitted several times.
var fairRaceFor = func() time.Duration {
	if raceEnabled {
		return 12 * time.Second
	}
	return 4 * time.Second
}()

// fairWeights are the principals' weights.
var fairWeights = map[string]int{"A": 1, "B": 3}

// fairRunPrincipal is the principal of a run the waiters name
// "<principal>-<process>-<goroutine>".
func fairRunPrincipal(run string) string {
	p, _, _ := strings.Cut(run, "-")
	return p
}

// fairWait is one goroutine's loop: wait for a unit of the scope as
// principal p, hold it a few milliseconds, release it and queue again at
// once, until the time is up. It returns the admissions and the first
// error.
func fairWait(ctx context.Context, s runlease.Store, run, p string, until time.Time) (int, error) {
	scopes := []runlease.Scope{runlease.NamedScope(fairScopeName, fairLimit)}
	n := 0
	for time.Now().Before(until) {
		slots, err := runlease.ClaimSlotsWait(ctx, s, run, scopes, runlease.WithFairShare(p, fairWeights[p]))
		if err != nil {
			return n, fmt.Errorf("wait of %s: %w", run, err)
		}
		n++
		time.Sleep(time.Duration(2000+rand.IntN(3000)) * time.Microsecond)
		if err := slots.Release(ctx); err != nil {
			return n, fmt.Errorf("release of %s: %w", run, err)
		}
	}
	return n, nil
}

// fairWaitAll runs perPrincipal goroutines of fairWait for each principal,
// all starting at once, the g-th of each through stores[g%len(stores)],
// and returns the admissions and the errors.
func fairWaitAll(ctx context.Context, stores []runlease.Store, proc, perPrincipal int) (int, []error) {
	until := time.Now().Add(fairRaceFor)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		n    int
		errs []error
	)
	for p := range fairWeights {
		for g := range perPrincipal {
			wg.Go(func() {
				k, err := fairWait(ctx, stores[g%len(stores)], fmt.Sprintf("%s-%d-%d", p, proc, g), p, until)
				mu.Lock()
				defer mu.Unlock()
				n += k
				if err != nil {
					errs = append(errs, err)
				}
			})
		}
	}
	wg.Wait()
	return n, errs
}

// fairWaiterChild is the role of each Postgres process: open the table
// the parent made, print "ready", wait for the parent's start, run the
// waiters, and print "admitted <n>" and one "error <text>" line per error.
func fairWaiterChild() int {
	proc, err := strconv.Atoi(os.Getenv(envMPProc))
	if err != nil {
		fmt.Fprintln(os.Stderr, envMPProc, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), fairRaceFor+mpTimeout)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(os.Getenv(pgtest.EnvDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.MaxConns = int32(len(fairWeights)*fairPerProc + 2) // every waiter at the server at once
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	s, err := runlease.NewPostgres(ctx, pool, runlease.WithTable(os.Getenv(envMPTable)), runlease.WithCreateTable(false))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	fmt.Println("ready")
	proctest.WaitRelease()
	n, errs := fairWaitAll(ctx, []runlease.Store{s}, proc, fairPerProc)
	fmt.Println("admitted", n)
	for _, err := range errs {
		fmt.Println("error", strings.ReplaceAll(err.Error(), "\n", " "))
	}
	return 0
}

// fairLogEvent is one write the trigger logged: a row of the line or a
// slot row inserted, updated or deleted, with the row before (old) and
// after (new).
type fairLogEvent struct {
	op, key  string
	old, new sql.NullString
}

// fairAdmission is one grant of a unit, in the order of the log.
type fairAdmission struct {
	run, principal string
	// key is the line entry the run was admitted from: its rank, as the
	// line orders entries by key. It is "" for a run admitted without
	// waiting.
	key string
	// grant is the index in the log of the grant, and queued the index
	// of the write of the entry it was admitted from (-1: none).
	grant, queued int
	// backlog tells, per principal, whether it had a run waiting when the
	// unit was granted: an entry in the line, or the run admitted.
	backlog map[string]bool
	// epoch counts, per principal, the times its entries in the line had
	// all gone before the grant: a stretch is backlogged for a principal
	// only while its epoch stays the same (a principal left without a
	// waiter loses its credit, by design).
	epoch map[string]int
	// steady is set on the admissions judged: from the first after which
	// every goroutine has been admitted once (each has queued, been
	// admitted and queued again, so each principal continues from its
	// mark) to the first that is a goroutine's last (from there the
	// principals' waiters stop queueing again, one by one).
	steady bool
}

// fairSteady sets steady on the admissions judged (see fairAdmission).
func fairSteady(adms []fairAdmission) {
	first, last := map[string]int{}, map[string]int{}
	for i, a := range adms {
		if _, ok := first[a.run]; !ok {
			first[a.run] = i
		}
		last[a.run] = i
	}
	from, to := 0, len(adms)
	for run := range first {
		from, to = max(from, first[run]+1), min(to, last[run])
	}
	for i := from; i <= to && i < len(adms); i++ {
		adms[i].steady = true
	}
}

// fairKeyTag is the tag in a line entry's key.
func fairKeyTag(key string) int64 {
	_, rank, _ := strings.Cut(key, ".")
	tag, _, _ := strings.Cut(rank, ".")
	n, err := strconv.ParseInt(tag, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("line key %q: %v", key, err))
	}
	return n
}

// fairReplay turns the log into the admissions in the order of their
// grants, with who was waiting at each. A grant is a slot row written for
// a holder it did not have before (the waiters never renew, and no row
// expires in the test).
func fairReplay(t *testing.T, events []fairLogEvent) []fairAdmission {
	t.Helper()
	live := map[string]string{}    // line entry key: principal
	entryOf := map[string]string{} // run: the key of its last entry
	queuedAt := map[string]int{}   // entry key: the index of its write in the log
	count := map[string]int{}
	epoch := map[string]int{}
	var adms []fairAdmission
	holder := func(v sql.NullString) string {
		if !fairRow(v) {
			return ""
		}
		var r struct {
			Holder string `json:"holder"`
		}
		require.NoError(t, json.Unmarshal([]byte(v.String), &r), "slot row %q", v.String)
		return r.Holder
	}
	for i, ev := range events {
		switch {
		case strings.HasPrefix(ev.key, runlease.QueuePrefix):
			p, ok := live[ev.key]
			switch {
			case !fairRow(ev.new) && ok:
				delete(live, ev.key)
				if count[p]--; count[p] == 0 {
					epoch[p]++
				}
			case fairRow(ev.new) && !ok:
				var e struct {
					Run       string `json:"run"`
					Principal string `json:"principal"`
				}
				require.NoError(t, json.Unmarshal([]byte(ev.new.String), &e), "line entry %q", ev.new.String)
				live[ev.key] = e.Principal
				entryOf[e.Run] = ev.key
				queuedAt[ev.key] = i
				count[e.Principal]++
			}
		case strings.HasPrefix(ev.key, runlease.SlotPrefix):
			run := holder(ev.new)
			if run == "" || run == holder(ev.old) {
				continue
			}
			p := fairRunPrincipal(run)
			a := fairAdmission{run: run, principal: p, key: entryOf[run], grant: i, queued: -1,
				backlog: map[string]bool{}, epoch: map[string]int{}}
			delete(entryOf, run)
			if a.key != "" {
				a.queued = queuedAt[a.key]
			}
			for q := range fairWeights {
				a.backlog[q] = q == p || count[q] > 0
				a.epoch[q] = epoch[q]
			}
			adms = append(adms, a)
		}
	}
	fairSteady(adms)
	return adms
}

// fairRow reports whether v is a row: present, and not the placeholder a
// Postgres batch writes for a key it takes while absent.
func fairRow(v sql.NullString) bool {
	return v.Valid && !strings.HasPrefix(v.String, "\x01runlease placeholder")
}

// fairByRank returns adms in the order of their ranks where their grants
// raced: an admission that overtook waiters ranked ahead of it (admitted
// later from entries written before its grant) moves to just after the
// last of their admissions. Units free at once go to the first waiters of
// the line together, and which of their batches commits first is the
// database's choice, not the queue's; the fair-share bound is about the
// queue's order. It also returns how many admissions moved.
func fairByRank(adms []fairAdmission) ([]fairAdmission, int) {
	type placed struct {
		after, i int
	}
	order := make([]placed, len(adms))
	moved := 0
	for i, a := range adms {
		order[i] = placed{i, i}
		for j := i + 1; j < len(adms) && a.key != ""; j++ {
			if b := adms[j]; b.key != "" && b.key < a.key && b.queued < a.grant {
				order[i].after = j
			}
		}
		if order[i].after != i {
			moved++
		}
	}
	// After the admission it waits for (whose own place is its index),
	// then in the order of the grants.
	isMoved := func(p placed) bool { return p.after != p.i }
	slices.SortFunc(order, func(x, y placed) int {
		return cmp.Or(cmp.Compare(x.after, y.after), cmpBool(isMoved(x), isMoved(y)), cmp.Compare(x.i, y.i))
	})
	out := make([]fairAdmission, len(adms))
	for i, o := range order {
		out[i] = adms[o.i]
	}
	return out, moved
}

func cmpBool(x, y bool) int {
	switch {
	case x == y:
		return 0
	case x:
		return 1
	default:
		return -1
	}
}

// fairWorst returns the largest |n_A/w_A − n_B/w_B| over the stretches of
// adms at each admission of which both principals had runs waiting (in
// one epoch each), the first few stretches over the bound, and how many
// admissions lie in such stretches.
func fairWorst(adms []fairAdmission) (worst float64, over []string, backlogged int) {
	wa, wb := float64(fairWeights["A"]), float64(fairWeights["B"])
	bound := 1/wa + 1/wb
	both := func(a, a0 fairAdmission) bool {
		return a.backlog["A"] && a.backlog["B"] && a.epoch["A"] == a0.epoch["A"] && a.epoch["B"] == a0.epoch["B"] && a.steady
	}
	for from := range adms {
		if !both(adms[from], adms[from]) {
			continue
		}
		backlogged++
		na, nb := 0.0, 0.0
		for to := from; to < len(adms) && both(adms[to], adms[from]); to++ {
			switch adms[to].principal {
			case "A":
				na++
			case "B":
				nb++
			}
			d := math.Abs(na/wa - nb/wb)
			worst = max(worst, d)
			if d > bound+1e-9 {
				if len(over) < 5 {
					over = append(over, fmt.Sprintf("admissions %d..%d: A %v, B %v: %s", from, to, na, nb, fairRunsOf(adms[from:to+1])))
				}
				break // the shortest stretch from here over the bound
			}
		}
	}
	return worst, over, backlogged
}

// fairRunsOf names the runs of adms with the tags of their entries (in
// shares of weight 1), the first and last dozen of them.
func fairRunsOf(adms []fairAdmission) string {
	runs := make([]string, len(adms))
	for i, a := range adms {
		runs[i] = a.run
		if a.key != "" {
			runs[i] += fmt.Sprintf("@%.3f", float64(fairKeyTag(a.key))/1e6)
		}
	}
	if len(runs) > 24 {
		runs = append(append(runs[:12:12], "…"), runs[len(runs)-12:]...)
	}
	return strings.Join(runs, " ")
}

// fairCheck checks the bound on the admissions in the order of their ranks
// where their grants raced, and that the run saw something: both
// principals admitted, and most admissions in stretches with both waiting.
// It logs the largest difference in that order and in the order of the
// grants, and how often grants raced.
func fairCheck(t *testing.T, adms []fairAdmission) {
	t.Helper()
	per := map[string]int{}
	unqueued, steady := 0, 0
	for _, a := range adms {
		if a.steady {
			steady++
		}
		per[a.principal]++
		if a.key == "" {
			unqueued++
		}
	}
	wa, wb := float64(fairWeights["A"]), float64(fairWeights["B"])
	byRank, overtakes := fairByRank(adms)
	worst, over, backlogged := fairWorst(byRank)
	assert.Empty(t, over, "over a stretch in which both had runs waiting, A (weight %v) and B (weight %v) "+
		"got admissions whose difference divided by the weights is over %v", wa, wb, 1/wa+1/wb)
	byGrant, _, _ := fairWorst(adms)
	t.Logf("%d admissions (A %d, B %d, %d without waiting), %d judged, %d of them in stretches with both waiting; "+
		"largest |A/%v − B/%v| over such a stretch %.3f (bound %.3f), %.3f in the order of the grants, "+
		"where %d admissions overtook a waiter ranked ahead of them",
		len(adms), per["A"], per["B"], unqueued, steady, backlogged, wa, wb, worst, 1/wa+1/wb, byGrant, overtakes)
	require.Positive(t, per["A"])
	require.Positive(t, per["B"])
	assert.Greater(t, backlogged, len(adms)/2, "most admissions should be made while both principals wait")
}

// TestFairShareHoldsAcrossProcesses: two processes on one Postgres table,
// each with 6 goroutines of principal A (weight 1) and 6 of B (weight 3)
// that wait for one scope of limit 2, hold a few milliseconds, release and
// queue again, for 4 seconds (12 under the race detector). Over every
// stretch of admissions during which both had runs waiting, in the order
// of their ranks where their grants raced, |admissions_A/1 −
// admissions_B/3| ≤ 1 + 1/3. (A place that moved its principal's mark
// without checking the mark it read gave runs of A in the two processes
// one tag, and A two runs for one share.)
func TestFairShareHoldsAcrossProcesses(t *testing.T) {
	systest.Mark(t) // several processes
	t.Parallel()
	pgtest.DSN(t) // skips without RUNLEASE_TEST_POSTGRES
	pool := pgtest.Pool(t)
	_, table := mpStore(t)
	logTable := fairLogPostgres(t, pool, table)

	children := make([]*proctest.Child, fairProcs)
	for i := range children {
		children[i] = proctest.Start(t, roleFairWaiter, envMPTable+"="+table, envMPProc+"="+strconv.Itoa(i))
	}
	for _, c := range children {
		require.NoError(t, c.WaitLine("ready", mpTimeout))
	}
	for _, c := range children {
		c.Release()
	}
	admitted := 0
	for i, c := range children {
		code, err := c.Wait(fairRaceFor + mpTimeout)
		require.NoError(t, err)
		require.Zero(t, code, "child %d exited with %d; stderr:\n%s", i, code, c.Stderr())
		for _, l := range c.Lines()[1:] { // after "ready"
			if n, ok := strings.CutPrefix(l, "admitted "); ok {
				k, err := strconv.Atoi(n)
				require.NoError(t, err)
				admitted += k
				continue
			}
			t.Errorf("child %d: %s", i, l)
		}
	}

	rows, err := pool.Query(t.Context(), "SELECT op, key, old, new FROM "+pgtest.Ident(logTable)+" ORDER BY seq")
	require.NoError(t, err)
	var events []fairLogEvent
	for rows.Next() {
		var ev fairLogEvent
		var old, nw *string
		require.NoError(t, rows.Scan(&ev.op, &ev.key, &old, &nw))
		ev.old, ev.new = fairNull(old), fairNull(nw)
		events = append(events, ev)
	}
	require.NoError(t, rows.Err())
	adms := fairReplay(t, events)
	require.Len(t, adms, admitted, "every admission the waiters saw is a grant in the log, and no other")
	fairCheck(t, adms)
}

func fairNull(s *string) sql.NullString {
	if s == nil {
		return sql.NullString{}
	}
	return sql.NullString{String: *s, Valid: true}
}

// fairLogPostgres adds to table a trigger that logs every write of a slot
// row or a line entry, in the writing transaction, to a log table of its
// own, and returns the log table's name. Both are dropped when t ends.
func fairLogPostgres(t *testing.T, pool *pgxpool.Pool, table string) string {
	t.Helper()
	logTable := pgtest.NewTable(t, pool)
	fn := pgtest.UniqueName("runlease_test_fairlog_")
	exec := func(q string) {
		_, err := pool.Exec(t.Context(), q)
		require.NoError(t, err, q)
	}
	exec("CREATE TABLE " + pgtest.Ident(logTable) + " (seq bigserial PRIMARY KEY, op text NOT NULL, key text NOT NULL, old text, new text)")
	exec(`CREATE FUNCTION ` + pgtest.Ident(fn) + `() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE k text := CASE WHEN TG_OP = 'DELETE' THEN OLD.key ELSE NEW.key END;
BEGIN
	IF k LIKE '` + runlease.SlotPrefix + `%' OR k LIKE '` + runlease.QueuePrefix + `%' THEN
		INSERT INTO ` + pgtest.Ident(logTable) + ` (op, key, old, new) VALUES (TG_OP, k,
			CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.value END,
			CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE NEW.value END);
	END IF;
	RETURN NULL;
END $$`)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP FUNCTION IF EXISTS "+pgtest.Ident(fn)+" CASCADE"); err != nil {
			t.Errorf("drop %s: %v", fn, err)
		}
	})
	exec("CREATE TRIGGER fair_log AFTER INSERT OR UPDATE OR DELETE ON " + pgtest.Ident(table) +
		" FOR EACH ROW EXECUTE FUNCTION " + pgtest.Ident(fn) + "()")
	return logTable
}

// TestFairShareHoldsWithOverlappingEnqueuesOnSQLite: as
// TestFairShareHoldsAcrossProcesses, on SQLite, whose file one process
// opens: 12 goroutines per principal, half of them through each of two
// Store values of the one store.
func TestFairShareHoldsWithOverlappingEnqueuesOnSQLite(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	path := filepath.Join(t.TempDir(), "runs.db")
	// The log's table and triggers go in before the store opens the file
	// (it locks the file against other openers), with the store's own
	// schema, which it then finds in place.
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	for _, q := range []string{
		`CREATE TABLE runlease_meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) WITHOUT ROWID`,
		`CREATE TABLE fair_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL, key TEXT NOT NULL, old TEXT, new TEXT)`,
		`CREATE TRIGGER fair_log_insert AFTER INSERT ON runlease_meta
		WHEN NEW.key GLOB '` + runlease.SlotPrefix + `*' OR NEW.key GLOB '` + runlease.QueuePrefix + `*'
		BEGIN INSERT INTO fair_log (op, key, old, new) VALUES ('INSERT', NEW.key, NULL, NEW.value); END`,
		`CREATE TRIGGER fair_log_update AFTER UPDATE ON runlease_meta
		WHEN NEW.key GLOB '` + runlease.SlotPrefix + `*' OR NEW.key GLOB '` + runlease.QueuePrefix + `*'
		BEGIN INSERT INTO fair_log (op, key, old, new) VALUES ('UPDATE', NEW.key, OLD.value, NEW.value); END`,
		`CREATE TRIGGER fair_log_delete AFTER DELETE ON runlease_meta
		WHEN OLD.key GLOB '` + runlease.SlotPrefix + `*' OR OLD.key GLOB '` + runlease.QueuePrefix + `*'
		BEGIN INSERT INTO fair_log (op, key, old, new) VALUES ('DELETE', OLD.key, OLD.value, NULL); END`,
	} {
		_, err := db.ExecContext(t.Context(), q)
		require.NoError(t, err, q)
	}
	require.NoError(t, db.Close())

	s, err := runlease.OpenSQLite(path)
	require.NoError(t, err)
	// Two Store values of the one store, as two processes would have
	// two stores: a process's waiters of one principal take turns per
	// Store value, and those of two values race.
	admitted, errs := fairWaitAll(t.Context(), []runlease.Store{&sqliteValue{s}, &sqliteValue{s}}, 0, fairProcs*fairPerProc)
	require.NoError(t, s.Close())
	assert.Empty(t, errs)

	db, err = sql.Open("sqlite", path)
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.QueryContext(t.Context(), `SELECT op, key, old, new FROM fair_log ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var events []fairLogEvent
	for rows.Next() {
		var ev fairLogEvent
		require.NoError(t, rows.Scan(&ev.op, &ev.key, &ev.old, &ev.new))
		events = append(events, ev)
	}
	require.NoError(t, rows.Err())
	adms := fairReplay(t, events)
	require.Len(t, adms, admitted, "every admission the waiters saw is a grant in the log, and no other")
	fairCheck(t, adms)
}
