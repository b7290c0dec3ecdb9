package linearize

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/areev/runlease"
)

// Workload describes the random calls that clients make. Few keys and few
// values make the clients collide often (conditional writes that win and
// lose, reads of values another client just wrote), while keeping the
// checker's search small.
type Workload struct {
	Keys   []string // at most MaxKeys
	Values []string // what cas and batches write
	// BatchShare is the share of calls that are batches, 0 for none; the
	// store must then be a runlease.Batcher.
	BatchShare float64
	// Now is the clock every client reads, in nanoseconds: history.Mono
	// when the clients are in several processes.
	Now func() int64
	// Timeout bounds each call; 0 for none.
	Timeout time.Duration
	// CutShare is the share of calls whose context ends after a random
	// time of up to CutWithin, so that some calls are cancelled before,
	// while and after they reach the store: the store must then report
	// each write's outcome truthfully.
	CutShare  float64
	CutWithin time.Duration
}

// Client makes random calls on a store and records them. Each client
// issues one call at a time; it is not safe for concurrent use, so each
// goroutine has its own.
type Client struct {
	w        *Workload
	store    runlease.Store
	proc, id int
	rng      *rand.Rand
	// seen is the value this client last saw at each key (nil: absent),
	// which most of its conditional writes expect, so that many of them
	// win.
	seen map[string]*string
}

// NewClient returns client id of process proc, making calls on store with
// random choices seeded by seed.
func (w *Workload) NewClient(store runlease.Store, proc, id int, seed uint64) *Client {
	return &Client{
		w: w, store: store, proc: proc, id: id,
		rng:  rand.New(rand.NewPCG(seed, uint64(proc)<<32|uint64(id))),
		seen: map[string]*string{},
	}
}

// Step makes one random call and returns its record and the call's error.
// keep is false when the record must be left out of the history (see
// [Classify]); an uncertain write is kept, with Unknown set.
func (c *Client) Step(ctx context.Context) (rec Record, keep bool, err error) {
	if d := c.timeout(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	rec = c.next()
	rec.Call = c.w.Now()
	err = c.do(ctx, &rec)
	rec.Return = c.w.Now()
	switch Classify(err, rec.writes()) {
	case Omit:
		return rec, false, err
	case Uncertain:
		rec.Unknown, rec.OK, rec.Found, rec.Got = true, false, false, ""
		return rec, true, err
	}
	c.learn(&rec)
	return rec, true, nil
}

// timeout returns the time the next call may take, 0 for no limit.
func (c *Client) timeout() time.Duration {
	if c.w.CutShare > 0 && c.rng.Float64() < c.w.CutShare {
		return 1 + time.Duration(c.rng.Int64N(int64(c.w.CutWithin)))
	}
	return c.w.Timeout
}

// next chooses a call.
func (c *Client) next() Record {
	rec := Record{Proc: c.proc, Client: c.id, Key: c.key()}
	switch r := c.rng.Float64(); {
	case r < c.w.BatchShare:
		rec.Kind, rec.Key = Batch, ""
		c.batch(&rec)
	case r < c.w.BatchShare+(1-c.w.BatchShare)*0.40:
		rec.Kind = Get
	case r < c.w.BatchShare+(1-c.w.BatchShare)*0.85:
		rec.Kind = CAS
		rec.Expected = c.expect(rec.Key, true)
		rec.Value = c.value()
	default:
		rec.Kind = Delete
		rec.Expected = c.expect(rec.Key, false)
	}
	return rec
}

func (c *Client) key() string   { return c.w.Keys[c.rng.IntN(len(c.w.Keys))] }
func (c *Client) value() string { return c.w.Values[c.rng.IntN(len(c.w.Values))] }

// expect returns what a conditional write expects at key: mostly what this
// client last saw there, sometimes a random value (or, when absent is
// allowed, absence), which mostly loses.
func (c *Client) expect(key string, absent bool) *string {
	if v := c.seen[key]; c.rng.IntN(4) > 0 && (v != nil || absent) {
		return v
	}
	if absent && c.rng.IntN(len(c.w.Values)+1) == 0 {
		return nil
	}
	v := c.value()
	return &v
}

// batch fills in a batch over one to three distinct keys: a condition on
// most of them, and a put (or, now and then, a delete) on each.
func (c *Client) batch(rec *Record) {
	n := 1 + c.rng.IntN(min(3, len(c.w.Keys)))
	for _, i := range c.rng.Perm(len(c.w.Keys))[:n] {
		k := c.w.Keys[i]
		if c.rng.IntN(5) > 0 {
			rec.Conds = append(rec.Conds, runlease.Cond{Key: k, Value: c.expect(k, true)})
		}
		if c.rng.IntN(5) == 0 {
			rec.Ops = append(rec.Ops, runlease.Delete(k))
		} else {
			rec.Ops = append(rec.Ops, runlease.Put(k, c.value()))
		}
	}
}

// do makes the call and fills in its results.
func (c *Client) do(ctx context.Context, rec *Record) (err error) {
	switch rec.Kind {
	case Get:
		rec.Got, rec.Found, err = c.store.MetaGet(ctx, rec.Key)
	case CAS:
		rec.OK, err = c.store.MetaCAS(ctx, rec.Key, rec.Expected, rec.Value)
	case Delete:
		rec.OK, err = c.store.MetaDelete(ctx, rec.Key, *rec.Expected)
	case Batch:
		rec.OK, err = c.store.(runlease.Batcher).MetaBatch(ctx, rec.Conds, rec.Ops)
	}
	return err
}

// learn updates what the client has seen from a call that returned.
func (c *Client) learn(rec *Record) {
	switch {
	case rec.Kind == Get:
		c.seen[rec.Key] = ptrIf(rec.Got, rec.Found)
	case rec.Kind == CAS && rec.OK:
		c.seen[rec.Key] = ptrIf(rec.Value, true)
	case rec.Kind == Delete && rec.OK:
		c.seen[rec.Key] = nil
	case rec.Kind == Batch && rec.OK:
		for _, op := range rec.Ops {
			c.seen[op.Key] = ptrIf(op.Value, !op.Delete)
		}
	}
}
