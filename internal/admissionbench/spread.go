package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A backlog can be queued by other processes (-backlog-procs): a platform
// with 100,000 queued runs has them waiting on many machines, not as
// goroutines of the process whose admissions are measured. Each child is
// this program run again with childEnv set to a childSpec; it opens the
// same store, queues its share of the backlog the way the in-process
// build does (inflight waiters queueing at once, several principals), and
// reports on stdout until its stdin closes, when it exits. Only stores
// that several processes may open at once can do this: Postgres, not an
// embedded SQLite file (which one process owns).

const childEnv = "ADMISSIONBENCH_CHILD"

// childSpec is what a child needs to queue its share.
type childSpec struct {
	DSN        string        `json:"dsn"`
	Table      string        `json:"table"`
	Limit      int           `json:"limit"`
	Principals int           `json:"principals"`
	Poll       time.Duration `json:"poll"`
	From       int           `json:"from"`  // its first waiter's number
	Count      int           `json:"count"` // how many it queues
	Inflight   int           `json:"inflight"`
	Budget     time.Duration `json:"budget"`
}

// A spreader is a contender whose backlog other processes can queue.
type spreader interface {
	spec() childSpec
}

func (c *runleaseContender) spec() childSpec {
	return childSpec{Table: c.table, Limit: c.scope.Limit(), Principals: c.principals, Poll: c.poll}
}

// The child's report lines: "queued N" (its waiters in the queue so far),
// "stray" (a waiter admitted while the units were meant to be held) and
// "built N" (it stopped queueing, N queued).

// runChild is the child's main: it returns when its stdin closes.
func runChild(raw string) error {
	var sp childSpec
	if err := json.Unmarshal([]byte(raw), &sp); err != nil {
		return fmt.Errorf("child spec: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// The parent closes stdin (or dies): time to go. The waiters'
		// entries stay until the parent drops the table.
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	c, err := openRunleasePostgresTable(ctx, sp.DSN, sp.Limit, sp.Table)
	if err != nil {
		return err
	}
	c.principals, c.poll = sp.Principals, sp.Poll
	var (
		mu     sync.Mutex
		out    = bufio.NewWriter(os.Stdout)
		queued atomic.Int64
		sem    = make(chan struct{}, sp.Inflight)
	)
	say := func(format string, args ...any) {
		mu.Lock()
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
		mu.Unlock()
	}
	stopTicks := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		last := int64(-1)
		for {
			select {
			case <-t.C:
				if n := queued.Load(); n != last {
					last = n
					say("queued %d", n)
				}
			case <-stopTicks:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	start := time.Now()
	for i := sp.From; i < sp.From+sp.Count; i++ {
		if time.Since(start) > sp.Budget {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		q := make(chan struct{})
		var once sync.Once
		mark := func() { once.Do(func() { queued.Add(1); close(q) }) }
		go func() {
			select {
			case <-q:
			case <-time.After(10 * time.Second):
			case <-ctx.Done():
			}
			<-sem
		}()
		go func() {
			rel, err := c.admit(ctx, i, false, mark)
			if err != nil {
				return
			}
			say("stray")
			_ = rel(context.WithoutCancel(ctx))
		}()
	}
	// Let the waiters in flight settle, then say how many queued.
	settle := time.Now()
	for len(sem) > 0 && time.Since(settle) < 30*time.Second && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	close(stopTicks)
	say("built %d", queued.Load())
	<-ctx.Done()
	// Exit without taking the entries out: a hundred thousand leaves
	// would take minutes, and the table goes anyway.
	return nil
}

// children are the processes queueing one backlog.
type children struct {
	procs  []*exec.Cmd
	stdins []io.Closer
	queued []atomic.Int64 // each child's last "queued" report
	strays atomic.Int64
	built  atomic.Int64 // children that said "built"
	wg     sync.WaitGroup
}

// spawnChildren starts procs children queueing n waiters between them.
func spawnChildren(ctx context.Context, cfg config, sp spreader, n, procs int, progress io.Writer) (*children, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ch := &children{queued: make([]atomic.Int64, procs)}
	from := 0
	for k := range procs {
		count := n / procs
		if k < n%procs {
			count++
		}
		spec := sp.spec()
		spec.DSN, spec.From, spec.Count, spec.Inflight, spec.Budget = cfg.dsn, from, count, cfg.inflight, cfg.budget
		from += count
		raw, err := json.Marshal(spec)
		if err != nil {
			return ch, err
		}
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
		cmd.Stderr = progress
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return ch, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return ch, err
		}
		if err := cmd.Start(); err != nil {
			return ch, fmt.Errorf("starting child %d: %w", k, err)
		}
		ch.procs, ch.stdins = append(ch.procs, cmd), append(ch.stdins, stdin)
		ch.wg.Add(1)
		go func() {
			defer ch.wg.Done()
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				word, num, _ := strings.Cut(sc.Text(), " ")
				switch word {
				case "queued":
					if v, err := strconv.ParseInt(num, 10, 64); err == nil {
						ch.queued[k].Store(v)
					}
				case "stray":
					ch.strays.Add(1)
				case "built":
					if v, err := strconv.ParseInt(num, 10, 64); err == nil {
						ch.queued[k].Store(v)
					}
					ch.built.Add(1)
				}
			}
		}()
	}
	return ch, nil
}

// total is the waiters the children have queued so far.
func (ch *children) total() int64 {
	var t int64
	for i := range ch.queued {
		t += ch.queued[i].Load()
	}
	return t
}

// done reports whether every child has stopped queueing.
func (ch *children) done() bool { return int(ch.built.Load()) == len(ch.procs) }

// stop closes the children's stdin and waits for them to exit (killing
// those that do not within ten seconds).
func (ch *children) stop() error {
	for _, in := range ch.stdins {
		_ = in.Close()
	}
	exited := make(chan error, 1)
	go func() {
		var errs []error
		for _, p := range ch.procs {
			if err := p.Wait(); err != nil {
				errs = append(errs, err)
			}
		}
		exited <- errors.Join(errs...)
	}()
	select {
	case err := <-exited:
		ch.wg.Wait()
		return err
	case <-time.After(10 * time.Second):
		for _, p := range ch.procs {
			_ = p.Process.Kill()
		}
		<-exited
		ch.wg.Wait()
		return errors.New("children still running ten seconds after their stdin closed; killed")
	}
}

// waitChildren waits until every child has stopped queueing, reporting
// progress, and returns when each waiter was seen queued (to the 20 ms the
// children are sampled at), as the in-process build records it.
func waitChildren(ctx context.Context, ch *children, start time.Time, progress io.Writer, name string, res *backlogResult) []time.Time {
	var times []time.Time
	seen := int64(0)
	lastReport := start
	for ctx.Err() == nil {
		finished := ch.done()
		now := time.Now()
		for t := ch.total(); seen < t; seen++ {
			times = append(times, now)
		}
		if finished {
			break
		}
		if now.Sub(lastReport) >= 15*time.Second {
			lastReport = now
			fmt.Fprintf(progress, "backlog %s n=%d: %d queued by %d processes after %v\n", name, res.n, seen, len(ch.procs), now.Sub(start).Round(time.Second))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if int(seen) < res.n {
		res.budgetHit = true
	}
	return times
}
