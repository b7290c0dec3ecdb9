package runlease

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"
)

// Size limits every Store enforces, the same on every backend, so a key that
// works on the embedded store also works on Postgres.
const (
	// MaxKeyLen is the longest key, in bytes, a Store accepts.
	MaxKeyLen = 1024
	// MaxValueLen is the longest value, in bytes, a Store accepts.
	MaxValueLen = 1 << 20
)

// Row is one key and its value, as returned by [Store.MetaScan].
type Row struct {
	Key   string
	Value string
}

// Store is a table of text keys and text values with compare-and-swap. It
// knows nothing of leases: [Acquire], [ClaimSlots] and the rest of this
// package keep all policy above it, and make every write conditional on the
// exact value they last read, so a stale writer never overwrites a newer row.
//
// Implementations must satisfy this contract; the storetest package checks
// it, and a third-party Store should run storetest.Run in its own tests.
//
// Stability. Store, [Row], [Clock] and the optional capabilities declared
// beside them ([Batcher], [MultiCASer], [MultiScanner], [RangeReader],
// [Notifier], [RowNotifier], [DeleteNotifier], [DeleteReadNotifier],
// [ClosableStore] and [ClosedReporter]), with their argument types, limits and Check* helpers
// and [ForgetStore], are the stable contract between this package and a
// store: within a major version none of them gains a method or changes
// meaning, and a Check* helper never refuses what the contract allows.
// The library detects each optional capability with a type assertion on
// the Store it is given, so a store implements only those it can; a minor
// version may add new optional capabilities, which a store that lacks them
// does without, at the cost their documentation names. A store must keep
// passing storetest.Run, which also checks the optional capabilities the
// store implements, with every version of this package it supports; a
// minor version's storetest may check more of the same contract, never a
// new one. What the built-in stores export beyond these interfaces is
// theirs, not part of the contract.
//
// Keys and values. Keys are non-empty UTF-8 text of at most [MaxKeyLen]
// bytes; values are UTF-8 text of at most [MaxValueLen] bytes; neither may
// contain NUL. A Store must refuse anything else before touching storage,
// with an error matching [ErrInvalidArgument] ([CheckKey] and [CheckValue]
// do this). A Store must return values byte for byte as written: no
// normalization, no re-encoding (so never store them as JSON documents).
//
// Results. Losing a race is not an error: a conditional write whose condition
// does not hold returns false and a nil error. An error means a fault, and
// every fault must be reported as a [*StorageError] (or wrap one) that says
// whether the outcome is unknown: Unknown false means the call certainly
// changed nothing (the connection could not be made, the statement was
// refused); Unknown true means the write may have been applied (a timeout or a
// reset after the request was sent). Callers resolve an unknown outcome by
// reading the key again.
//
// Context. Every method must honour ctx: when it ends before the call is
// sent, the call must fail without effect and the error must match the
// context's error with [errors.Is]. A Store must not keep ctx after the call
// returns.
//
// Concurrency. All methods must be safe for concurrent use by many
// goroutines, and conditional writes must be atomic with respect to each
// other, including writers in other processes that share the same storage.
// Every method must be linearizable: it takes effect at one instant between
// its call and its return.
//
// Identity. A Store value must be comparable with == and equal to itself (a
// pointer always is), and one database should be reached through one Store
// value per process: the rows of one holder and run are stamped apart per
// Store value, and a slot row's holder is its run, so two drivers of one
// run in one process (a driver and its successor) must reach the store
// through one identity. A Store that wraps another (a decorator adding
// metrics, tracing or wake-ups of its own) says so with a method
// Unwrap() Store that returns the store it wraps, and the library then
// treats the two as one store. A value that cannot be compared, or that
// holds a NaN float and so is not equal to itself, is refused with
// [ErrInvalidArgument].
type Store interface {
	// MetaGet returns the value stored at key; found is false when the key is
	// absent.
	MetaGet(ctx context.Context, key string) (value string, found bool, err error)

	// MetaCAS writes value at key if and only if the key holds exactly
	// *expected, or, when expected is nil, if and only if the key is absent.
	// It reports whether the write happened.
	MetaCAS(ctx context.Context, key string, expected *string, value string) (swapped bool, err error)

	// MetaDelete removes key if and only if it holds exactly expected, and
	// reports whether it did.
	MetaDelete(ctx context.Context, key, expected string) (deleted bool, err error)

	// MetaScan returns every row whose key starts with prefix, in ascending
	// byte order of key. The prefix is literal: no character in it is a
	// wildcard. An empty prefix returns every row. A Store should implement
	// it as a range scan from prefix (inclusive) to [PrefixEnd] of prefix
	// (exclusive).
	MetaScan(ctx context.Context, prefix string) ([]Row, error)
}

// Clock is an optional capability of a Store: the clock by which everyone
// sharing the store judges expiry. When a Store implements it, leases and
// slots stamp and judge expiry with it rather than with each node's local
// clock, so nodes whose clocks disagree still agree on who holds a lease.
// ([WithClock] overrides it, for tests.)
type Clock interface {
	// ClockNow returns the store's current time, without I/O, and how far
	// that reading may be from the store's true time. It must be safe for
	// concurrent use and cheap enough to call on every lease operation.
	ClockNow() (now time.Time, uncertainty time.Duration)
}

// CheckKey returns an [ErrInvalidArgument] error when key is not a key a
// Store accepts (empty, longer than [MaxKeyLen], not UTF-8, or holding NUL),
// and nil otherwise. Store implementations call it before touching storage.
func CheckKey(key string) error {
	if key == "" {
		return invalidArg("key", "empty")
	}
	if len(key) > MaxKeyLen {
		return invalidArg("key", "%d bytes long, the limit is %d", len(key), MaxKeyLen)
	}
	return checkText("key", key)
}

// CheckValue returns an [ErrInvalidArgument] error when value is not a value
// a Store accepts (longer than [MaxValueLen], not UTF-8, or holding NUL), and
// nil otherwise.
func CheckValue(value string) error {
	if len(value) > MaxValueLen {
		return invalidArg("value", "%d bytes long, the limit is %d", len(value), MaxValueLen)
	}
	return checkText("value", value)
}

// CheckPrefix returns an [ErrInvalidArgument] error when prefix could never
// start a valid key (too long, not UTF-8, or holding NUL). The empty prefix
// is valid.
func CheckPrefix(prefix string) error {
	if len(prefix) > MaxKeyLen {
		return invalidArg("prefix", "%d bytes long, the limit is %d", len(prefix), MaxKeyLen)
	}
	return checkText("prefix", prefix)
}

func checkText(arg, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return invalidArg(arg, "contains NUL")
	}
	if !utf8.ValidString(s) {
		return invalidArg(arg, "not valid UTF-8")
	}
	return nil
}

// PrefixEnd returns the least string greater than every string that starts
// with prefix, and ok false when there is none (prefix is empty or made only
// of U+10FFFF). Keys with the prefix are exactly those in [prefix, end).
//
// prefix must be valid UTF-8 (see [CheckPrefix]); the result then is valid
// UTF-8 too, so it can be sent as text to any database. For UTF-8, byte
// order and code point order agree, so the range holds for both.
func PrefixEnd(prefix string) (end string, ok bool) {
	for prefix != "" {
		r, size := utf8.DecodeLastRuneInString(prefix)
		prefix = prefix[:len(prefix)-size]
		switch {
		case r == utf8.MaxRune:
			continue // no successor: carry into the previous rune
		case r == 0xD7FF:
			r = 0xE000 // skip the surrogates, which UTF-8 cannot encode
		default:
			r++
		}
		return prefix + string(r), true
	}
	return "", false
}
