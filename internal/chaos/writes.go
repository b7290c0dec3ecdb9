package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Write is one checkpoint or downstream write attempt, from its event.
type Write struct {
	Run       string
	Fence     uint64
	Seq       int
	T0, T1    int64  // the call began and returned
	Res       string // ResOK, ResLost, ResRefused or ResUnknown
	Slot, Gen int
}

// Writes returns the events of kind as writes.
func Writes(events []Event, kind string) []Write {
	var out []Write
	for _, ev := range events {
		if ev.Kind == kind {
			out = append(out, Write{Run: ev.Run, Fence: ev.Fence, Seq: ev.Seq, T0: ev.T0, T1: ev.T1, Res: ev.Res,
				Slot: ev.Slot, Gen: ev.Gen})
		}
	}
	return out
}

// CountResults counts writes by result.
func CountResults(ws []Write) map[string]int {
	out := map[string]int{}
	for _, w := range ws {
		out[w.Res]++
	}
	return out
}

// FenceSeq is a (fence, seq) pair, ordered by fence then seq.
type FenceSeq struct {
	Fence uint64
	Seq   int
}

func (a FenceSeq) less(b FenceSeq) bool {
	return a.Fence < b.Fence || a.Fence == b.Fence && a.Seq < b.Seq
}

// CkptKey is the key of run's checkpoint.
func CkptKey(run string) string { return "ckpt:" + run }

// CkptValue is the checkpoint a driver writes at fence and seq.
func CkptValue(fence uint64, seq int) string { return fmt.Sprintf("%d:%d", fence, seq) }

// ParseCkptValue parses a CkptValue.
func ParseCkptValue(v string) (FenceSeq, error) {
	f, s, ok := strings.Cut(v, ":")
	fence, err1 := strconv.ParseUint(f, 10, 64)
	seq, err2 := strconv.Atoi(s)
	if !ok || err1 != nil || err2 != nil {
		return FenceSeq{}, fmt.Errorf("checkpoint value %q is not fence:seq", v)
	}
	return FenceSeq{fence, seq}, nil
}

// CkptLogPrefix starts the keys of the checkpoint log: each checkpoint
// write also puts CkptLogKey in the same atomic batch, so the store keeps a
// record of every write that landed, including those whose caller saw a
// fault and cannot tell.
const CkptLogPrefix = "ckptlog:"

// CkptLogKey is the log key of the checkpoint of run at fence and seq.
func CkptLogKey(run string, fence uint64, seq int) string {
	return fmt.Sprintf("%s%s:%020d:%06d", CkptLogPrefix, run, fence, seq)
}

// ParseCkptLogKey parses a CkptLogKey into a write with no times.
func ParseCkptLogKey(key string) (Write, error) {
	rest, ok := strings.CutPrefix(key, CkptLogPrefix)
	parts := strings.Split(rest, ":")
	if !ok || len(parts) != 3 {
		return Write{}, fmt.Errorf("checkpoint log key %q", key)
	}
	fence, err1 := strconv.ParseUint(parts[1], 10, 64)
	seq, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil {
		return Write{}, fmt.Errorf("checkpoint log key %q", key)
	}
	return Write{Run: parts[0], Fence: fence, Seq: seq}, nil
}

// Checkpoints is what the checkpoint check looks at: the tenures, the
// attempts as drivers recorded them, the writes the store's log says
// landed, and each run's final checkpoint value.
type Checkpoints struct {
	Tenures  []Tenure
	Attempts []Write
	Landed   []Write           // from the checkpoint log: Run, Fence, Seq
	Final    map[string]string // run → the stored checkpoint value
	Killed   map[int]int64     // kill time by generation
}

// CheckCheckpoints checks that no fenced checkpoint landed from a holder
// after its successor was granted the run.
//
// A checkpoint write is atomic with a renewal conditional on the holder's
// exact lease row, so one that landed took effect at an instant inside its
// call while the row was still the holder's; once a higher fence was
// written the row never comes back. So a write that landed by fence f must
// have begun (T0) before the earliest return of an Acquire that got a
// fence above f: T0 at or after that return is a stale write that landed.
// The check runs on what drivers saw succeed and, more strictly, on the
// store's own log of what landed (which also covers calls that returned a
// fault). It also checks that the driver's reports agree with the store: a
// write reported lost never landed, one reported ok did, and each run's
// final value is the largest (fence, seq) that landed.
func CheckCheckpoints(c Checkpoints) []string {
	var out []string
	gi := indexGrants(c.Tenures)
	stale := func(w Write, what string) {
		if later := gi.after(w.Run, w.Fence); w.T0 >= later {
			out = append(out, fmt.Sprintf("run %s: checkpoint %s by fence %d %s, begun %s after a higher fence was granted",
				w.Run, CkptValue(w.Fence, w.Seq), w.Fence, what, ns(w.T0-later)))
		}
	}
	type key struct {
		run string
		fs  FenceSeq
	}
	attempts := map[key]Write{}
	for _, w := range c.Attempts {
		attempts[key{w.Run, FenceSeq{w.Fence, w.Seq}}] = w
		if w.Res == ResOK {
			stale(w, "succeeded")
		}
	}
	gens := map[string]int{} // run/fence → generation of its holder
	for _, t := range c.Tenures {
		gens[fmt.Sprintf("%s/%d", t.Run, t.Fence)] = t.Gen
	}
	landed := map[key]bool{}
	for _, l := range c.Landed {
		k := key{l.Run, FenceSeq{l.Fence, l.Seq}}
		landed[k] = true
		w, ok := attempts[k]
		switch {
		case !ok:
			gen, known := gens[fmt.Sprintf("%s/%d", l.Run, l.Fence)]
			if _, killed := c.Killed[gen]; !known || !killed {
				out = append(out, fmt.Sprintf("run %s: checkpoint %s landed but no live driver recorded it",
					l.Run, CkptValue(l.Fence, l.Seq)))
			}
		case w.Res == ResLost:
			out = append(out, fmt.Sprintf("run %s: checkpoint %s was reported lost (RUN-E021) but landed",
				l.Run, CkptValue(l.Fence, l.Seq)))
		case w.Res != ResOK:
			stale(w, "landed (its caller saw a fault)")
		}
	}
	best := map[string]FenceSeq{}
	for k, w := range attempts {
		if w.Res != ResOK {
			continue
		}
		if !landed[k] {
			out = append(out, fmt.Sprintf("run %s: checkpoint %s was reported written but is not in the store's log",
				k.run, CkptValue(k.fs.Fence, k.fs.Seq)))
		}
		if b, ok := best[k.run]; !ok || b.less(k.fs) {
			best[k.run] = k.fs
		}
	}
	for run, b := range best {
		fs, err := ParseCkptValue(c.Final[run])
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("run %s: final checkpoint: %v", run, err))
		case fs.less(b):
			out = append(out, fmt.Sprintf("run %s: final checkpoint %s is older than %s, which succeeded",
				run, c.Final[run], CkptValue(b.Fence, b.Seq)))
		case !landed[key{run, fs}]:
			out = append(out, fmt.Sprintf("run %s: final checkpoint %s is not in the store's log", run, c.Final[run]))
		}
	}
	slices.Sort(out)
	return out
}

// Downstream is what the downstream check looks at: the writes as drivers
// recorded them, the table's final (fence, seq) per run, and, to allow for
// a write a killed driver could not record, the tenures and kill times.
type Downstream struct {
	Writes  []Write
	Final   map[string]FenceSeq
	Tenures []Tenure
	Killed  map[int]int64 // kill time by generation
}

// CheckDownstream checks the downstream fence table: it accepted no stale
// write. In real-time order, every accepted write carries a fence at least
// that of every write accepted before it: for accepted writes a and b of a
// run, a returning before b began implies fence(a) <= fence(b) (writes
// whose calls overlap may have taken effect in either order, so they are
// not compared). The table's final row per run must be at least the
// largest accepted (fence, seq), and must come from a recorded write that
// was accepted or of unknown outcome, from a driver killed while it held
// that fence, or be the initial (0, 0).
func CheckDownstream(d Downstream) []string {
	var out []string
	byRun := map[string][]Write{}
	for _, w := range d.Writes {
		byRun[w.Run] = append(byRun[w.Run], w)
	}
	killedFence := map[string]bool{}
	for _, t := range d.Tenures {
		if _, ok := d.Killed[t.Gen]; ok {
			killedFence[fmt.Sprintf("%s/%d", t.Run, t.Fence)] = true
		}
	}
	for run, list := range byRun {
		var acc []Write
		possible := map[FenceSeq]bool{{}: true}
		var best FenceSeq
		for _, w := range list {
			fs := FenceSeq{w.Fence, w.Seq}
			if w.Res == ResOK {
				acc = append(acc, w)
				best = maxFS(best, fs)
			}
			if w.Res == ResOK || w.Res == ResUnknown {
				possible[fs] = true
			}
		}
		out = append(out, staleAccepts(run, acc)...)
		f := d.Final[run]
		if f.less(best) || !possible[f] && !killedFence[fmt.Sprintf("%s/%d", run, f.Fence)] {
			out = append(out, fmt.Sprintf("run %s: downstream row ended at fence %d seq %d; the largest accepted was fence %d seq %d",
				run, f.Fence, f.Seq, best.Fence, best.Seq))
		}
	}
	slices.Sort(out)
	return out
}

func maxFS(a, b FenceSeq) FenceSeq {
	if a.less(b) {
		return b
	}
	return a
}

// staleAccepts returns a description of each accepted write whose fence is
// below that of a write accepted before it began.
func staleAccepts(run string, acc []Write) []string {
	var out []string
	byEnd := slices.Clone(acc)
	slices.SortFunc(byEnd, func(a, b Write) int { return cmp.Compare(a.T1, b.T1) })
	slices.SortFunc(acc, func(a, b Write) int { return cmp.Compare(a.T0, b.T0) })
	var top Write // the highest fence among writes that returned so far
	j := 0
	for _, b := range acc {
		for ; j < len(byEnd) && byEnd[j].T1 < b.T0; j++ {
			if byEnd[j].Fence > top.Fence {
				top = byEnd[j]
			}
		}
		if b.Fence < top.Fence {
			out = append(out, fmt.Sprintf("run %s: downstream accepted fence %d seq %d, begun %s after it had accepted fence %d",
				run, b.Fence, b.Seq, ns(b.T0-top.T1), top.Fence))
		}
	}
	return out
}
