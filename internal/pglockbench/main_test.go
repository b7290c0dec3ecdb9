package main

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMeasure runs each comparison briefly and checks that both sides ran
// and were counted: the harness must keep working, whatever the figures.
func TestMeasure(t *testing.T) {
	dsn := os.Getenv("RUNLEASE_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("set RUNLEASE_TEST_POSTGRES=postgres://root@127.0.0.1:5432/test?sslmode=disable to run the Postgres tests")
	}
	cfg := config{dsn: dsn, duration: 300 * time.Millisecond, runs: 1, goroutines: []int{1, 2}}
	rows, err := measure(t.Context(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("got %d rows, want 2 comparisons at 2 goroutine counts", len(rows))
	}
	for _, r := range rows {
		s := r.Summarize()
		if s.Rate <= 0 || s.BaseRate <= 0 {
			t.Errorf("%s g=%d: a side made no progress: %+v", r.Scenario, r.G, s)
		}
		// Each side's round trips are counted on its own sockets: at least
		// two per cycle (a write to take, a write to free) on both.
		if s.TripsPerOp < 2 || s.BaseTrips < 2 {
			t.Errorf("%s g=%d: trips per cycle %.2f (base %.2f), want at least 2 each", r.Scenario, r.G, s.TripsPerOp, s.BaseTrips)
		}
	}
	if !strings.Contains(rows[0].Scenario, "pglock") {
		t.Errorf("the first comparison is %q, want the one against pglock", rows[0].Scenario)
	}
}

func TestParseFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-dsn", "x", "-goroutines", "0"},
		{"-dsn", "x", "-goroutines", "a"},
		{"-dsn", "x", "-runs", "0"},
		{"-dsn", "", "-runs", "1"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	cfg, err := parseFlags([]string{"-dsn", "x", "-goroutines", "1, 4,16"})
	if err != nil || len(cfg.goroutines) != 3 || cfg.goroutines[2] != 16 {
		t.Errorf("got %+v, %v", cfg, err)
	}
}
