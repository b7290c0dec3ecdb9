// Package runlease provides run leases and concurrency slots, so that two
// run drivers never advance the same run and no more than a set number of
// runs execute at once, across the processes and machines that share a
// [Store].
//
// A lease is one row, runlease:<run id>, holding {holder, fence, until_ms}.
// Every write is a compare-and-swap against the exact row last read, so a
// driver that stalls past its TTL and is replaced cannot renew, release or
// write through a fence again: its next call fails with [ErrLeaseLost]
// (RUN-E021), and that is the moment it must stop. The fence grows at every
// acquisition and never goes backwards for a run id, so systems outside
// the store can refuse writes from an older holder.
//
// Expiry is judged by one clock: the store's own when it has one (see
// [Clock]: the Postgres store serves the server's time), else the one given
// with [WithClock], else the local wall clock. A lease is held until its
// until_ms; a row whose until_ms has passed may be taken over by anyone. A
// holder that keeps its lease with a [Keeper] stops trusting it a margin
// before that, by its own monotonic clock and by the store's clock.
//
// The sections below walk a run driver's path: open a store, acquire the
// run's lease, claim slots, keep both alive, write through the lease's
// fence, release. The repository's README and docs/ folder hold the full
// manual. Every error carries a stable code ([CodeInvalidArgument] and the
// other Code constants), which [Code] returns.
//
// # Open a store
//
// [OpenSQLite] opens the embedded default, one SQLite file that one process
// writes; [OpenPostgres] (or [NewPostgres] with a pool you own) a table on
// a Postgres server that every node shares; [Open] either from one string
// such as "sqlite:runs.db" or "postgres://app@db/app". The etcd store is in
// the module github.com/areev/runlease/etcdstore.
//
//	store, err := runlease.OpenSQLite("runs.db")
//	if err != nil { … }
//	defer store.Close()
//
// # Acquire the run's lease
//
// [Acquire] takes the lease of a run id for a holder ([HolderFor] gives one
// unique to the process) or fails with [ErrLeaseLost] while another holder's
// lease is live; [AcquireWait] waits for it to be released or to expire. The
// [Lease] it returns has a fence ([Lease.Fence]) to hand to systems outside
// the store, and is renewed by hand with [Lease.Renew] or in the background
// by a keeper. [WithTTL] sets how long it holds without renewal, between
// [MinTTL] (5 s) and [MaxTTL] (24 h); the default is [DefaultTTL].
//
//	lease, err := runlease.Acquire(ctx, store, "run-42", runlease.HolderFor("billing", ""),
//		runlease.WithTTL(30*time.Second))
//	if errors.Is(err, runlease.ErrLeaseLost) { … another driver has the run … }
//
// # Claim slots
//
// [Lease.ClaimSlots] takes one slot in each [Scope] it names ([NamedScope],
// [MemScope], [PrincipalScope]; [Scope.Take] for several units), all or
// nothing, fenced by the lease, or fails with [ErrConcurrencyLimit]
// (RUN-E022) at a full scope. [Lease.ClaimSlotsWait] waits instead, in a
// queue that admits by priority ([WithPriority]), then by fair share across
// principals ([WithFairShare]), then in queue order; [ExplainSlots] says why
// a run waits. The [Slots] returned are renewed with the lease's keeper,
// by hand with [Slots.Renew], and released with [Slots.Release].
// [ClaimSlots] and [ClaimSlotsWait] are the forms without a lease.
//
//	slots, err := lease.ClaimSlots(ctx, []runlease.Scope{runlease.NamedScope("gpu", 8)})
//
// # Keep the lease alive
//
// [Keep] starts a [Keeper] that renews the lease (and, with [KeepSlots] or
// [KeepSlotsStrict], the slots) from inside long supersteps. It trusts the
// lease only until the start of its last successful renewal plus the TTL
// less a margin: [Keeper.Context] is cancelled, with the reason as its cause,
// and [Keeper.Err] reports it, before any contender can be granted the
// lease. A run that waits for slots longer than the TTL waits through its
// keeper: [Keeper.ClaimSlotsWait] keeps the lease while the run waits and
// hands the slots admitted to the keeper ([Keeper.KeepSlots] and
// [Keeper.KeepSlotsStrict] hand over slots claimed otherwise). A [Renewer]
// keeps many leases, renewing those due together in one store call.
//
//	keeper, err := runlease.Keep(ctx, lease, runlease.KeepSlots(slots))
//	if err != nil { … }
//	defer keeper.Release(context.WithoutCancel(ctx))
//	for _, step := range steps {
//		if err := step.Run(keeper.Context(), lease.Fence()); err != nil { return err }
//	}
//
// # Write through the fence
//
// [Lease.Write] applies writes of your own keys ([Put], [Delete]) in one
// atomic batch with a renewal of the lease, conditional on the row the lease
// last wrote, so a checkpoint lands only while the lease holds; a replaced
// driver gets [ErrLeaseLost] and nothing is written. [Lease.WriteIf] adds
// conditions on your keys ([IfEquals], [IfAbsent]) and fails with
// [ErrConditionFailed] when one does not hold; [Lease.Read] reads a key
// back through the lease. Fenced writes need a store that implements
// [Batcher], as the built-in stores do.
//
//	err := lease.Write(keeper.Context(), runlease.Put("ckpt:run-42", state))
//
// # Release
//
// [Keeper.Release] stops the keeper and releases the slots and the lease, so
// the next driver can start at once; [Lease.Release] and [Slots.Release]
// release each alone. A release writes a tombstone that keeps the fence, and
// a failed one is safe: the rows expire after their TTL.
//
// # Operate
//
// [Peek], [Leases], [Occupancy] and [Queues] read what the store holds;
// [ForceRelease] and [Prune] are an operator's repairs. [Hooks] (given with
// [WithHooks]) and [WithLogger] report acquisitions, renewals and losses.
// The runlease command and the statuspage package build on these.
//
// # Stores of your own
//
// A [Store] is a table of text keys and values with compare-and-swap; the
// lease, slot and queue policy all live above it. Its doc is the contract a
// third-party store implements: what each method must do, how faults are
// labelled ([StorageError], [ErrOutcomeUnknown]), how contexts are honoured,
// and which store values the library accepts. Optional capabilities
// ([Batcher], [MultiCASer], [MultiScanner], [RangeReader], [Notifier],
// [RowNotifier], [DeleteNotifier], [DeleteReadNotifier], [ClosableStore],
// [ClosedReporter]) are
// found by type assertion, so a store implements only those it can. Within
// a major version the contract does not change; a minor version may add
// optional capabilities, which a store without them does without. A store
// that holds resources calls [ForgetStore] from its Close.
//
// The package [github.com/areev/runlease/storetest] checks the contract: a
// store's tests call its Run with a constructor, and RunWith with a
// harness that can reopen the storage and inject faults.
package runlease
