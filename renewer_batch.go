package runlease

import (
	"context"
	"reflect"
	"time"
)

// maxRenewBatch is the most leases one batched renewal carries.
const maxRenewBatch = 512

// groupByStore splits due keepers into renewal groups: the leases of one
// store that can renew many at once ([MultiCASer]) in chunks of up to
// maxRenewBatch, and every other keeper alone. A lease kept by two keepers
// goes into a batch once; the other keeper renews it alone (a batch locks
// each of its leases, and must not lock one twice).
func groupByStore(due []*Keeper) [][]*Keeper {
	var groups [][]*Keeper
	open := map[Store]int{} // store → index of its group still filling
	batched := map[*Lease]bool{}
	for _, k := range due {
		s := k.lease.store
		if _, ok := s.(MultiCASer); !ok || !reflect.TypeOf(s).Comparable() || batched[k.lease] {
			groups = append(groups, []*Keeper{k})
			continue
		}
		i, ok := open[s]
		if !ok || len(groups[i]) == maxRenewBatch {
			i = len(groups)
			open[s] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], k)
		batched[k.lease] = true
	}
	return groups
}

// renewGroup renews the leases of group, which share a store, in one
// MultiCASer call, then finishes each keeper as renew does. A keeper
// stopped meanwhile waits for the call (it is bounded by the earliest trust
// window of the group) rather than cut it short for the others.
func (r *Renewer) renewGroup(group []*Keeper, flying chan struct{}, deadline time.Time) {
	defer close(flying)
	r.slots <- struct{}{}
	defer func() { <-r.slots }()

	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	leases := make([]*Lease, len(group))
	for i, k := range group {
		leases[i] = k.lease
	}
	start := time.Now()
	errs := renewMany(ctx, group[0].lease.store.(MultiCASer), leases)
	latency := time.Since(start)
	for i, k := range group {
		r.finish(ctx, k, start, latency, errs[i])
	}
}
