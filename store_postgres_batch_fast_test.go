package runlease_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
)

func TestPostgresFencedBatchForm(t *testing.T) {
	t.Parallel()
	s, r, _ := recordedStore(t, nil)
	require.True(t, mustCAS(t, s, "lease", nil, "v1"))
	require.True(t, mustCAS(t, s, "old", nil, "o1"))

	fenced := [][]string{{"fenced"}}
	general := [][]string{{"hold", "apply"}}
	cases := []struct {
		name  string
		conds []runlease.Cond
		ops   []runlease.Op
		want  [][]string
	}{
		{"a_fenced_write_of_two_keys_is_one_statement", []runlease.Cond{runlease.IfEquals("lease", "v1")},
			[]runlease.Op{runlease.Put("ckpt", "c1"), runlease.Put("lease", "v2")}, fenced},
		{"a_fenced_write_of_several_keys_present_and_absent_is_one_statement", []runlease.Cond{runlease.IfEquals("lease", "v2")},
			[]runlease.Op{runlease.Put("lease", "v3"), runlease.Put("z", "z1"), runlease.Put("old", "o2"), runlease.Put("a", "a1")},
			[][]string{{"fenced-many"}}},
		{"a_fenced_write_of_its_condition_key_alone_is_the_conditional_update", []runlease.Cond{runlease.IfEquals("lease", "v3")},
			[]runlease.Op{runlease.Put("lease", "v4")}, [][]string{{"update"}}},
		{"an_absent_key_condition_takes_the_general_form", []runlease.Cond{runlease.IfAbsent("new")},
			[]runlease.Op{runlease.Put("new", "n1"), runlease.Put("ckpt", "c2")}, general},
		{"a_condition_on_a_key_not_written_takes_the_general_form", []runlease.Cond{runlease.IfEquals("lease", "v4")},
			[]runlease.Op{runlease.Put("ckpt", "c3")}, general},
		{"a_delete_takes_the_general_form", []runlease.Cond{runlease.IfEquals("lease", "v4")},
			[]runlease.Op{runlease.Put("lease", "v5"), runlease.Delete("old")}, general},
		{"two_conditions_take_the_general_form", []runlease.Cond{runlease.IfEquals("lease", "v5"), runlease.IfEquals("ckpt", "c3")},
			[]runlease.Op{runlease.Put("lease", "v6"), runlease.Put("ckpt", "c4")}, general},
		{"no_condition_takes_the_general_form", nil, []runlease.Op{runlease.Put("ckpt", "c5")}, general},
	}
	for _, tc := range cases { // in order: each starts from the rows the last left
		mark := r.mark()
		ok, err := s.MetaBatch(t.Context(), tc.conds, tc.ops)
		require.NoError(t, err, tc.name)
		assert.True(t, ok, "%s: applied", tc.name)
		assert.Equal(t, tc.want, kinds(r.since(mark)), "%s: the statements of each round trip", tc.name)
		want := map[string]*string{}
		for _, op := range tc.ops {
			want[op.Key] = strptr(op.Value)
			if op.Delete {
				want[op.Key] = nil
			}
		}
		wantRows(t, s, want)
	}
}

func TestPostgresLeaseWriteIsOneFencedStatement(t *testing.T) {
	t.Parallel()
	s, r, _ := recordedStore(t, nil)
	l, err := runlease.Acquire(t.Context(), s, "run", "node")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Release(context.WithoutCancel(t.Context())) })
	for i := range 3 {
		mark := r.mark()
		require.NoError(t, l.Write(t.Context(), runlease.Put("ckpt:run", strings.Repeat("é", i+1))))
		assert.Equal(t, [][]string{{"fenced"}}, kinds(r.since(mark)), "write %d of one key", i)
		mark = r.mark()
		require.NoError(t, l.Write(t.Context(), runlease.Put("ckpt:run", "one"), runlease.Put("ckpt:run:2", strings.Repeat("ü", i+1))))
		assert.Equal(t, [][]string{{"fenced-many"}}, kinds(r.since(mark)), "write %d of two keys", i)
	}
	wantRows(t, s, map[string]*string{"ckpt:run": strptr("one"), "ckpt:run:2": strptr("üüü")})
}

func TestPostgresFencedBatchConditions(t *testing.T) {
	t.Parallel()
	s, r, _ := recordedStore(t, nil)
	require.True(t, mustCAS(t, s, "lease", nil, "v1"))
	require.True(t, mustCAS(t, s, "other", nil, "o1"))
	unchanged := map[string]*string{"lease": strptr("v1"), "other": strptr("o1"), "fresh": nil, "gone": nil}
	fenced := [][]string{{"fenced"}}
	cases := []struct {
		name string
		cond runlease.Cond
		ops  []runlease.Op
		want [][]string
	}{
		{"a_stale_value_writes_nothing", runlease.IfEquals("lease", "v0"),
			[]runlease.Op{runlease.Put("lease", "v2"), runlease.Put("other", "o2"), runlease.Put("fresh", "f")},
			[][]string{{"fenced-many"}}},
		{"a_value_that_differs_only_in_case_writes_nothing", runlease.IfEquals("lease", "V1"),
			[]runlease.Op{runlease.Put("lease", "v2"), runlease.Put("fresh", "f")}, fenced},
		{"an_empty_expected_value_writes_nothing", runlease.IfEquals("lease", ""),
			[]runlease.Op{runlease.Put("lease", "v2"), runlease.Put("fresh", "f")}, fenced},
		{"an_absent_condition_key_writes_nothing", runlease.IfEquals("gone", "v1"),
			[]runlease.Op{runlease.Put("gone", "v2"), runlease.Put("other", "o2")}, fenced},
		{"a_failed_update_alone_writes_nothing", runlease.IfEquals("lease", "v0"),
			[]runlease.Op{runlease.Put("lease", "v2")}, [][]string{{"update"}}},
	}
	for _, tc := range cases { // not parallel: each checks that no case wrote
		mark := r.mark()
		ok, err := s.MetaBatch(t.Context(), []runlease.Cond{tc.cond}, tc.ops)
		require.NoError(t, err, tc.name)
		assert.False(t, ok, "%s: applied", tc.name)
		assert.Equal(t, tc.want, kinds(r.since(mark)), "%s: the statements of each round trip", tc.name)
		wantRows(t, s, unchanged)
	}
}

func TestPostgresFencedBatchValuesAreByteExact(t *testing.T) {
	t.Parallel()
	s, r, _ := recordedStore(t, nil)
	big := strings.Repeat("ü", runlease.MaxValueLen/2)
	values := []string{
		"plain",
		"",
		"ünïcödé ✓ 日本語 🙂 e\u0301 \u00e9",
		"quotes ' \" \\ $1 %s ::text[] {a,b} NULL",
		"tab\tnewline\ncr\r control \x01\x1f",
		big,
		strings.Repeat("x", runlease.MaxValueLen),
	}
	// Each value goes through both fenced statements: to one other key,
	// then to two more, so that every key written takes a new value.
	keys := []string{"lease:ü", "ckpt:日本", "ckpt:🙂", "ckpt:{a,\"b\"}"}
	passes := []struct {
		others []string
		want   [][]string
	}{
		{keys[1:2], [][]string{{"fenced"}}},
		{keys[2:], [][]string{{"fenced-many"}}},
	}
	cur := "start"
	require.True(t, mustCAS(t, s, keys[0], nil, cur))
	for i, v := range values {
		for _, pass := range passes {
			mark := r.mark()
			next := fmt.Sprintf("%s·%d", v, len(pass.others))
			if len(next) > runlease.MaxValueLen {
				next = v
			}
			ops := []runlease.Op{runlease.Put(keys[0], next)}
			want := map[string]*string{keys[0]: strptr(next)}
			for _, k := range pass.others {
				ops = append(ops, runlease.Put(k, v))
				want[k] = strptr(v)
			}
			ok, err := s.MetaBatch(t.Context(), []runlease.Cond{runlease.IfEquals(keys[0], cur)}, ops)
			require.NoError(t, err, "value %d", i)
			require.True(t, ok, "value %d: applied", i)
			assert.Equal(t, pass.want, kinds(r.since(mark)), "value %d", i)
			wantRows(t, s, want)
			cur = next
		}
	}
}
