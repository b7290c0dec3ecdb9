// Package etcdstore provides a [runlease.Store] on an etcd v3 cluster, so
// that leases and slots survive the loss of any minority of its members.
//
// Every call is one linearizable request to the cluster: reads are quorum
// reads, and every conditional write is one Txn whose comparisons are the
// write's condition (an absent key is CreateRevision == 0, an exact value is
// a Value comparison), so a stale writer never overwrites a newer row. The
// store implements [runlease.Batcher] and [runlease.MultiCASer] as Txns, and
// [runlease.RowNotifier] and [runlease.DeleteNotifier] through etcd's Watch,
// so a released lease is handed to a waiter on another node in
// milliseconds, and a released slot wakes the runs waiting for its scope
// ([runlease.ClaimSlotsWait]) as fast.
//
// Keys. Runlease key k is etcd key prefix+k ([WithPrefix]), its value
// stored byte for byte. Besides the rows, the store keeps bells: etcd key
// prefix+k+"\x00", empty, which [Store.MetaDeleteNotify] puts, in the
// releasing Txn, to wake the subscribers of k; for the admission queue, k
// is a scope's queue prefix, so there is one bell per scope that ever had
// a slot released or a waiter leave its queue. No row can have a bell's
// key (runlease keys never hold NUL), no read of the store returns one,
// and bells are never deleted (Prune does not see them). Each release
// costs one more put in its Txn, whether or not anyone waits: one more
// revision in the cluster's history until it is compacted.
//
// Time. etcd has no clock a client can read, so the store does not implement
// [runlease.Clock]: expiry is judged by each node's local clock. A node whose
// clock runs ahead by d sees other holders' leases expire d early, and may
// take one over while its holder still trusts it, if d is larger than the
// holder's safety margin; a node whose clock is behind by d only waits d
// longer to take over. A holder itself never trusts its lease for longer than
// the TTL less its margin, measured on its own monotonic clock from the start
// of the write that obtained it, so skew cannot make a holder overstay; only
// another node's fast clock can cut the holder's window short. Keep clocks
// synchronised (NTP) to well within the margin; fences still protect every
// fenced write when they are not.
//
// Faults. A call that fails is a [*runlease.StorageError]. It is labelled not
// applied when nothing can have reached the cluster (no member could be
// reached before the request was sent, or the context had ended), or when
// etcd refused the request; it is labelled outcome unknown when the request
// may have been applied (a deadline or a lost connection after sending, a
// leader change while the request was proposed). A write larger than the
// cluster accepts in one request ([WithMaxRequestBytes], etcd's default
// 1.5 MiB: a fenced write of two values of a MiB each is one) is no fault:
// no retry could make it fit, so it is refused before it is sent, with an
// error that matches [runlease.ErrInvalidArgument]. One the cluster
// refuses for its size all the same (its limit is lower than the store
// was told) is labelled not applied, and never Retryable.
//
// Sample:
//
//	store, err := etcdstore.Open(ctx, []string{"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"})
//	if err != nil {
//		return err
//	}
//	defer store.Close()
//	lease, err := runlease.Acquire(ctx, store, "run-42", runlease.HolderFor("alice", ""))
package etcdstore
