package scalekit

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/areev/runlease"
)

// Main is a scale command's main: it defines the flags of a Config on
// flag.CommandLine, beside those the command defined before calling it,
// parses the command line and calls run with the Config. An error from run
// is printed and ends the process with status 1.
func Main(run func(Config) error) {
	var c Config
	flag.IntVar(&c.Leases, "leases", 100_000, "leases to keep alive")
	flag.DurationVar(&c.TTL, "ttl", 30*time.Second, "lease TTL")
	flag.DurationVar(&c.Duration, "duration", 2*time.Minute, "how long to keep them after all are acquired")
	flag.IntVar(&c.Acquirers, "acquirers", 16, "goroutines acquiring the leases")
	flag.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the run (acquiring and keeping) to this file")
	flag.StringVar(&c.HeapProfile, "heapprofile", "", "write a heap profile, taken once every lease is kept, to this file")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// Measure runs cfg on store (see Run) and prints the report to w.
func Measure(ctx context.Context, store runlease.Store, cfg Config, w io.Writer) error {
	rep, err := Run(ctx, store, cfg)
	if err != nil {
		return err
	}
	rep.Print(w)
	return nil
}
