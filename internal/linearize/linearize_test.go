package linearize

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

func str(s string) *string { return &s }

// op builds a record over [call, ret] on one client.
func op(client int, kind Kind, key string, exp *string, v string, call, ret int64) Record {
	return Record{Client: client, Kind: kind, Key: key, Expected: exp, Value: v, Call: call, Return: ret}
}

func get(client int, key string, got *string, call, ret int64) Record {
	r := op(client, Get, key, nil, "", call, ret)
	if got != nil {
		r.Found, r.Got = true, *got
	}
	return r
}

func withOK(r Record, ok bool) Record { r.OK = ok; return r }
func unknown(r Record) Record         { r.Unknown = true; r.Return = 0; return r }
func check(rs ...Record) porcupine.CheckResult {
	return Check(rs, []string{"x", "y"}, true, 10*time.Second).Verdict
}

func TestModelAcceptsLinearizableHistories(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		h    []Record
	}{
		{"sequential_cas_then_read", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 1), true),
			get(1, "x", str("a"), 2, 3),
		}},
		{"concurrent_read_may_see_either_side", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 10), true),
			get(1, "x", nil, 1, 2),
			get(2, "x", str("a"), 3, 4),
		}},
		{"one_of_two_racing_inserts_wins", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 10), true),
			withOK(op(1, CAS, "x", nil, "b", 0, 10), false),
			get(2, "x", str("a"), 11, 12),
		}},
		{"delete_needs_the_exact_value", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 1), true),
			withOK(op(1, Delete, "x", str("b"), "", 2, 3), false),
			withOK(op(1, Delete, "x", str("a"), "", 4, 5), true),
			get(0, "x", nil, 6, 7),
		}},
		{"unknown_write_that_landed_late", []Record{
			unknown(op(0, CAS, "x", nil, "a", 0, 1)),
			get(1, "x", nil, 5, 6),
			get(1, "x", str("a"), 7, 8),
		}},
		{"unknown_write_that_never_landed", []Record{
			unknown(op(0, CAS, "x", nil, "a", 0, 1)),
			withOK(op(1, CAS, "x", nil, "b", 5, 6), true),
			get(1, "x", str("b"), 7, 8),
		}},
		{"keys_are_independent", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 1), true),
			get(1, "y", nil, 2, 3),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, porcupine.Ok, check(tc.h...))
		})
	}
}

func TestModelRejectsViolations(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		h    []Record
	}{
		{"stale_read_after_an_acknowledged_write", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 1), true),
			get(1, "x", nil, 2, 3),
		}},
		{"two_winners_from_one_value", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 1), true),
			withOK(op(1, CAS, "x", str("a"), "b", 2, 10), true),
			withOK(op(2, CAS, "x", str("a"), "c", 2, 10), true),
		}},
		{"acknowledged_write_dropped", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 1), true),
			withOK(op(0, CAS, "x", str("a"), "b", 2, 3), true),
			get(1, "x", str("a"), 4, 5),
		}},
		{"lost_cas_that_should_have_won", []Record{
			withOK(op(0, CAS, "x", nil, "a", 0, 1), true),
			withOK(op(1, CAS, "x", str("a"), "b", 2, 3), false),
			get(1, "x", str("a"), 4, 5),
		}},
		{"unknown_write_cannot_land_before_its_call", []Record{
			get(1, "x", str("a"), 0, 1),
			unknown(op(0, CAS, "x", nil, "a", 2, 3)),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, porcupine.Illegal, check(tc.h...))
		})
	}
}

func TestModelChecksBatchesAcrossKeys(t *testing.T) {
	t.Parallel()
	keys := []string{"x", "y"}
	swap := Record{Kind: Batch, Conds: []runlease.Cond{runlease.IfAbsent("x")},
		Ops: []runlease.Op{runlease.Put("x", "a"), runlease.Put("y", "b")}, OK: true, Call: 0, Return: 1}
	ok := Check([]Record{swap, get(1, "x", str("a"), 2, 3), get(1, "y", str("b"), 4, 5)}, keys, false, 10*time.Second)
	assert.Equal(t, porcupine.Ok, ok.Verdict)
	// Half a batch: y was written but x was not.
	torn := Check([]Record{swap, get(1, "y", str("b"), 2, 3), get(1, "x", nil, 4, 5)}, keys, false, 10*time.Second)
	assert.Equal(t, porcupine.Illegal, torn.Verdict)
	assert.Panics(t, func() { Check([]Record{swap}, keys, true, time.Second) })
}

func TestClassify(t *testing.T) {
	t.Parallel()
	notApplied := &runlease.StorageError{Op: "MetaCAS", Err: errors.New("refused")}
	maybe := &runlease.StorageError{Op: "MetaCAS", Unknown: true, Err: errors.New("reset")}
	assert.Equal(t, Known, Classify(nil, true))
	assert.Equal(t, Omit, Classify(maybe, false), "a failed read is left out")
	assert.Equal(t, Omit, Classify(fmt.Errorf("wrapped: %w", notApplied), true))
	assert.Equal(t, Uncertain, Classify(maybe, true))
	assert.Equal(t, Uncertain, Classify(context.DeadlineExceeded, true), "an unclassified fault may have landed")
}

// TestClientOnAGoodStore runs the workload on an in-memory SQLite store and
// checks the history, batches included.
func TestClientOnAGoodStore(t *testing.T) {
	t.Parallel()
	s, err := runlease.OpenSQLite(":memory:")
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	start := time.Now()
	w := &Workload{Keys: []string{"a", "b", "c"}, Values: []string{"1", "2", "3"}, BatchShare: 0.2,
		Now: func() int64 { return int64(time.Since(start)) }}
	var recs []Record
	for id := range 3 {
		c := w.NewClient(s, 0, id, 1)
		for range 100 {
			rec, keep, err := c.Step(t.Context())
			require.NoError(t, err)
			require.True(t, keep)
			recs = append(recs, rec)
		}
	}
	res := Check(recs, w.Keys, false, 30*time.Second)
	assert.Equal(t, porcupine.Ok, res.Verdict)
	assert.Equal(t, 300, res.Ops)
}
