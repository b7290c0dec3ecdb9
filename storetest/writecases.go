package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

// writeCase is one kind of write whose outcome the fault subtests check.
// Every attempt puts its keys under a prefix p of its own, and the write's
// conditions always hold, so without a fault it must apply.
type writeCase struct {
	name   string
	atomic bool // all or nothing; false for MetaCASMany, whose writes are independent
	// prepare puts p's keys in their state before the write.
	prepare func(t *testing.T, s runlease.Store, p string)
	// write makes the write; ok is true when it reports every part applied.
	write func(ctx context.Context, s runlease.Store, p string) (ok bool, err error)
	// effect reads back what the write did.
	effect func(t *testing.T, s runlease.Store, p string) effect
}

// writeCases returns the write cases s supports: the single-key writes
// always, a batch and a multi-key CAS when s has those capabilities.
func writeCases(s runlease.Store) []writeCase {
	cases := []writeCase{
		{
			name: "MetaCAS_creating", atomic: true,
			prepare: func(*testing.T, runlease.Store, string) {},
			write: func(ctx context.Context, s runlease.Store, p string) (bool, error) {
				return s.MetaCAS(ctx, p+"k", nil, "new")
			},
			effect: func(t *testing.T, s runlease.Store, p string) effect { return effectOf(t, s, p, "k") },
		},
		{
			name: "MetaCAS_swapping", atomic: true,
			prepare: func(t *testing.T, s runlease.Store, p string) { create(t, s, p+"k", "old") },
			write: func(ctx context.Context, s runlease.Store, p string) (bool, error) {
				return s.MetaCAS(ctx, p+"k", ptr("old"), "new")
			},
			effect: func(t *testing.T, s runlease.Store, p string) effect { return effectOf(t, s, p, "k") },
		},
		{
			name: "MetaDelete", atomic: true,
			prepare: func(t *testing.T, s runlease.Store, p string) { create(t, s, p+"k", "old") },
			write: func(ctx context.Context, s runlease.Store, p string) (bool, error) {
				return s.MetaDelete(ctx, p+"k", "old")
			},
			effect: func(t *testing.T, s runlease.Store, p string) effect {
				v, found := get(t, s, p+"k")
				if !found {
					return effectAll
				}
				require.Equal(t, "old", v, "MetaDelete(%q) left a value it never wrote", p+"k")
				return effectNone
			},
		},
	}
	if _, ok := s.(runlease.Batcher); ok {
		cases = append(cases, writeCase{
			name: "MetaBatch", atomic: true,
			prepare: prepareTwo,
			write: func(ctx context.Context, s runlease.Store, p string) (bool, error) {
				return s.(runlease.Batcher).MetaBatch(ctx,
					[]runlease.Cond{runlease.IfEquals(p+"a", "old"), runlease.IfAbsent(p + "b"), runlease.IfEquals(p+"c", "cond")},
					[]runlease.Op{runlease.Put(p+"a", "new"), runlease.Put(p+"b", "new")})
			},
			effect: func(t *testing.T, s runlease.Store, p string) effect { return effectOf(t, s, p, "a", "b") },
		})
	}
	if _, ok := s.(runlease.MultiCASer); ok {
		cases = append(cases, writeCase{
			name:    "MetaCASMany",
			prepare: prepareTwo,
			write: func(ctx context.Context, s runlease.Store, p string) (bool, error) {
				swapped, err := s.(runlease.MultiCASer).MetaCASMany(ctx, []runlease.CASWrite{
					{Key: p + "a", Expected: ptr("old"), Value: "new"},
					{Key: p + "b", Value: "new"},
				})
				return len(swapped) == 2 && swapped[0] && swapped[1], err
			},
			effect: func(t *testing.T, s runlease.Store, p string) effect { return effectOf(t, s, p, "a", "b") },
		})
	}
	return cases
}

// prepareTwo sets p+"a" to "old" and p+"c" to "cond", and leaves p+"b" absent.
func prepareTwo(t *testing.T, s runlease.Store, p string) {
	t.Helper()
	create(t, s, p+"a", "old")
	create(t, s, p+"c", "cond")
}

// effectOf reads p+name for each name, in one scan so that a write
// landing meanwhile is seen whole or not at all (a write whose outcome is
// unknown may land after its call returned): each holds "new" if the write
// reached it, and "old" or nothing if not.
func effectOf(t *testing.T, s runlease.Store, p string, names ...string) effect {
	t.Helper()
	rows := map[string]string{}
	for _, r := range scan(t, s, p) {
		rows[r.Key] = r.Value
	}
	applied := 0
	for _, n := range names {
		v, found := rows[p+n]
		switch {
		case found && v == "new":
			applied++
		case found && v != "old":
			require.Failf(t, "a write left a value it never wrote", "%q holds %q", p+n, v)
		}
	}
	switch applied {
	case 0:
		return effectNone
	case len(names):
		return effectAll
	}
	return effectPart
}

// cutCalls is how many calls the tests of contexts that end during a call
// make.
func cutCalls() int {
	return shortOr(24, 200)
}

// cutContext returns a context that ends at a random instant within twice
// d, the time a call takes: before, during or after the call it is given
// to.
func cutContext(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), time.Duration(rand.Int64N(int64(2*d)+1)))
}

// cutRounds makes cutCalls() rounds over the writes of writeCases(s), in
// turn, each prepared under a prefix of its own, and calls fn with the
// round's write, its prefix, and a maker of contexts that end within twice
// the time such a write takes (see cutContext).
func cutRounds(t *testing.T, s runlease.Store, fn func(c writeCase, p string, cut func() (context.Context, context.CancelFunc))) {
	cases := writeCases(s)
	took := timeWrites(t, s, cases)
	for i := range cutCalls() {
		c := cases[i%len(cases)]
		p := fmt.Sprintf("cut/%s/%d/", c.name, i)
		c.prepare(t, s, p)
		fn(c, p, func() (context.Context, context.CancelFunc) { return cutContext(t, took[i%len(cases)]) })
	}
}

// timeWrites makes each write of cases once, uncut, and returns how long
// each took, so that cut contexts can end while such a call runs.
func timeWrites(t *testing.T, s runlease.Store, cases []writeCase) []time.Duration {
	d := make([]time.Duration, len(cases))
	for i, c := range cases {
		p := "timed/" + c.name + "/"
		c.prepare(t, s, p)
		start := time.Now()
		ok, err := c.write(t.Context(), s, p)
		d[i] = time.Since(start)
		require.NoError(t, err, c.name)
		require.True(t, ok, c.name)
	}
	return d
}
