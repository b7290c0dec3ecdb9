// Command admissionbench measures admission through runlease's fair slot
// queue (ClaimSlotsWait and Slots.Release) against what a user would pick
// instead: the least SQL that does the job on Postgres ("bare") and DBOS
// Transact v1.9.0's queues, on the same server in the same run, through
// the library's public API only, so that it runs unchanged whatever the
// queue's implementation. README.md says what each column means.
//
//	go run . -scenario all
//
// It is a module of its own so that DBOS never reaches the library's
// go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const defaultDSN = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

var allContenders = []string{"bare", "dbos", "dbos-default-poll", "runlease-postgres", "runlease-sqlite"}

type config struct {
	dsn         string
	scenarios   []string // "contention", "backlog"
	contenders  []string
	runs        int
	limit       int
	hold        time.Duration
	duration    time.Duration
	warmup      time.Duration
	waiters     int
	principals  int
	dbosPoll    time.Duration
	backlogs    []int
	admissions  int
	warmAdmits  int
	probes      int
	inflight    int
	procs       int // processes queueing a backlog (1: the measuring one)
	budget      time.Duration
	admitBudget time.Duration
	claimTrials int
	cpuProfile  string
	admitProf   string // CPU profile of the admissions behind the last backlog measured
	waitPoll    time.Duration
}

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		if err := runChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "admissionbench child:", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "admissionbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "admissionbench:", err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "admissionbench:", err)
			os.Exit(2)
		}
	}
	err = run(ctx, cfg, os.Stdout, os.Stderr)
	if cfg.cpuProfile != "" {
		// Stopped before an exit, so that a run that failed or was
		// interrupted still leaves a profile of what it spent.
		pprof.StopCPUProfile()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "admissionbench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("admissionbench", flag.ContinueOnError)
	dsn := os.Getenv("RUNLEASE_TEST_POSTGRES")
	if dsn == "" {
		dsn = defaultDSN
	}
	fs.StringVar(&cfg.dsn, "dsn", dsn, "Postgres DSN (default $RUNLEASE_TEST_POSTGRES, else "+defaultDSN+")")
	scen := fs.String("scenario", "all", "contention, backlog or all")
	cont := fs.String("contenders", strings.Join(allContenders, ","), "contenders, comma-separated")
	fs.IntVar(&cfg.runs, "runs", 3, "measurements of each row; the tables show their medians")
	fs.IntVar(&cfg.limit, "limit", 4, "units of the scope (DBOS: worker and global concurrency)")
	fs.DurationVar(&cfg.hold, "hold", 2*time.Millisecond, "how long an admitted run holds its unit")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "contention: how long each measurement lasts, after the warm-up")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "contention: warm-up before each measurement")
	fs.IntVar(&cfg.waiters, "waiters", 16, "contention: closed-loop waiters")
	fs.IntVar(&cfg.principals, "principals", 0, "contention: runlease's waiters spread over this many fair-share principals (0: none named, all share the principal \"\")")
	fs.DurationVar(&cfg.dbosPoll, "dbos-poll", time.Millisecond, "the polling interval of the \"dbos\" contender's queue (\"dbos-default-poll\" keeps DBOS's default)")
	bl := fs.String("backlog", "100,10000,100000", "backlog: queue lengths, comma-separated (a row at 0, the empty queue, is always measured too)")
	fs.IntVar(&cfg.admissions, "admissions", 200, "backlog: admissions measured behind the backlog")
	fs.IntVar(&cfg.warmAdmits, "warm-admissions", 20, "backlog: admissions let through before the measured ones")
	fs.IntVar(&cfg.probes, "probes", 8, "backlog: closed-loop waiters ranked ahead of the backlog, whose admissions are measured")
	fs.IntVar(&cfg.inflight, "inflight", 8, "backlog: waiters queueing at once while the backlog is built")
	fs.IntVar(&cfg.procs, "backlog-procs", 1, "backlog: processes queueing the backlog; above 1, child processes queue it (runlease-postgres only; the others queue in the measuring process) and only the probes run in the measuring one")
	fs.DurationVar(&cfg.budget, "budget", 3*time.Minute, "backlog: time allowed to build one backlog; past it the harness stops queueing, says how far it got, and measures behind what queued")
	fs.DurationVar(&cfg.admitBudget, "admit-budget", time.Minute, "backlog: time allowed to measure the admissions behind one backlog; past it the harness reports the admissions it saw")
	fs.IntVar(&cfg.claimTrials, "claims", 15, "backlog: refused claims timed per measurement")
	fs.DurationVar(&cfg.waitPoll, "runlease-poll", 0, "runlease's waiters' poll (WithWaitPoll); 0 keeps the library's default")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the harness process (its contenders' client side included) to this file")
	fs.StringVar(&cfg.admitProf, "admit-cpuprofile", "", "backlog: write a CPU profile of the measuring process while it measures the admissions behind a backlog (the last one measured wins) to this file")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch *scen {
	case "all":
		cfg.scenarios = []string{"contention", "backlog"}
	case "contention", "backlog":
		cfg.scenarios = []string{*scen}
	default:
		return cfg, fmt.Errorf("-scenario: %q is not contention, backlog or all", *scen)
	}
	for _, c := range strings.Split(*cont, ",") {
		c = strings.TrimSpace(c)
		ok := false
		for _, a := range allContenders {
			ok = ok || a == c
		}
		if !ok {
			return cfg, fmt.Errorf("-contenders: %q is not one of %s", c, strings.Join(allContenders, ", "))
		}
		cfg.contenders = append(cfg.contenders, c)
	}
	for _, b := range strings.Split(*bl, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(b, "_", "")))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-backlog: %q is not a positive number", b)
		}
		cfg.backlogs = append(cfg.backlogs, n)
	}
	if cfg.cpuProfile != "" && cfg.admitProf != "" {
		return cfg, errors.New("-cpuprofile and -admit-cpuprofile: one CPU profile at a time")
	}
	if cfg.dsn == "" {
		return cfg, errors.New("no Postgres DSN: give -dsn or set RUNLEASE_TEST_POSTGRES")
	}
	if cfg.runs < 1 || cfg.limit < 1 || cfg.hold < 0 || cfg.duration <= 0 || cfg.warmup < 0 || cfg.waiters < 1 || cfg.principals < 0 ||
		cfg.admissions < 1 || cfg.warmAdmits < 0 || cfg.probes < 1 || cfg.inflight < 1 || cfg.procs < 1 || cfg.budget <= 0 || cfg.admitBudget <= 0 || cfg.claimTrials < 1 || cfg.dbosPoll <= 0 || cfg.waitPoll < 0 {
		return cfg, errors.New("-runs, -limit, -duration, -waiters, -admissions, -probes, -inflight, -backlog-procs, -budget, -admit-budget, -claims and -dbos-poll must be positive, -hold, -warmup and -warm-admissions not negative")
	}
	return cfg, nil
}

// open makes a fresh contender: new tables, schema or file.
func open(ctx context.Context, cfg config, name string) (contender, error) {
	switch name {
	case "bare":
		return newBare(ctx, cfg.dsn, cfg.limit)
	case "dbos":
		return newDBOS(ctx, cfg.dsn, cfg.limit, cfg.dbosPoll, name)
	case "dbos-default-poll":
		return newDBOS(ctx, cfg.dsn, cfg.limit, 0, name)
	case "runlease-postgres":
		c, err := newRunleasePostgres(ctx, cfg.dsn, cfg.limit)
		if err == nil {
			c.workerPrincipals, c.poll = cfg.principals, cfg.waitPoll
		}
		return c, err
	case "runlease-sqlite":
		c, err := newRunleaseSQLite(cfg.limit)
		if err == nil {
			c.workerPrincipals, c.poll = cfg.principals, cfg.waitPoll
		}
		return c, err
	}
	return nil, fmt.Errorf("no contender %q", name)
}

func run(ctx context.Context, cfg config, out, progress io.Writer) error {
	for _, s := range cfg.scenarios {
		var err error
		switch s {
		case "contention":
			var rows []contentionRow
			rows, err = measureContention(ctx, cfg, progress)
			if err == nil {
				writeContention(out, cfg, rows)
			}
		case "backlog":
			var rows []backlogRow
			rows, err = measureBacklog(ctx, cfg, progress)
			if err == nil {
				writeBacklog(out, cfg, rows)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}
