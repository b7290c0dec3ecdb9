package linearize

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// MaxKeys is the most keys one history may use: the model's state is a
// fixed array, so that states compare with == and hash cheaply.
const MaxKeys = 8

// Infinity is the Return of an operation whose outcome is unknown: it may
// take effect at any instant after its call.
const Infinity = math.MaxInt64

// reg is one key's register.
type reg struct {
	present bool
	value   string
}

// state is the whole map, one register per key of the model.
type state [MaxKeys]reg

// model is the sequential specification of a Store over a fixed set of
// keys.
type model struct {
	index map[string]int // key → register
}

// Model returns porcupine's model of a Store over keys (at most
// [MaxKeys]). With partition set, the history is split by key and each key
// is checked alone, which is sound only for histories without batches.
func Model(keys []string, partition bool) porcupine.Model {
	if len(keys) > MaxKeys {
		panic(fmt.Sprintf("linearize: %d keys, the model holds at most %d", len(keys), MaxKeys))
	}
	m := &model{index: map[string]int{}}
	for i, k := range keys {
		m.index[k] = i
	}
	pm := porcupine.Model{
		Init: func() any { return state{} },
		Step: m.step,
		Hash: hashState,
		DescribeOperation: func(in, _ any) string {
			return in.(*Record).String()
		},
		DescribeState: func(s any) string { return m.describe(s.(state)) },
	}
	if partition {
		pm.Partition = partitionByKey
		pm.PartitionEvent = partitionEventsByKey
	}
	return pm
}

// step applies one operation (input and output are the same *Record) to
// st, and reports whether the record's results could have come from st.
// A record whose outcome is unknown is accepted whatever st holds: if its
// condition holds it is applied, otherwise it changes nothing; the case
// where the store never applied it is the linearization that puts it after
// every other operation.
func (m *model) step(st, in, _ any) (bool, any) {
	s := st.(state)
	r := in.(*Record)
	switch r.Kind {
	case Get:
		g := s[m.reg(r.Key)]
		return g.present == r.Found && (!g.present || g.value == r.Got), s
	case CAS:
		i := m.reg(r.Key)
		holds := matches(s[i], r.Expected)
		if holds {
			s[i] = reg{present: true, value: r.Value}
		}
		return r.Unknown || holds == r.OK, s
	case Delete:
		i := m.reg(r.Key)
		holds := r.Expected != nil && matches(s[i], r.Expected)
		if holds {
			s[i] = reg{}
		}
		return r.Unknown || holds == r.OK, s
	case Batch:
		holds := true
		for _, c := range r.Conds {
			holds = holds && matches(s[m.reg(c.Key)], c.Value)
		}
		if holds {
			for _, op := range r.Ops {
				if op.Delete {
					s[m.reg(op.Key)] = reg{}
				} else {
					s[m.reg(op.Key)] = reg{present: true, value: op.Value}
				}
			}
		}
		return r.Unknown || holds == r.OK, s
	}
	panic(fmt.Sprintf("linearize: unknown kind %q", r.Kind))
}

// matches reports whether g satisfies a condition: holds exactly *want, or
// is absent when want is nil.
func matches(g reg, want *string) bool {
	if want == nil {
		return !g.present
	}
	return g.present && g.value == *want
}

func (m *model) reg(key string) int {
	i, ok := m.index[key]
	if !ok {
		panic(fmt.Sprintf("linearize: key %q is not one of the model's", key))
	}
	return i
}

func (m *model) describe(s state) string {
	keys := make([]string, 0, len(m.index))
	for k := range m.index {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if g := s[m.index[k]]; g.present {
			parts = append(parts, fmt.Sprintf("%s=%q", k, g.value))
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func hashState(st any) uint64 {
	s := st.(state)
	h := fnv.New64a()
	for _, g := range s {
		if g.present {
			h.Write([]byte{1})
			h.Write([]byte(g.value))
		}
		h.Write([]byte{0})
	}
	return h.Sum64()
}

func partitionByKey(ops []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range ops {
		k := op.Input.(*Record).Key
		byKey[k] = append(byKey[k], op)
	}
	return sortedValues(byKey)
}

func partitionEventsByKey(events []porcupine.Event) [][]porcupine.Event {
	byKey := map[string][]porcupine.Event{}
	for _, e := range events {
		k := e.Value.(*Record).Key
		byKey[k] = append(byKey[k], e)
	}
	return sortedValues(byKey)
}

func sortedValues[T any](m map[string][]T) [][]T {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([][]T, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

// Result is the verdict on a history.
type Result struct {
	Verdict   porcupine.CheckResult // Ok, Illegal, or Unknown when the check timed out
	Ops       int                   // operations checked
	Uncertain int                   // of which with an unknown outcome
	Took      time.Duration
	Model     porcupine.Model
	History   []porcupine.Operation
}

// Check checks records against the model of a Store over keys, within
// timeout. With partition set each key is checked alone; it must not be set
// when the history holds batches. A Verdict of porcupine.Unknown means the
// search ran out of time, which a test must treat as a failure.
func Check(records []Record, keys []string, partition bool, timeout time.Duration) Result {
	res := Result{Model: Model(keys, partition), History: Operations(records)}
	for i := range records {
		if partition && records[i].Kind == Batch {
			panic("linearize: a history with batches cannot be partitioned by key")
		}
		if records[i].Unknown {
			res.Uncertain++
		}
	}
	res.Ops = len(res.History)
	start := time.Now()
	res.Verdict = porcupine.CheckOperationsTimeout(res.Model, res.History, timeout)
	res.Took = time.Since(start)
	return res
}

// Operations turns records into porcupine's operations. Each record is
// both the input and the output of its operation; an uncertain one returns
// at [Infinity]. Client ids are numbered from 0 across processes, in
// (Proc, Client) order, as porcupine's visualization wants them.
func Operations(records []Record) []porcupine.Operation {
	type client struct{ proc, id int }
	var clients []client
	seen := map[client]bool{}
	for _, r := range records {
		c := client{r.Proc, r.Client}
		if !seen[c] {
			seen[c] = true
			clients = append(clients, c)
		}
	}
	slices.SortFunc(clients, func(a, b client) int { return cmp.Or(cmp.Compare(a.proc, b.proc), cmp.Compare(a.id, b.id)) })
	ids := map[client]int{}
	for i, c := range clients {
		ids[c] = i
	}
	ops := make([]porcupine.Operation, len(records))
	for i := range records {
		r := &records[i]
		ret := r.Return
		if r.Unknown {
			ret = Infinity
		}
		ops[i] = porcupine.Operation{
			ClientId: ids[client{r.Proc, r.Client}],
			Input:    r,
			Output:   r,
			Call:     r.Call,
			Return:   ret,
		}
	}
	return ops
}

// Visualize writes porcupine's HTML view of the result to path, so that a
// failure can be looked at: it shows, per key, the longest prefix that
// could be linearized and where the search got stuck. It re-runs the check
// with the extra bookkeeping that the view needs, within timeout.
func (res Result) Visualize(path string, timeout time.Duration) error {
	_, info := porcupine.CheckOperationsVerbose(res.Model, res.History, timeout)
	return porcupine.VisualizePath(res.Model, info, path)
}
