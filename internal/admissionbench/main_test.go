package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain runs the test binary as a backlog's child process when it is
// re-executed as one (-backlog-procs).
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		if err := runChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "admissionbench child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func tinyConfig(t *testing.T) config {
	t.Helper()
	dsn := os.Getenv("RUNLEASE_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("set RUNLEASE_TEST_POSTGRES=postgres://root@127.0.0.1:5432/test?sslmode=disable to run the Postgres tests")
	}
	cfg, err := parseFlags([]string{"-dsn", dsn, "-runs", "1", "-duration", "300ms", "-warmup", "100ms",
		"-backlog", "20", "-admissions", "20", "-warm-admissions", "4", "-claims", "3", "-budget", "60s",
		// DBOS's default poll admits nothing in 300 ms; the rest all run.
		"-contenders", "bare,dbos,runlease-postgres,runlease-sqlite"})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestContention runs the contention scenario briefly on every contender
// and checks that each made progress, never had more runs admitted than
// the limit, and was counted: the harness must keep working, whatever
// the figures.
func TestContention(t *testing.T) {
	cfg := tinyConfig(t)
	rows, err := measureContention(t.Context(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(cfg.contenders) {
		t.Fatalf("got %d rows, want one per contender (%d)", len(rows), len(cfg.contenders))
	}
	for _, r := range rows {
		x := r.runs[0]
		if x.rate <= 0 || x.p50 <= 0 || x.trips <= 0 {
			t.Errorf("%s: no progress, or nothing counted: %+v", r.contender, x)
		}
		if x.maxInUse < 1 || x.maxInUse > int64(cfg.limit) {
			t.Errorf("%s: %d units in use at once, limit %d", r.contender, x.maxInUse, cfg.limit)
		}
		if x.errs != 0 {
			t.Errorf("%s: %d errors, the last %s", r.contender, x.errs, x.lastErr)
		}
		if r.contender == "bare" && x.bareRatio != 1 {
			t.Errorf("bare's ratio to itself is %v", x.bareRatio)
		}
	}
	var out bytes.Buffer
	writeContention(&out, cfg, rows)
	for _, c := range cfg.contenders {
		if !strings.Contains(out.String(), "| "+c+" |") {
			t.Errorf("the table has no row for %s:\n%s", c, out.String())
		}
	}
}

// TestBacklog queues a backlog of 20 on every contender, and checks that
// all 20 queued and the probes' admissions were measured behind it.
func TestBacklog(t *testing.T) {
	checkBacklog(t, tinyConfig(t))
}

// TestBacklogQueuedByOtherProcesses has three child processes queue
// runlease-postgres's backlog: all 20 must be in the store's queue, and
// the probes measured behind them.
func TestBacklogQueuedByOtherProcesses(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.procs, cfg.contenders = 3, []string{"runlease-postgres"}
	checkBacklog(t, cfg)
}

func checkBacklog(t *testing.T, cfg config) {
	t.Helper()
	rows, err := measureBacklog(t.Context(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(cfg.contenders) {
		t.Fatalf("got %d rows, want one per contender (%d)", len(rows), len(cfg.contenders))
	}
	for _, r := range rows {
		x, b := r.runs[0], r.base[0]
		if r.n != 20 || x.queued != 20 || x.budgetHit {
			t.Errorf("%s: %d of %d queued (budget hit %v): %s", r.contender, x.queued, r.n, x.budgetHit, x.note)
		}
		if x.admitted < cfg.admissions || b.admitted < cfg.admissions || x.rate <= 0 || x.trips <= 0 {
			t.Errorf("%s: %d admissions measured behind the backlog and %d at an empty queue, want at least %d each: %+v",
				r.contender, x.admitted, b.admitted, cfg.admissions, x)
		}
		if x.maxInUse > int64(cfg.limit) || b.maxInUse > int64(cfg.limit) {
			t.Errorf("%s: %d units in use at once, limit %d", r.contender, max(x.maxInUse, b.maxInUse), cfg.limit)
		}
		if x.errs != 0 {
			t.Errorf("%s: %d errors, the last %s", r.contender, x.errs, x.lastErr)
		}
		if r.contender != "dbos" && (x.claim <= 0 || b.claim <= 0) {
			t.Errorf("%s: refused claims were not timed", r.contender)
		}
		if strings.HasPrefix(r.contender, "runlease") && (!x.hasReads || x.readsPer <= 0) {
			t.Errorf("%s: the waiters' reads were not seen", r.contender)
		}
	}
	var out bytes.Buffer
	writeBacklog(&out, cfg, rows)
	if !strings.Contains(out.String(), "| runlease-postgres | 20 | 20 |") {
		t.Errorf("the table lacks runlease-postgres's row:\n%s", out.String())
	}
}

func TestParseFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-scenario", "x"},
		{"-contenders", "bare,nope"},
		{"-backlog", "0"},
		{"-backlog", "a"},
		{"-runs", "0"},
		{"-dsn", ""},
		{"-dbos-poll", "0s"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	cfg, err := parseFlags([]string{"-dsn", "x", "-scenario", "backlog", "-backlog", "100, 10_000"})
	if err != nil || len(cfg.backlogs) != 2 || cfg.backlogs[1] != 10000 || len(cfg.scenarios) != 1 {
		t.Errorf("got %+v, %v", cfg, err)
	}
	if cfg.hold != 2*time.Millisecond || cfg.limit != 4 || cfg.waiters != 16 || cfg.runs != 3 {
		t.Errorf("defaults: %+v", cfg)
	}
}
