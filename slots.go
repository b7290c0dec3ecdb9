package runlease

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxSlotLimit is the largest limit a [Scope] may have.
const MaxSlotLimit = 100_000

// Scope is a named pool of concurrency slots with a limit: at most Limit runs
// hold a slot of the scope at once. The limit is configuration of the host
// that claims, not a stored truth: rows keep the reference format, and each
// claimant enforces the limit it is given. Make scopes with [NamedScope],
// [MemScope] or [PrincipalScope]; the zero Scope is invalid.
type Scope struct {
	name  string
	limit int
	check func() error // validates the name part the caller gave
}

// NamedScope returns a scope of the given name and limit. A name is 1 to 128
// ASCII letters, digits, '-', '.' and '/': ':' separates a slot's scope from
// its number, and '%' and '_' are kept out of names so that no tool reading
// the rows with SQL LIKE can confuse two scopes. An invalid name or limit
// makes [ClaimSlots] fail with [ErrInvalidArgument].
func NamedScope(name string, limit int) Scope {
	return Scope{name: name, limit: limit, check: func() error { return checkScopeName(name) }}
}

// MemScope returns the scope covering the whole store, "mem", as the
// reference names it: at most limit runs at once on everything that shares
// the store.
func MemScope(limit int) Scope { return NamedScope("mem", limit) }

// PrincipalScope returns the scope "principal:<principal>": at most limit runs
// of one principal at once. The principal may be any non-empty UTF-8 text
// without NUL.
func PrincipalScope(principal string, limit int) Scope {
	return Scope{name: "principal:" + principal, limit: limit,
		check: func() error { return checkName("principal", principal, 256) }}
}

// Name returns the scope's name, such as "mem" or "principal:alice".
func (s Scope) Name() string { return s.name }

// Limit returns the most runs that may hold a slot of the scope at once.
func (s Scope) Limit() int { return s.limit }

func (s Scope) validate() error {
	if s.check == nil {
		return invalidArg("scope", "zero Scope: use NamedScope, MemScope or PrincipalScope")
	}
	if err := s.check(); err != nil {
		return err
	}
	if s.limit < 1 || s.limit > MaxSlotLimit {
		return invalidArg("limit", "scope %q: limit %d is outside [1, %d]", s.name, s.limit, MaxSlotLimit)
	}
	if len(s.prefix())+len(strconv.Itoa(s.limit)) > MaxKeyLen {
		return invalidArg("scope", "scope %q makes keys longer than %d bytes", s.name, MaxKeyLen)
	}
	return nil
}

func checkScopeName(name string) error {
	if name == "" || len(name) > 128 {
		return invalidArg("scope", "name %q must be 1 to 128 bytes", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '/') {
			return invalidArg("scope", "name %q: %q is not allowed (letters, digits, '-', '.', '/')", name, c)
		}
	}
	return nil
}

// prefix is the key prefix of the scope's slot rows.
func (s Scope) prefix() string { return SlotPrefix + s.name + ":" }

// SlotInfo describes one slot row.
type SlotInfo struct {
	Scope   string    // the scope's name
	Slot    int       // the slot's number, from 0; -1 when the key has none
	RunID   string    // the run holding it
	Until   time.Time // when it expires unless renewed
	Key     string    // the row's key
	Corrupt bool      // the row does not parse: no claimant will overwrite it
}

// Slots is the set of slots one run holds, one per scope, claimed by
// [ClaimSlots]. Renew it beside the run's lease and Release it when the run
// ends or parks. A Slots is safe for concurrent use.
type Slots struct {
	store Store
	runID string
	o     options

	mu   sync.Mutex
	held []heldSlot
}

type heldSlot struct {
	scope string
	slot  int
	key   string
	seen  string // the exact row last written: what renew and release present
	prev  *string
}

// RunID returns the run that holds the slots.
func (s *Slots) RunID() string { return s.runID }

// Held returns the slots still held, in the order of the scopes claimed.
func (s *Slots) Held() []SlotInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SlotInfo, 0, len(s.held))
	for _, h := range s.held {
		row, _ := decodeRow(h.seen)
		out = append(out, SlotInfo{Scope: h.scope, Slot: h.slot, RunID: s.runID, Until: row.until(), Key: h.key})
	}
	return out
}

// Renew extends every held slot to now plus the TTL. A slot that another run
// has taken since (after this run stalled past the TTL) is dropped from the
// set and reported in a [*SlotLostError]; the other slots are still renewed.
// A lost slot need not stop the run: the lease is the authority on who may
// advance it. Storage faults leave the slot held and are returned joined
// with any loss.
func (s *Slots) Renew(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	row := leaseRow{Holder: s.runID, UntilMS: s.o.nowMS() + s.o.ttl.Milliseconds()}.encode()
	var lost []string
	var errs []error
	kept := s.held[:0]
	for _, h := range s.held {
		ok, err := casResolved(ctx, s.store, h.key, &h.seen, row)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !ok:
			lost = append(lost, h.key)
			continue
		default:
			h.seen = row
		}
		kept = append(kept, h)
	}
	s.held = kept
	if len(lost) > 0 {
		errs = append(errs, &SlotLostError{RunID: s.runID, Keys: lost})
	}
	return errors.Join(errs...)
}

// Release gives every held slot back, so a waiting run can start at once.
// Each delete is conditional on the row this run last wrote: a slot another
// run has taken since is left to it. Release is idempotent; on a storage
// fault the slots not yet released stay held and Release may be retried.
func (s *Slots) Release(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	kept := s.held[:0]
	for _, h := range s.held {
		if _, err := deleteResolved(ctx, s.store, h.key, h.seen); err != nil {
			errs = append(errs, err)
			kept = append(kept, h)
		}
	}
	s.held = kept
	return errors.Join(errs...)
}

// parseSlotKey splits a slot row's key into scope and number. The number is
// what follows the last ':', in canonical decimal; ok is false otherwise.
func parseSlotKey(key string) (scope string, slot int, ok bool) {
	rest, found := strings.CutPrefix(key, SlotPrefix)
	i := strings.LastIndexByte(rest, ':')
	if !found || i < 0 {
		return rest, -1, false
	}
	num := rest[i+1:]
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || strconv.Itoa(n) != num {
		return rest[:i], -1, false
	}
	return rest[:i], n, true
}

// Occupancy lists the live slots of every scope in the store, in key order,
// for status surfaces: which run holds which slot until when. Rows that do
// not parse are listed with Corrupt set, because they block their slot. Only
// the [WithClock] option matters to Occupancy: it judges which slots are
// live.
func Occupancy(ctx context.Context, store Store, opts ...Option) ([]SlotInfo, error) {
	o, err := buildOptions(store, opts)
	if err != nil {
		return nil, err
	}
	rows, err := store.MetaScan(ctx, SlotPrefix)
	if err != nil {
		return nil, err
	}
	now := o.nowMS()
	var out []SlotInfo
	for _, r := range rows {
		scope, slot, ok := parseSlotKey(r.Key)
		row, err := decodeRow(r.Value)
		if !ok || err != nil {
			out = append(out, SlotInfo{Scope: scope, Slot: slot, Key: r.Key, Corrupt: true})
			continue
		}
		if row.live(now) {
			out = append(out, SlotInfo{Scope: scope, Slot: slot, RunID: row.Holder, Until: row.until(), Key: r.Key})
		}
	}
	return out, nil
}
