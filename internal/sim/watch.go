package sim

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// traceLines is how many trace lines a Monitor keeps.
const traceLines = 400

// Monitor carries a schedule's trace and progress out of its bubble, so
// that a watchdog outside can report a schedule that stopped moving.
type Monitor struct {
	progress atomic.Int64
	mu       sync.Mutex
	header   string
	lines    []string
	next     int
}

// NewMonitor returns a Monitor whose reports begin with header.
func NewMonitor(header string) *Monitor { return &Monitor{header: header} }

func (m *Monitor) tick() { m.progress.Add(1) }

func (m *Monitor) tracef(format string, a ...any) {
	line := fmt.Sprintf(format, a...)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.lines) < traceLines {
		m.lines = append(m.lines, line)
		return
	}
	m.lines[m.next] = line
	m.next = (m.next + 1) % traceLines
}

// Lines returns the last trace lines, oldest first.
func (m *Monitor) Lines() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append(append([]string(nil), m.lines[m.next:]...), m.lines[:m.next]...)
}

// Watch starts a watchdog, outside any bubble, that reports the schedule
// as hung when it makes no progress for stall of real time: then it writes
// the header, the trace and the stacks of the bubble's goroutines to out
// and ends the process, since nothing can wake a bubble from outside. The
// usual cause is a goroutine waiting on a sync.Mutex held across a store
// call that hangs (synctest cannot advance time past it), or a deadlock.
// The returned func stops the watchdog.
func (m *Monitor) Watch(stall time.Duration, out io.Writer) (stop func()) {
	done := make(chan struct{})
	go func() {
		last, since := m.progress.Load(), time.Now()
		t := time.NewTicker(stall / 20)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if p := m.progress.Load(); p != last {
				last, since = p, time.Now()
				continue
			}
			if time.Since(since) < stall {
				continue
			}
			var b bytes.Buffer
			fmt.Fprintf(&b, "\n=== HANG %s\n[hang] no progress for %v of real time: a goroutine of the bubble waits on a lock, "+
				"and no store call can end the wait.\n--- trace (last %d lines)\n%s\n--- goroutines of the bubble\n%s\n",
				m.header, stall, traceLines, strings.Join(m.Lines(), "\n"), bubbleStacks())
			out.Write(b.Bytes())
			os.Exit(3)
		}
	}()
	return func() { close(done) }
}

// bubbleStacks returns the stacks of goroutines in synctest bubbles.
func bubbleStacks() string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(strings.SplitN(g, "\n", 2)[0], "synctest bubble") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
