package benchkit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/areev/runlease"
)

// Scenario is one operation measured through the library (Store) and as
// the least SQL that does the same work (Base). Each makes the Worker of
// goroutine w; workers never share keys, so goroutines do not contend for
// rows, only for the store.
type Scenario struct {
	Name     string // the harness's -scenarios name
	Title    string // the operation, as tables show it
	BaseDesc string // the baseline's statements
	Store    func(ctx context.Context, e *Env, w int) (*Worker, error)
	Base     func(ctx context.Context, e *Env, w int) (*Worker, error)
}

// Scenarios returns every scenario, in the order tables list them.
func Scenarios() []Scenario {
	return []Scenario{
		Get, CASCreate, CASSwap, Delete, Scan, Batch,
		Acquire, AcquireRelease, AcquireReleasePlain, AcquireReleaseDelete, Renew, Write,
		Claim(1), Claim(10), Claim(1000), SlotsRenew, Peek, Occupancy,
	}
}

// Select returns the scenarios named in names, in the order given; "claim"
// stands for claim-1, claim-10 and claim-1000, and "all" for every
// scenario. "handoff" is not one of them (see Handoff) and is skipped.
func Select(names []string) ([]Scenario, error) {
	byName := map[string]Scenario{}
	for _, s := range Scenarios() {
		byName[s.Name] = s
	}
	var out []Scenario
	for _, n := range names {
		switch n = strings.TrimSpace(n); n {
		case "all":
			out = append(out, Scenarios()...)
		case "claim":
			out = append(out, Claim(1), Claim(10), Claim(1000))
		case "handoff", "":
		default:
			s, ok := byName[n]
			if !ok {
				return nil, fmt.Errorf("benchkit: unknown scenario %q", n)
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// Holder returns the holder string of goroutine w.
func Holder(w int) string { return fmt.Sprintf("bench#node-%d", w) }

// rowValue returns a row in the lease format, built as cheaply as the
// library builds its own.
func rowValue(holder string, fence uint64, untilMS int64) string {
	b := make([]byte, 0, len(holder)+56)
	b = append(b, `{"holder":"`...)
	b = append(b, holder...)
	b = append(b, `","fence":`...)
	b = strconv.AppendUint(b, fence, 10)
	b = append(b, `,"until_ms":`...)
	b = strconv.AppendInt(b, untilMS, 10)
	return string(append(b, '}'))
}

// leaseTTL is the TTL of every lease and slot the scenarios take.
const leaseTTL = 10 * time.Minute

// liveRow returns a row held by holder for the lease TTL from now.
func liveRow(holder string, fence uint64) string {
	return rowValue(holder, fence, time.Now().Add(leaseTTL).UnixMilli())
}

// tickClock is the clock of a goroutine's renewals: real time, moved one
// millisecond past its last reading whenever a reading would repeat it, so
// that every renewal writes a row that differs from the last, as renewals
// seconds apart do in production. (SQLite does not write a row that an
// UPDATE leaves unchanged, and then has nothing to sync: a loop of renewals
// within one millisecond would measure no-ops.) It runs ahead of real time
// by at most a millisecond per renewal. It is safe for concurrent use.
type tickClock struct {
	mu   sync.Mutex
	last time.Time
}

// Now returns the clock's reading.
func (c *tickClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now().Truncate(time.Millisecond)
	if !now.After(c.last) {
		now = c.last.Add(time.Millisecond)
	}
	c.last = now
	return now
}

// row returns a row held by holder for the lease TTL from the clock's now.
func (c *tickClock) row(holder string, fence uint64) string {
	return rowValue(holder, fence, c.Now().Add(leaseTTL).UnixMilli())
}

// payload returns a checkpoint value of about 100 bytes, different for
// every i.
func payload(i int64) string {
	return fmt.Sprintf("{\"step\":%d,\"state\":\"%s\"}", i, strings.Repeat("x", 80))
}

var errNotApplied = errors.New("a write that should have applied did not")

func must(ok bool, err error) error {
	if err == nil && !ok {
		return errNotApplied
	}
	return err
}

func batcher(e *Env) runlease.Batcher { return e.Store.(runlease.Batcher) }

// Get is MetaGet of a key that exists.
var Get = Scenario{
	Name: "get", Title: "MetaGet", BaseDesc: "SELECT value WHERE key",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		key := fmt.Sprintf("bench:get:%d", e.Seq())
		if err := must(e.Store.MetaCAS(ctx, key, nil, liveRow(Holder(w), 1))); err != nil {
			return nil, err
		}
		return &Worker{Op: func(ctx context.Context) error {
			_, found, err := e.Store.MetaGet(ctx, key)
			return must(found, err)
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		key := fmt.Sprintf("bench:get:%d", e.Seq())
		if err := must(e.Raw.Insert(ctx, key, liveRow(Holder(w), 1))); err != nil {
			return nil, err
		}
		return &Worker{Op: func(ctx context.Context) error {
			_, found, err := e.Raw.Get(ctx, key)
			return must(found, err)
		}}, nil
	},
}

// CASCreate is MetaCAS of a key that does not exist yet.
var CASCreate = Scenario{
	Name: "cas-create", Title: "MetaCAS create", BaseDesc: "INSERT … ON CONFLICT DO NOTHING",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		prefix, i := fmt.Sprintf("bench:create:%d:", e.Seq()), int64(0)
		return &Worker{Op: func(ctx context.Context) error {
			i++
			return must(e.Store.MetaCAS(ctx, prefix+strconv.FormatInt(i, 10), nil, liveRow(Holder(w), 1)))
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		prefix, i := fmt.Sprintf("bench:create:%d:", e.Seq()), int64(0)
		return &Worker{Op: func(ctx context.Context) error {
			i++
			return must(e.Raw.Insert(ctx, prefix+strconv.FormatInt(i, 10), liveRow(Holder(w), 1)))
		}}, nil
	},
}

// CASSwap is MetaCAS over the key's current value.
var CASSwap = Scenario{
	Name: "cas-swap", Title: "MetaCAS swap", BaseDesc: "UPDATE … WHERE key AND value",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		clock := &tickClock{}
		key, cur := fmt.Sprintf("bench:swap:%d", e.Seq()), clock.row(Holder(w), 1)
		if err := must(e.Store.MetaCAS(ctx, key, nil, cur)); err != nil {
			return nil, err
		}
		return &Worker{Op: func(ctx context.Context) error {
			next := clock.row(Holder(w), 1)
			err := must(e.Store.MetaCAS(ctx, key, &cur, next))
			cur = next
			return err
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		return rawSwap(ctx, e, fmt.Sprintf("bench:swap:%d", e.Seq()), Holder(w))
	},
}

// rawSwap is the baseline of every single-row renewal: an UPDATE over the
// key's current value, with the row's expiry from a tickClock.
func rawSwap(ctx context.Context, e *Env, key, holder string) (*Worker, error) {
	clock := &tickClock{}
	cur := clock.row(holder, 1)
	if err := must(e.Raw.Insert(ctx, key, cur)); err != nil {
		return nil, err
	}
	return &Worker{Op: func(ctx context.Context) error {
		next := clock.row(holder, 1)
		err := must(e.Raw.Update(ctx, key, cur, next))
		cur = next
		return err
	}}, nil
}

// deleteChunk is how many rows a Delete worker writes ahead, in one call.
const deleteChunk = runlease.MaxBatch

// Delete is MetaDelete of a key holding the expected value. The rows are
// written ahead, deleteChunk at a time in one untimed call.
var Delete = Scenario{
	Name: "delete", Title: "MetaDelete", BaseDesc: "DELETE … WHERE key AND value",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		q := &deleteQueue{e: e, value: liveRow(Holder(w), 1)}
		q.write = func(ctx context.Context, rows []runlease.Row) error {
			ops := make([]runlease.Op, len(rows))
			for i, r := range rows {
				ops[i] = runlease.Put(r.Key, r.Value)
			}
			return must(batcher(e).MetaBatch(ctx, nil, ops))
		}
		return &Worker{Prep: q.prep, Op: func(ctx context.Context) error {
			return must(e.Store.MetaDelete(ctx, q.pop(), q.value))
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		q := &deleteQueue{e: e, value: liveRow(Holder(w), 1), write: e.Raw.Upsert}
		return &Worker{Prep: q.prep, Op: func(ctx context.Context) error {
			return must(e.Raw.Delete(ctx, q.pop(), q.value))
		}}, nil
	},
}

type deleteQueue struct {
	e     *Env
	value string
	keys  []string
	write func(context.Context, []runlease.Row) error
}

func (q *deleteQueue) prep(ctx context.Context) (int64, error) {
	if len(q.keys) > 0 {
		return 0, nil
	}
	seq := q.e.Seq()
	rows := make([]runlease.Row, deleteChunk)
	for i := range rows {
		rows[i] = runlease.Row{Key: fmt.Sprintf("bench:del:%d:%d", seq, i), Value: q.value}
		q.keys = append(q.keys, rows[i].Key)
	}
	return 1, q.write(ctx, rows)
}

func (q *deleteQueue) pop() string {
	k := q.keys[len(q.keys)-1]
	q.keys = q.keys[:len(q.keys)-1]
	return k
}

// scanRows is how many rows the Scan scenario's prefix holds.
const scanRows = 10

// Scan is MetaScan of a prefix holding scanRows rows.
var Scan = Scenario{
	Name: "scan", Title: fmt.Sprintf("MetaScan (%d rows)", scanRows), BaseDesc: "SELECT key, value WHERE key >= p AND key < succ(p)",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		if err := scanSetUp(ctx, e); err != nil {
			return nil, err
		}
		return &Worker{Op: func(ctx context.Context) error {
			rows, err := e.Store.MetaScan(ctx, "bench:scan:")
			return wantRows(rows, err, scanRows)
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		if err := scanSetUp(ctx, e); err != nil {
			return nil, err
		}
		return &Worker{Op: func(ctx context.Context) error {
			rows, err := e.Raw.Scan(ctx, "bench:scan:")
			return wantRows(rows, err, scanRows)
		}}, nil
	},
}

func scanSetUp(ctx context.Context, e *Env) error {
	return e.Once("scan", func() error {
		rows := make([]runlease.Row, scanRows)
		for i := range rows {
			rows[i] = runlease.Row{Key: fmt.Sprintf("bench:scan:%02d", i), Value: liveRow(Holder(i), 1)}
		}
		return e.Raw.Upsert(ctx, rows)
	})
}

func wantRows(rows []runlease.Row, err error, n int) error {
	if err == nil && len(rows) != n {
		return fmt.Errorf("scan returned %d rows, want %d", len(rows), n)
	}
	return err
}

// Batch is MetaBatch of a fenced write's shape: one condition, two puts.
var Batch = Scenario{
	Name: "batch", Title: "MetaBatch (1 cond, 2 puts)", BaseDesc: "fenced write: UPDATE … WHERE key AND value, then upsert, in one transaction",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		seq, clock := e.Seq(), &tickClock{}
		key, key2, cur := fmt.Sprintf("bench:batch:%d", seq), fmt.Sprintf("bench:ckpt:%d", seq), clock.row(Holder(w), 1)
		if err := must(e.Store.MetaCAS(ctx, key, nil, cur)); err != nil {
			return nil, err
		}
		i := int64(0)
		return &Worker{Op: func(ctx context.Context) error {
			i++
			next := clock.row(Holder(w), 1)
			err := must(batcher(e).MetaBatch(ctx, []runlease.Cond{runlease.IfEquals(key, cur)},
				[]runlease.Op{runlease.Put(key, next), runlease.Put(key2, payload(i))}))
			cur = next
			return err
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		seq := e.Seq()
		return rawFenced(ctx, e, fmt.Sprintf("bench:batch:%d", seq), fmt.Sprintf("bench:ckpt:%d", seq), Holder(w))
	},
}

// rawFenced is the baseline of a fenced write.
func rawFenced(ctx context.Context, e *Env, key, key2, holder string) (*Worker, error) {
	clock := &tickClock{}
	cur := clock.row(holder, 1)
	if err := must(e.Raw.Insert(ctx, key, cur)); err != nil {
		return nil, err
	}
	i := int64(0)
	return &Worker{Op: func(ctx context.Context) error {
		i++
		next := clock.row(holder, 1)
		err := must(e.Raw.FencedWrite(ctx, key, cur, next, key2, payload(i)))
		cur = next
		return err
	}}, nil
}
