package runlease

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Error codes. Every error this package returns carries one of these codes,
// and its message begins with it, so logs and operators can match on a stable
// string. Use the sentinels below with [errors.Is]; the typed errors carry
// details for [errors.As].
//
//	RUN-E001  invalid argument: the call was refused before anything was written
//	RUN-E002  corrupt row: a stored row does not parse; nothing was overwritten
//	RUN-E003  fence exhausted: the run's fence is at its maximum and cannot grow
//	RUN-E010  store locked: another opener holds the embedded store's writer lock
//	RUN-E011  storage fault: the store failed; see [StorageError.Unknown]
//	RUN-E012  schema mismatch: an existing table does not have the expected shape
//	RUN-E013  store closed: the store was used after Close
//	RUN-E021  lease lost: another holder has (or had) the lease
//	RUN-E022  concurrency limit: every slot of a scope is held
//	RUN-E023  slot lost: a held slot was taken by another run, or not renewed within its trust window
//	RUN-E024  keeper stopped: a Keeper was stopped, not lost (see [ErrKeeperStopped])
//	RUN-E025  condition failed: a fenced write's condition on the caller's keys did not hold; nothing was written
//	RUN-E026  already queued: another call waits in the queue for the same run's slots
const (
	CodeInvalidArgument  = "RUN-E001"
	CodeCorruptRow       = "RUN-E002"
	CodeFenceExhausted   = "RUN-E003"
	CodeStoreLocked      = "RUN-E010"
	CodeStorage          = "RUN-E011"
	CodeSchemaMismatch   = "RUN-E012"
	CodeStoreClosed      = "RUN-E013"
	CodeLeaseLost        = "RUN-E021"
	CodeConcurrencyLimit = "RUN-E022"
	CodeSlotLost         = "RUN-E023"
	CodeConditionFailed  = "RUN-E025"
	CodeAlreadyQueued    = "RUN-E026"
)

// Sentinel errors, one per code. Every error returned by this package matches
// exactly one of them with [errors.Is] (a storage fault caused by a context
// also matches the context's error).
var (
	ErrInvalidArgument  error = &codedError{CodeInvalidArgument, "invalid argument"}
	ErrCorruptRow       error = &codedError{CodeCorruptRow, "corrupt row"}
	ErrFenceExhausted   error = &codedError{CodeFenceExhausted, "fence exhausted"}
	ErrStoreLocked      error = &codedError{CodeStoreLocked, "store locked by another opener"}
	ErrStorage          error = &codedError{CodeStorage, "storage fault"}
	ErrSchemaMismatch   error = &codedError{CodeSchemaMismatch, "schema mismatch"}
	ErrStoreClosed      error = &codedError{CodeStoreClosed, "store closed"}
	ErrLeaseLost        error = &codedError{CodeLeaseLost, "lease lost"}
	ErrConcurrencyLimit error = &codedError{CodeConcurrencyLimit, "concurrency limit reached"}
	ErrSlotLost         error = &codedError{CodeSlotLost, "slot lost"}
	ErrConditionFailed  error = &codedError{CodeConditionFailed, "condition failed: a condition of the fenced write did not hold; nothing was written and the lease was not renewed"}
	ErrAlreadyQueued    error = &codedError{CodeAlreadyQueued, "already queued: another call waits for the run's slots"}

	// ErrOutcomeUnknown matches a [StorageError] whose write may or may not
	// have been applied (a timeout or a reset after the request was sent).
	// Such an error also matches [ErrStorage].
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// codedError is the type of the sentinels.
type codedError struct {
	code string
	text string
}

func (e *codedError) Error() string { return e.code + ": " + e.text }

// Code returns the error's stable code, such as "RUN-E021".
func (e *codedError) Code() string { return e.code }

// Code returns the stable code ("RUN-Exxx") of the first error in err's chain
// that has one, or "" when none does.
func Code(err error) string {
	var c interface{ Code() string }
	if errors.As(err, &c) {
		return c.Code()
	}
	return ""
}

// ArgumentError reports an argument refused before anything was written.
// It matches [ErrInvalidArgument].
type ArgumentError struct {
	Arg    string // which argument: "runID", "key", "ttl", …
	Reason string // why it was refused
}

func (e *ArgumentError) Error() string {
	return CodeInvalidArgument + ": invalid " + e.Arg + ": " + e.Reason
}

// Code returns [CodeInvalidArgument].
func (e *ArgumentError) Code() string         { return CodeInvalidArgument }
func (e *ArgumentError) Is(target error) bool { return target == ErrInvalidArgument }

func invalidArg(arg, format string, a ...any) error {
	return &ArgumentError{Arg: arg, Reason: fmt.Sprintf(format, a...)}
}

// CorruptRowError reports a stored row that does not parse. The library
// never overwrites such a row: an operator must look at it. It matches
// [ErrCorruptRow].
type CorruptRowError struct {
	Key   string
	Value string // the stored text, cut to 200 bytes
	Err   error  // the parse error
}

func (e *CorruptRowError) Error() string {
	return fmt.Sprintf("%s: corrupt row at %q: %v (stored: %q)", CodeCorruptRow, e.Key, e.Err, e.Value)
}

// Code returns [CodeCorruptRow].
func (e *CorruptRowError) Code() string         { return CodeCorruptRow }
func (e *CorruptRowError) Is(target error) bool { return target == ErrCorruptRow }
func (e *CorruptRowError) Unwrap() error        { return e.Err }

func corruptRow(key, value string, err error) error {
	if len(value) > 200 {
		value = value[:200]
	}
	return &CorruptRowError{Key: key, Value: value, Err: err}
}

// StorageError reports a fault of the store. Unknown tells whether the write
// may have been applied: false means the call certainly changed nothing,
// true means it may have (the library resolves that by re-reading where it
// can). Retryable marks faults that a retry is expected to clear, such as a
// serialization failure. It matches [ErrStorage], and [ErrOutcomeUnknown]
// when Unknown is set; Unwrap gives the driver's error, so [errors.As] reaches
// it and [errors.Is] matches a context's error that caused the fault.
type StorageError struct {
	Op        string // the Store method, such as "MetaCAS"
	Key       string // the key or prefix involved, if any
	Unknown   bool
	Retryable bool
	Err       error
}

func (e *StorageError) Error() string {
	outcome := "not applied"
	if e.Unknown {
		outcome = "outcome unknown"
	}
	key := ""
	if e.Key != "" {
		key = " " + strconv.Quote(e.Key)
	}
	return fmt.Sprintf("%s: storage fault in %s%s (%s): %v", CodeStorage, e.Op, key, outcome, e.Err)
}

// Code returns [CodeStorage].
func (e *StorageError) Code() string { return CodeStorage }
func (e *StorageError) Is(target error) bool {
	return target == ErrStorage || (e.Unknown && target == ErrOutcomeUnknown)
}
func (e *StorageError) Unwrap() error { return e.Err }

// IsOutcomeUnknown reports whether err is a storage fault after which a write
// may or may not have been applied.
func IsOutcomeUnknown(err error) bool { return errors.Is(err, ErrOutcomeUnknown) }

// StoreLockedError reports that another opener, in this process or another,
// holds the writer lock of an embedded store. It matches [ErrStoreLocked].
type StoreLockedError struct {
	Path string
}

func (e *StoreLockedError) Error() string {
	return fmt.Sprintf("%s: store %q is open in another process or handle; "+
		"an embedded store has one writer (use a shared Postgres store for several nodes)", CodeStoreLocked, e.Path)
}

// Code returns [CodeStoreLocked].
func (e *StoreLockedError) Code() string         { return CodeStoreLocked }
func (e *StoreLockedError) Is(target error) bool { return target == ErrStoreLocked }

// Why a lease was lost. Each is the Cause of a [*LeaseLostError], and an
// error with that cause matches both the cause and [ErrLeaseLost] with
// [errors.Is].
var (
	// ErrTakenOver: another holder holds the lease, or held it since this
	// lease last wrote (Holder and Fence name it). Acquire reports it for a
	// live lease of another holder, and a [SlotLostError] for a slot another
	// run took.
	ErrTakenOver = errors.New("held by another holder")
	// ErrRowChanged: the lease row changed under this lease in a way that
	// names no holder (it was deleted, or no longer parses).
	ErrRowChanged = errors.New("lease row changed by another writer")
	// ErrReleased: the lease was released, by this holder or by an operator.
	ErrReleased = errors.New("lease released")
	// ErrTrustExpired: no renewal succeeded before the holder's trust window
	// (of the lease, or of a kept slot) ran out (the store was unreachable or slow), so the holder must stop
	// even though the row may still name it: a contender may take over as
	// soon as the lease expires. Err holds the last storage fault.
	ErrTrustExpired = errors.New("no renewal succeeded within the trust window")
)

// LeaseLostError reports that a lease is held by someone else, or was. It is
// returned by Acquire when a live lease is held elsewhere, by Renew and
// fenced writes once another driver has written the row, and by a [Keeper]
// whose lease is lost. Cause says why (one of [ErrTakenOver],
// [ErrRowChanged], [ErrReleased], [ErrTrustExpired]); Holder, Fence and
// Until describe the row found, when it was read (Holder is empty when the
// lease was released). It matches [ErrLeaseLost] and its Cause.
type LeaseLostError struct {
	RunID  string
	Cause  error
	Holder string    // the current holder, when known
	Fence  uint64    // the current fence, when known
	Until  time.Time // the current expiry, when known: when takeover becomes possible
	// Err is the underlying fault: the last one for ErrTrustExpired, and
	// for a fenced write whose outcome is unknown the fault that left it so
	// (the error then also matches ErrOutcomeUnknown).
	Err error

	refused bool // Acquire's refusal: the caller never held the lease
}

func (e *LeaseLostError) Error() string {
	msg := fmt.Sprintf("%s: lease on run %q lost: %v", CodeLeaseLost, e.RunID, e.Cause)
	if e.refused {
		msg = fmt.Sprintf("%s: run %q is held by another holder", CodeLeaseLost, e.RunID)
	}
	if e.Holder != "" {
		msg += fmt.Sprintf(" (holder %q, fence %d, until %s)", e.Holder, e.Fence,
			e.Until.UTC().Format(time.RFC3339Nano))
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Code returns [CodeLeaseLost].
func (e *LeaseLostError) Code() string { return CodeLeaseLost }
func (e *LeaseLostError) Is(target error) bool {
	return target == ErrLeaseLost || (target != nil && target == e.Cause)
}
func (e *LeaseLostError) Unwrap() error { return e.Err }

// ConcurrencyLimitError reports that every slot of a scope was held. It
// matches [ErrConcurrencyLimit].
type ConcurrencyLimitError struct {
	Scope string // the scope's name, such as "mem" or "principal:alice"
	Limit int
	Units int // the units the claim asked of the scope
	Held  int // slots in use when read: live slot rows, the run's own included, and rows that do not parse
	// Ahead is how many live waiters of the scope's queue rank ahead of the
	// claim, and Reserved the units they wait for. When Held+Units fits the
	// limit, the claim was refused for their sake only: the run would have
	// to queue ([ClaimSlotsWait]) to be admitted after them.
	Ahead    int
	Reserved int
}

func (e *ConcurrencyLimitError) Error() string {
	msg := fmt.Sprintf("%s: concurrency limit reached in scope %q (limit %d", CodeConcurrencyLimit, e.Scope, e.Limit)
	if e.Units > 0 {
		msg += fmt.Sprintf(", %d held, %d asked", e.Held, e.Units)
	}
	if e.Ahead > 0 {
		msg += fmt.Sprintf(", %d waiting ahead for %d", e.Ahead, e.Reserved)
	}
	msg += ")"
	if e.Ahead > 0 && e.Held+e.Units <= e.Limit {
		msg += ": live waiters rank ahead; the run would have to queue"
	}
	return msg
}

// Code returns [CodeConcurrencyLimit].
func (e *ConcurrencyLimitError) Code() string         { return CodeConcurrencyLimit }
func (e *ConcurrencyLimitError) Is(target error) bool { return target == ErrConcurrencyLimit }

// SlotLostError reports held slots that the run no longer holds: another run
// took them (Cause [ErrTakenOver]: the row changed after this run stalled
// past the TTL), or no renewal of them succeeded within their trust window
// (Cause [ErrTrustExpired]: the store was unreachable or slow, so the run
// must assume a contender may take them). It matches [ErrSlotLost] and its
// Cause.
type SlotLostError struct {
	RunID string
	Keys  []string // the slot rows lost
	Cause error    // ErrTakenOver or ErrTrustExpired
}

func (e *SlotLostError) Error() string {
	cause := ErrTakenOver
	if e.Cause != nil {
		cause = e.Cause
	}
	return fmt.Sprintf("%s: run %q lost %d slot(s): %v: %q", CodeSlotLost, e.RunID, len(e.Keys), cause, e.Keys)
}

// Code returns [CodeSlotLost].
func (e *SlotLostError) Code() string { return CodeSlotLost }
func (e *SlotLostError) Is(target error) bool {
	return target == ErrSlotLost || (target != nil && target == e.Cause)
}

// AlreadyQueuedError reports that another call of [ClaimSlotsWait] (or a
// driver of the run with the same or a newer fence) waits in a scope's
// queue for the same run: a run waits once. It matches [ErrAlreadyQueued].
// Its entry expires after its TTL when that call's process is gone.
type AlreadyQueuedError struct {
	RunID string
	Scope string
}

func (e *AlreadyQueuedError) Error() string {
	return fmt.Sprintf("%s: run %q already waits in the queue of scope %q", CodeAlreadyQueued, e.RunID, e.Scope)
}

// Code returns [CodeAlreadyQueued].
func (e *AlreadyQueuedError) Code() string         { return CodeAlreadyQueued }
func (e *AlreadyQueuedError) Is(target error) bool { return target == ErrAlreadyQueued }
