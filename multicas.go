package runlease

import (
	"context"
	"slices"
	"time"
)

// MultiCASer is an optional capability of a Store: many independent
// conditional writes in one call, each applied or not on its own, as MetaCAS
// would. A [Renewer] uses it to renew many leases in one round trip (one
// statement on Postgres, one transaction on SQLite), so that one process can
// keep a hundred thousand leases alive.
type MultiCASer interface {
	// MetaCASMany performs every write in writes and reports, for each,
	// whether it applied. It is not atomic as a whole: some writes may apply
	// and others not. Writes with invalid keys or values, two writes of one
	// key, or more than [MaxMultiCAS] writes are refused with
	// [ErrInvalidArgument] before anything is sent. A fault leaves every
	// write's outcome unknown or not applied, as the error says.
	MetaCASMany(ctx context.Context, writes []CASWrite) (swapped []bool, err error)
}

// MaxMultiCAS is the most writes one MetaCASMany call may take.
const MaxMultiCAS = 1024

// CASWrite is one write of [MultiCASer.MetaCASMany]: Value is written at Key
// if Key holds exactly *Expected, or, when Expected is nil, if Key is absent.
type CASWrite struct {
	Key      string
	Expected *string
	Value    string
}

// CheckCASMany returns an [ErrInvalidArgument] error when writes break the
// rules of [MultiCASer.MetaCASMany], and nil otherwise.
func CheckCASMany(writes []CASWrite) error {
	if len(writes) > MaxMultiCAS {
		return invalidArg("writes", "%d writes; the limit is %d", len(writes), MaxMultiCAS)
	}
	keys := make([]string, len(writes))
	for i, w := range writes {
		if err := CheckKey(w.Key); err != nil {
			return err
		}
		if err := CheckValue(w.Value); err != nil {
			return err
		}
		keys[i] = w.Key
	}
	slices.Sort(keys)
	for i := 1; i < len(keys); i++ {
		if keys[i] == keys[i-1] {
			return invalidArg("writes", "two writes of key %q", keys[i])
		}
	}
	return nil
}

// pendingRenewal is one lease's part of a batched renewal.
type pendingRenewal struct {
	seen, next string
	until      time.Time
	start      time.Time
	err        error // set when the lease cannot be renewed at all
}

// renewMany renews leases, which must share store m and be distinct, in one
// MetaCASMany call, and returns each lease's outcome. Each lease is locked
// from computing its row to recording the result, as Renew locks it, so
// other calls on a lease wait rather than race the batch. A lease whose
// write did not apply is renewed on its own by Renew afterwards, which finds
// out why; a fault of the whole call leaves each lease as a failed Renew
// would, remembering its row as possibly written.
func renewMany(ctx context.Context, m MultiCASer, leases []*Lease) []error {
	errs := make([]error, len(leases))
	pend := make([]pendingRenewal, len(leases))
	writes := make([]CASWrite, 0, len(leases))
	index := make([]int, 0, len(leases))
	for i, l := range leases {
		pend[i] = l.prepareRenewal()
		if pend[i].err != nil {
			errs[i] = pend[i].err
			continue
		}
		writes = append(writes, CASWrite{Key: l.key, Expected: &pend[i].seen, Value: pend[i].next})
		index = append(index, i)
	}
	if len(writes) == 0 {
		return errs
	}
	swapped, err := m.MetaCASMany(ctx, writes)
	var retry []int
	for j, i := range index {
		l := leases[i]
		switch {
		case err != nil:
			l.renewalFailed(pend[i], err)
			errs[i] = err
		case swapped[j]:
			l.seen, l.unsure = pend[i].next, l.unsure[:0]
			l.until, l.trustFrom = pend[i].until, pend[i].start
		default:
			retry = append(retry, i)
		}
		l.mu.Unlock()
	}
	for _, i := range retry {
		errs[i] = leases[i].Renew(ctx)
	}
	return errs
}

// prepareRenewal locks l and computes the row a renewal would write now.
// It leaves l locked unless it returns an error.
func (l *Lease) prepareRenewal() pendingRenewal {
	l.mu.Lock()
	if l.lost != nil {
		l.mu.Unlock()
		return pendingRenewal{err: l.lost}
	}
	start := time.Now()
	row := leaseRow{Holder: l.holder, Fence: l.fence, UntilMS: l.o.nowMS() + l.o.ttl.Milliseconds()}
	return pendingRenewal{seen: l.seen, next: row.encode(), until: row.until(), start: start}
}

// renewalFailed records a batched renewal whose call failed. l is locked.
func (l *Lease) renewalFailed(p pendingRenewal, err error) {
	if IsOutcomeUnknown(err) && len(l.unsure) < maxUnsure {
		l.unsure = append(l.unsure, p.next)
	}
}
