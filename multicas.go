package runlease

import (
	"context"
	"slices"
)

// MultiCASer is an optional capability of a Store: many independent
// conditional writes in one call, each applied or not on its own, as MetaCAS
// would. A [Renewer] uses it to renew many leases in one round trip (one
// batch of two statements on Postgres, one transaction on SQLite), so that one process can
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
