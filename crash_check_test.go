//go:build linux

package runlease_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/systest"
)

// crashLeaseAck is the last acknowledged write of a lease row.
type crashLeaseAck struct {
	fence uint64
	until int64 // until_ms
}

// crashState is what the parent knows the store must hold: the last
// acknowledged write of everything, across every kill so far.
type crashState struct {
	counters [crashCounters]uint64
	leases   [crashRuns]crashLeaseAck
	inserts  map[string]string

	acks, landed, kills int // acknowledged writes; unacknowledged ones found applied
}

func newCrashState() *crashState { return &crashState{inserts: map[string]string{}} }

func (st *crashState) String() string {
	return fmt.Sprintf("%d acknowledged writes, %d writes in flight at a kill found applied, "+
		"%d inserts; counters %v; leases %+v", st.acks, st.landed, len(st.inserts), st.counters, st.leases)
}

// requireProgress fails t when the writers wrote too little for the kills
// to have interrupted writing.
func (st *crashState) requireProgress(t *testing.T, kills int) {
	t.Helper()
	require.GreaterOrEqual(t, st.acks, kills/2, "the writers acknowledged too few writes for the kills to interrupt writing")
	for i, c := range st.counters {
		assert.Positive(t, c, "counter %d never moved", i)
	}
}

// check applies the acknowledgements a killed child printed (lines, after
// "ready") and compares the store's rows with them, by the rules in
// crash_test.go. It returns the problems found, and moves the state on to
// what the store holds, for the next child.
func (st *crashState) check(ctx context.Context, store runlease.Store, inc int, lines []string, rows []runlease.Row) (problems []string) {
	st.kills++
	nextInsert, problems := st.apply(lines)
	stored := map[string]string{}
	for _, r := range rows {
		stored[r.Key] = r.Value
	}
	ahead := 0 // writes found applied beyond the acknowledgements
	check := func(p string, isAhead bool) {
		if p != "" {
			problems = append(problems, p)
		}
		if isAhead {
			ahead++
		}
	}
	for i := range st.counters {
		check(st.checkCounter(i, stored))
	}
	for i := range st.leases {
		check(st.checkLease(ctx, store, i, stored))
	}
	for key, want := range st.inserts {
		got, found := stored[key]
		delete(stored, key)
		if !found || got != want {
			problems = append(problems, fmt.Sprintf("acknowledged insert %s=%s, but the store holds %q (found %v)", key, want, got, found))
		}
	}
	// What is left must be the one insert that was in flight.
	for key, v := range stored {
		if key == crashInsertKey(inc, nextInsert) && v == crashInsertValue(inc, nextInsert) {
			st.inserts[key] = v
			ahead++
			continue
		}
		problems = append(problems, fmt.Sprintf("stray row %s=%q", key, v))
	}
	if ahead > 1 {
		problems = append(problems, fmt.Sprintf("%d writes beyond the acknowledged ones landed; one at most was in flight", ahead))
	}
	st.landed += ahead
	return problems
}

// apply records the acknowledgements a child printed, and returns how many
// inserts it acknowledged (the index of its next one) and any line it
// could not read.
func (st *crashState) apply(lines []string) (inserts int, problems []string) {
	for _, line := range lines {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "c":
			i, ok := crashCounterIndex(f[1])
			n, err := strconv.ParseUint(f[2], 10, 64)
			if !ok || err != nil {
				problems = append(problems, "unreadable line "+line)
				continue
			}
			st.counters[i] = n
		case len(f) == 3 && f[0] == "i":
			st.inserts[f[1]] = f[2]
			inserts++
		case len(f) == 4 && f[0] == "l":
			i, ok := crashRunIndex(f[1])
			fence, err1 := strconv.ParseUint(f[2], 10, 64)
			until, err2 := strconv.ParseInt(f[3], 10, 64)
			if !ok || err1 != nil || err2 != nil {
				problems = append(problems, "unreadable line "+line)
				continue
			}
			st.leases[i] = crashLeaseAck{fence, until}
		default:
			problems = append(problems, "the writer printed "+strconv.Quote(line))
			continue
		}
		st.acks++
	}
	return inserts, problems
}

// checkCounter checks counter i: it holds the last acknowledged value A,
// or A+1 (ahead). It removes the row from stored.
func (st *crashState) checkCounter(i int, stored map[string]string) (problem string, ahead bool) {
	key := crashCounterKey(i)
	want := st.counters[i]
	v, found := stored[key]
	delete(stored, key)
	var got uint64
	if found {
		var err error
		if got, err = strconv.ParseUint(v, 10, 64); err != nil {
			return fmt.Sprintf("counter %s holds %q, not a number", key, v), false
		}
	}
	switch {
	case got == want && (found || want == 0):
		return "", false
	case got == want+1:
		st.counters[i] = got
		return "", true
	}
	return fmt.Sprintf("counter %s: acknowledged %d, but the store holds %q (found %v)", key, want, v, found), false
}

// checkLease checks run i's lease row: it decodes, names the writer, and
// holds the last acknowledged fence and expiry, or one write more (fence+1,
// or a later expiry at the same fence). It removes the row from stored.
func (st *crashState) checkLease(ctx context.Context, store runlease.Store, i int, stored map[string]string) (problem string, ahead bool) {
	run := crashRunID(i)
	delete(stored, runlease.LeasePrefix+run)
	want := st.leases[i]
	info, err := runlease.Peek(ctx, store, run)
	if err != nil {
		return fmt.Sprintf("lease %s: %v", run, err), false
	}
	if !info.Found {
		if want.fence != 0 {
			return fmt.Sprintf("lease %s: acknowledged fence %d, but the row is gone", run, want.fence), false
		}
		return "", false
	}
	got := crashLeaseAck{info.Fence, info.Until.UnixMilli()}
	switch {
	case info.Holder != crashHolder:
		return fmt.Sprintf("lease %s is held by %q", run, info.Holder), false
	case got == want:
		return "", false
	case got.fence == want.fence+1, got.fence == want.fence && got.until > want.until:
		st.leases[i] = got
		return "", true
	}
	return fmt.Sprintf("lease %s: acknowledged %+v, but the store holds %+v", run, want, got), false
}

func crashCounterIndex(key string) (int, bool) {
	for i := range crashCounters {
		if key == crashCounterKey(i) {
			return i, true
		}
	}
	return 0, false
}

func crashRunIndex(run string) (int, bool) {
	for i := range crashRuns {
		if run == crashRunID(i) {
			return i, true
		}
	}
	return 0, false
}

// TestCrashCheckCatchesLostAcknowledgedWrites runs the SQLite crash test
// with a writer whose store acknowledges writes before making them (it
// buffers them and writes them out every 16), and requires the check to
// find the acknowledged writes the kills lost: proof that it can fail.
func TestCrashCheckCatchesLostAcknowledgedWrites(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	problems, st := crashRun(t, crashSQLite(t), 10, "lazy", crashMaxDelay/2)
	require.NotEmpty(t, problems, "the check passed a store that loses acknowledged writes: %s", st)
	t.Logf("%d problems found, as there must be; the first: %s", len(problems), problems[0])
}

// TestCrashCheckCatchesCorruptAndStrayRows feeds the check a store with a
// lease row that does not parse, a counter behind its acknowledgement and a
// row the writer never writes.
func TestCrashCheckCatchesCorruptAndStrayRows(t *testing.T) {
	t.Parallel()
	s, err := runlease.OpenSQLite(":memory:")
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	put := func(k, v string) {
		ok, err := s.MetaCAS(t.Context(), k, nil, v)
		require.NoError(t, err)
		require.True(t, ok)
	}
	put(runlease.LeasePrefix+crashRunID(0), `{"holder":"crash#writer","fence":`)
	put(crashCounterKey(1), "4")
	put("stray", "x")
	rows, err := s.MetaScan(t.Context(), "")
	require.NoError(t, err)
	st := newCrashState()
	problems := st.check(t.Context(), s, 0, []string{"c ctr:1 6"}, rows)
	text := strings.Join(problems, "\n")
	assert.Contains(t, text, runlease.CodeCorruptRow)
	assert.Contains(t, text, "counter ctr:1: acknowledged 6")
	assert.Contains(t, text, "stray row stray")
}

// lazyStore is broken on purpose: it acknowledges every write at once,
// keeps it in memory, and writes the buffer out every 16 writes, so a crash
// loses writes it acknowledged. Reads see the buffer, so its writer notices
// nothing.
type lazyStore struct {
	runlease.Store
	mu      sync.Mutex
	pending map[string]*string // nil: a buffered delete
	writes  int
}

func newLazyStore(s runlease.Store) *lazyStore {
	return &lazyStore{Store: s, pending: map[string]*string{}}
}

func (s *lazyStore) MetaGet(ctx context.Context, key string) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(ctx, key)
}

func (s *lazyStore) get(ctx context.Context, key string) (string, bool, error) {
	if v, ok := s.pending[key]; ok {
		if v == nil {
			return "", false, nil
		}
		return *v, true, nil
	}
	return s.Store.MetaGet(ctx, key)
}

func (s *lazyStore) MetaCAS(ctx context.Context, key string, expected *string, value string) (bool, error) {
	return s.write(ctx, key, expected, &value)
}

func (s *lazyStore) MetaDelete(ctx context.Context, key, expected string) (bool, error) {
	return s.write(ctx, key, &expected, nil)
}

func (s *lazyStore) write(ctx context.Context, key string, expected, value *string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, found, err := s.get(ctx, key)
	if err != nil || found != (expected != nil) || (found && v != *expected) {
		return false, err
	}
	s.pending[key] = value
	if s.writes++; s.writes%16 != 0 {
		return true, nil
	}
	ops := make([]runlease.Op, 0, len(s.pending))
	for k, v := range s.pending {
		if v == nil {
			ops = append(ops, runlease.Delete(k))
		} else {
			ops = append(ops, runlease.Put(k, *v))
		}
	}
	clear(s.pending)
	return s.Store.(runlease.Batcher).MetaBatch(ctx, nil, ops)
}
