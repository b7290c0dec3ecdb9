package runlease

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
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
	units int          // asked of the scope by a claim, when taken
	taken bool         // Take was called
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

// Limit returns the most units (slots) the scope's runs may hold at once.
func (s Scope) Limit() int { return s.limit }

// Take returns the scope with a claim of units slots rather than one: a run
// that needs 2 of 8 GPUs claims NamedScope("gpu", 8).Take(2). The claim is
// all or nothing, and costs the same round trips whatever units is: every
// slot is written in one batch. Units run from 1 to [MaxUnits] and at most
// the limit; others make the claim fail with [ErrInvalidArgument].
func (s Scope) Take(units int) Scope {
	s.units, s.taken = units, true
	return s
}

// Units returns how many slots a claim asks of the scope: 1 unless [Scope.Take]
// said otherwise.
func (s Scope) Units() int {
	if s.taken {
		return s.units
	}
	return 1
}

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
	if s.taken && (s.units < 1 || s.units > MaxUnits || s.units > s.limit) {
		return invalidArg("units", "scope %q: %d units is outside [1, min(limit %d, %d)]", s.name, s.units, s.limit, MaxUnits)
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
// [ClaimSlots]. Renew it beside the run's lease (or keep it with
// [KeepSlots]) and Release it when the run ends or parks.
//
// Each slot has a trust window like a lease's: it is trusted until the
// start of its last renewal that landed + TTL - margin (a tenth of the TTL
// plus the store clock's uncertainty), and while the clock that judges
// expiry is a margin short of the row's expiry. A slot whose window ran out
// is given up: Held no longer lists it, it is not renewed again, and its
// row expires on its own. A Slots is safe for concurrent use; it has at
// most one write in flight, and its other calls wait for it or for their
// own context.
type Slots struct {
	store  Store
	runID  string
	o      options
	margin time.Duration
	// claimID is written as the fence of every slot row this Slots
	// sends (see newClaimID): a row is this claim's own only if it
	// carries it.
	claimID uint64

	token chan struct{} // held by the one call writing the slots

	// mu guards the fields below. It is a leaf lock, never held across
	// store I/O, hooks or logging.
	mu        sync.Mutex
	held      []*heldSlot
	releasing []*heldSlot // given back, the delete not yet confirmed: never listed
	losses    []string    // keys lost since the last takeLosses, with cause
	cause     error
	// ended is the earliest trust end of the slots given up (lost, run
	// out or released) since the claim; zero while none was. broken says
	// which slot and why: a strict keeper of the claim ends with it, even
	// when the loss was reported to another caller (Renew) first.
	ended  time.Time
	broken *SlotLostError
	// strict lists the keepers that keep these slots with
	// KeepSlotsStrict; a slot given up by a call of the Slots itself ends
	// them, after s.mu is released.
	strict []*Keeper
}

type heldSlot struct {
	scope string
	slot  int
	key   string
	seen  string // the row the next write must present
	// untilMS and trustFrom describe the last write confirmed to have
	// landed; sentMS is the largest until_ms this Slots sent for the slot.
	// lin stamps the rows this Slots sends to the slot's key, so that it
	// never sends equal rows twice, even from claims of the key that
	// failed (see claimRow); doubt holds the until_ms of this Slots'
	// writes of unknown outcome since seen.
	untilMS   int64
	sentMS    int64
	lin       *lineage
	doubt     []int64
	trustFrom time.Time
	prev      *string // the row before the claim, for a rollback
	// leftover says prev was a row of the run that this process
	// remembered as trusted by no Slots (slots_orphans.go) when the claim
	// wrote over it: a rollback that puts it back remembers it again.
	leftover bool
}

func newSlots(store Store, runID string, o options) *Slots {
	return &Slots{store: store, runID: runID, o: o, margin: o.ttl/10 + o.uncertainty,
		claimID: newClaimID(), token: make(chan struct{}, 1)}
}

// newClaimID returns a random number in [1, 2^63), the claim id that a
// Slots writes in the fence field of each of its slot rows. Slot rows name
// the run, and any number of claims of one run, in this process and in
// others, may write rows of the same slot, TTL and millisecond: the claim
// id tells them apart, so a row read back is this claim's own only when it
// carries this claim's id (two claims drawing one id among 2^63 are left
// to chance). The reference writes 0 there and reads nothing from it, so
// rows stay compatible; a row with fence 0 (the reference's, or an older
// version's) is no claim's own by id. It stays below 2^63 for the readers
// of the rows that hold integers in signed 64 bits.
func newClaimID() uint64 {
	for {
		if id := rand.Uint64() >> 1; id != 0 {
			return id
		}
	}
}

// row returns the slot row this Slots sends with until_ms untilMS.
func (s *Slots) row(untilMS int64) string {
	return leaseRow{Holder: s.runID, Fence: s.claimID, UntilMS: untilMS}.encode()
}

// RunID returns the run that holds the slots.
func (s *Slots) RunID() string { return s.runID }

// TTL returns how long each claim or renewal holds the slots.
func (s *Slots) TTL() time.Duration { return s.o.ttl }

// Held returns the slots still held and trusted, in the order of the scopes
// claimed. A slot lost to another run, or whose trust window ran out, is
// never listed.
func (s *Slots) Held() []SlotInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(time.Now())
	out := make([]SlotInfo, 0, len(s.held))
	for _, h := range s.held {
		out = append(out, SlotInfo{Scope: h.scope, Slot: h.slot, RunID: s.runID,
			Until: time.UnixMilli(h.untilMS).UTC(), Key: h.key})
	}
	return out
}

// TrustedUntil returns when, by this process's monotonic clock, the run
// stops trusting the slots of its claim unless a renewal succeeds first:
// the earliest trust window of the slots still held, and never later than
// the moment any slot of the claim was lost, ran out or was released. It
// is the zero Time when the claim holds nothing.
func (s *Slots) TrustedUntil() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, end, any := s.keptStateLocked(time.Now())
	if !s.ended.IsZero() && (!any || s.ended.Before(end)) {
		return s.ended
	}
	return end
}

// endTrustLocked records that h is given up with cause, its trust window
// ending at the latest now. s.mu is held.
func (s *Slots) endTrustLocked(h *heldSlot, now time.Time, cause error) {
	end := earliest(s.trustEnd(h, now, s.o.nowMS()), now)
	if s.ended.IsZero() || end.Before(s.ended) {
		s.ended = end
	}
	if s.broken == nil {
		s.broken = &SlotLostError{RunID: s.runID, Keys: []string{h.key}, Cause: cause}
	}
}

// brokenErr returns why the claim stopped being whole (the first slot
// lost, run out or released), or nil while every slot of it is held, as of
// the last look at the trust windows (takeLosses, Held, a renewal).
func (s *Slots) brokenErr() *SlotLostError {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.broken
}

// addStrict registers k, which keeps s with KeepSlotsStrict, to be ended
// when a call of s gives a slot up.
func (s *Slots) addStrict(k *Keeper) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.strict = append(s.strict, k)
}

// keepStrict registers k, as addStrict does, for a keeper that takes s
// over while it runs: unless the claim is no longer whole as of now (a slot
// lost, run out or released), when it registers nothing and returns why.
// Called under k's Renewer.mu (Renewer.mu → Slots.mu), so the check and
// the registration are one step for every call of s that gives a slot up.
func (s *Slots) keepStrict(k *Keeper, now time.Time) *SlotLostError {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	if s.broken != nil {
		return s.broken
	}
	s.strict = append(s.strict, k)
	return nil
}

// removeStrict forgets k.
func (s *Slots) removeStrict(k *Keeper) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.Index(s.strict, k); i >= 0 {
		s.strict = slices.Delete(s.strict, i, i+1)
	}
}

// endStrict ends the strict keepers of s, now that the claim is broken.
// s.mu must not be held: ending a keeper takes its Renewer's lock, under
// which a Renewer reads s.
func (s *Slots) endStrict() {
	s.mu.Lock()
	keepers, broken := slices.Clone(s.strict), s.broken
	s.mu.Unlock()
	if broken == nil {
		return
	}
	for _, k := range keepers {
		k.r.end(k, broken)
	}
}

// trustEnd returns when h stops being trusted, by the monotonic clock.
func (s *Slots) trustEnd(h *heldSlot, now time.Time, nowMS int64) time.Time {
	left := time.Duration(h.untilMS-nowMS)*time.Millisecond - s.margin
	return earliest(h.trustFrom.Add(s.o.ttl-s.margin), now.Add(left))
}

// expireLocked gives up the slots whose trust window has run out. s.mu is
// held.
func (s *Slots) expireLocked(now time.Time) {
	nowMS := s.o.nowMS()
	kept := s.held[:0]
	for _, h := range s.held {
		if now.Before(s.trustEnd(h, now, nowMS)) {
			kept = append(kept, h)
		} else {
			// Given up, but maybe still the run's row: Release deletes it,
			// so that the slot frees at once rather than at its expiry.
			s.endTrustLocked(h, now, ErrTrustExpired)
			s.lostLocked(h.key, ErrTrustExpired)
			s.releasing = append(s.releasing, h)
		}
	}
	clear(s.held[len(kept):])
	s.held = kept
}

// lostLocked records the loss of the slot at key. s.mu is held.
func (s *Slots) lostLocked(key string, cause error) {
	if len(s.losses) == 0 || s.cause == cause {
		s.losses, s.cause = append(s.losses, key), cause
		return
	}
	s.losses = append(s.losses, key) // mixed causes: taken over wins
	s.cause = ErrTakenOver
}

// takeLosses returns the slots lost since it was last called, as one
// error, or nil when none were.
func (s *Slots) takeLosses(now time.Time) *SlotLostError {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	if len(s.losses) == 0 {
		return nil
	}
	e := &SlotLostError{RunID: s.runID, Keys: s.losses, Cause: s.cause}
	s.losses, s.cause = nil, nil
	return e
}

// keptState returns, for a Keeper, when the least recently renewed slot was
// renewed, when the first trust window ends, and whether any slot is held.
func (s *Slots) keptState(now time.Time) (renewedAt, trustEnd time.Time, any bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keptStateLocked(now)
}

// keptStateLocked is keptState with s.mu held.
func (s *Slots) keptStateLocked(now time.Time) (renewedAt, trustEnd time.Time, any bool) {
	nowMS := s.o.nowMS()
	for i, h := range s.held {
		end := s.trustEnd(h, now, nowMS)
		if i == 0 || h.trustFrom.Before(renewedAt) {
			renewedAt = h.trustFrom
		}
		if i == 0 || end.Before(trustEnd) {
			trustEnd = end
		}
	}
	return renewedAt, trustEnd, len(s.held) > 0
}

// Renew extends every held slot to now plus the TTL. A slot that another run
// has taken since (after this run stalled past the TTL), or whose trust
// window ran out, is dropped from the set and reported in a
// [*SlotLostError]; the other slots are still renewed. A lost slot need not
// stop the run: the lease is the authority on who may advance it. A storage
// fault leaves its slot held and is returned joined with any loss; as for a
// lease, a row of the run's own found in place of the one expected (a write
// whose reply was lost) is adopted, never reported as a loss.
func (s *Slots) Renew(ctx context.Context) error {
	err := s.renewKept(ctx)
	if lost := s.takeLosses(time.Now()); lost != nil {
		return errors.Join(err, lost)
	}
	return err
}

// renewKept renews every held slot, recording losses for takeLosses, and
// returns the faults met.
func (s *Slots) renewKept(ctx context.Context) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	s.mu.Lock()
	s.expireLocked(time.Now())
	held := slices.Clone(s.held)
	s.mu.Unlock()
	var errs []error
	for _, h := range held {
		if err := s.renewOne(ctx, h); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Slots) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return &StorageError{Op: "MetaCAS", Err: err}
	}
	select {
	case s.token <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &StorageError{Op: "MetaCAS", Err: ctx.Err()}
	}
}

func (s *Slots) unlock() { <-s.token }

// renewOne renews h, with the write token held.
func (s *Slots) renewOne(ctx context.Context, h *heldSlot) error {
	for adopted := 0; ; adopted++ {
		s.mu.Lock()
		seen := h.seen
		start := time.Now()
		untilMS, _ := h.lin.stamp(s.o.now(), s.o.ttl, h.sentMS)
		h.sentMS = untilMS
		s.mu.Unlock()
		next := s.row(untilMS)
		ok, err := s.store.MetaCAS(ctx, h.key, &seen, next)
		if err != nil && !IsOutcomeUnknown(err) {
			return err
		}
		if err == nil && ok {
			s.confirm(h, next, untilMS, start)
			return nil
		}
		if err != nil {
			s.mu.Lock()
			if h.seen == seen {
				h.doubt = append(h.doubt, untilMS)
			}
			s.mu.Unlock()
			h.lin.pin(s.o.now(), untilMS) // it may land yet
		}
		cur, found, rerr := s.store.MetaGet(ctx, h.key)
		switch {
		case rerr != nil && err != nil:
			return err
		case rerr != nil:
			return rerr
		case found && cur == next && err != nil:
			// Landed: no other Slots sends these bytes (its claim id
			// differs) and this one sends them once (h.lin).
			s.confirm(h, next, untilMS, start)
			return nil
		case err != nil && found && cur == seen:
			return err // not applied, or not yet
		}
		if row, derr := decodeRow(cur); found && derr == nil && s.sentByThis(h, row) && adopted < maxAdopt {
			s.mu.Lock()
			h.seen, h.doubt = cur, h.doubt[:0] // an earlier write of this Slots landed after all
			s.mu.Unlock()
			continue
		}
		s.drop(h, ErrTakenOver)
		return nil
	}
}

// sentByThis reports whether row, found at h's key, is a write of this
// Slots whose reply was lost: the run's own row, with this claim's id, and
// stamped as one of its writes in doubt. Another Slots of the same run (a
// claim over the slot after this one's row expired, or a replaced
// driver's, in this process or another) writes rows that name the run
// too, and may stamp them alike (the same TTL and millisecond); its claim
// id differs, so its row is not adopted, and its slot is not deleted. A
// row with fence 0 (the reference's) is never this claim's.
func (s *Slots) sentByThis(h *heldSlot, row leaseRow) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return row.Holder == s.runID && row.Fence == s.claimID && slices.Contains(h.doubt, row.UntilMS)
}

func (s *Slots) confirm(h *heldSlot, next string, untilMS int64, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h.seen, h.untilMS, h.trustFrom, h.doubt = next, untilMS, start, h.doubt[:0]
}

// drop gives h up as lost with cause.
func (s *Slots) drop(h *heldSlot, cause error) {
	s.mu.Lock()
	i := slices.Index(s.held, h)
	if i >= 0 {
		s.held = slices.Delete(s.held, i, i+1)
		s.endTrustLocked(h, time.Now(), cause)
		s.lostLocked(h.key, cause)
	}
	s.mu.Unlock()
	if i >= 0 {
		s.endStrict()
	}
}

// Release gives every held slot back, so a waiting run can start at once.
// Each delete is conditional on the row this Slots last wrote (or a row of
// its own found in its place): a slot another run, or another claim of the
// run, has taken since is left to it. It also deletes the run's rows that
// no Slots of this process trusts: those left by a claim of the run that
// failed, or by a Release that failed. Release is idempotent; on a storage
// fault it may be retried. It waits for a write of the slots in flight, or
// for ctx.
//
// A slot being released is no longer held, whatever the outcome: Held stops
// listing it at once, and a fault only leaves it to Release again (or to
// expire).
func (s *Slots) Release(ctx context.Context) error {
	s.mu.Lock()
	now := time.Now()
	for _, h := range s.held {
		s.endTrustLocked(h, now, ErrReleased)
	}
	s.releasing = append(s.releasing, s.held...)
	s.held = nil
	s.mu.Unlock()
	s.endStrict()
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	s.mu.Lock()
	releasing := slices.Clone(s.releasing)
	s.mu.Unlock()
	var errs []error
	for _, h := range releasing {
		if err := s.releaseOne(ctx, h); err != nil {
			// Given up, whatever Release does next: no Slots trusts the
			// row, which any Release of the run may delete.
			s.gaveUp([]*heldSlot{h})
			errs = append(errs, err)
			continue
		}
		s.mu.Lock()
		if i := slices.Index(s.releasing, h); i >= 0 {
			s.releasing = slices.Delete(s.releasing, i, i+1)
		}
		seen := h.seen
		s.mu.Unlock()
		forgetOrphan(s.store, s.runID, h.key, seen)
	}
	// The run's rows that no Slots of this process trusts go too.
	errs = append(errs, s.releaseOrphans(ctx))
	return errors.Join(errs...)
}

// releaseOne deletes h's row if it is still the run's own.
func (s *Slots) releaseOne(ctx context.Context, h *heldSlot) error {
	s.mu.Lock()
	seen := h.seen
	s.mu.Unlock()
	for adopted := 0; ; adopted++ {
		ok, err := s.deleteWaking(ctx, h, seen)
		if err != nil && !IsOutcomeUnknown(err) {
			return err
		}
		if ok {
			return nil
		}
		cur, found, rerr := s.store.MetaGet(ctx, h.key)
		switch {
		case rerr != nil && err != nil:
			return err
		case rerr != nil:
			return rerr
		case !found:
			return nil
		case err != nil && cur == seen:
			return err
		}
		if row, derr := decodeRow(cur); derr != nil || !s.sentByThis(h, row) || adopted == maxAdopt {
			return nil // another run's now, or another Slots' of this run: leave it
		}
		seen = cur
	}
}

// deleteWaking deletes h's row if it holds seen, waking the waiters of its
// scope's queue when the store can: a released slot may admit one of them.
func (s *Slots) deleteWaking(ctx context.Context, h *heldSlot, seen string) (bool, error) {
	if d, ok := s.store.(DeleteReadNotifier); ok {
		if r := handingRoom(s.store, h.scope); r != nil {
			// Waiters of this process wait for the scope: they are
			// handed the read that follows the delete.
			return r.handOver(ctx, d, h.key, seen)
		}
	}
	if n, ok := s.store.(DeleteNotifier); ok {
		return n.MetaDeleteNotify(ctx, h.key, seen, queueBell(h.scope))
	}
	return s.store.MetaDelete(ctx, h.key, seen)
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
// not parse are listed with Corrupt set, because they block their slot.
// Occupancy takes one option, [WithClock], which judges which slots are
// live.
func Occupancy(ctx context.Context, store Store, opts ...Option) ([]SlotInfo, error) {
	o, err := buildOptions(store, opts, optsRead, "Occupancy")
	if err != nil {
		return nil, err
	}
	rows, err := store.MetaScan(ctx, SlotPrefix)
	if err != nil {
		return nil, err
	}
	now := o.nowMS()
	out := make([]SlotInfo, 0, len(rows))
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
	if len(out) == 0 {
		return nil, nil // nil, not empty, when no slot is live
	}
	return out, nil
}
