package runlease_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/areev/runlease"
)

// The examples judge expiry by a clock that moves only when told to, so
// their output does not depend on when they run.
var exampleStart = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

// A driver acquires a run, renews the lease as the run advances, and
// releases it; a second driver is refused meanwhile, and continues the fence
// after the release.
func ExampleAcquire() {
	ctx := context.Background()
	store, err := runlease.OpenSQLite(":memory:")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	now := exampleStart
	clock := runlease.WithClock(func() time.Time { return now })
	ttl := runlease.WithTTL(30 * time.Second)

	lease, err := runlease.Acquire(ctx, store, "run-42", "billing#node-1", clock, ttl)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("fence", lease.Fence(), "held until", lease.Expiry().Format(time.TimeOnly))

	_, err = runlease.Acquire(ctx, store, "run-42", "billing#node-2", clock, ttl)
	var lost *runlease.LeaseLostError
	if errors.As(err, &lost) {
		fmt.Println("node-2 refused: held by", lost.Holder, "until", lost.Until.Format(time.TimeOnly))
	}

	now = now.Add(10 * time.Second)
	if err := lease.Renew(ctx); err != nil {
		fmt.Println(err) // taken over: stop advancing the run
		return
	}
	fmt.Println("renewed until", lease.Expiry().Format(time.TimeOnly))
	fmt.Println("release:", lease.Release(ctx))

	next, err := runlease.Acquire(ctx, store, "run-42", "billing#node-2", clock, ttl)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("node-2 acquires at fence", next.Fence())
	// Output:
	// fence 1 held until 09:00:30
	// node-2 refused: held by billing#node-1 until 09:00:30
	// renewed until 09:00:40
	// release: <nil>
	// node-2 acquires at fence 2
}

// At most two runs execute at once on everything that shares the store, and
// one per principal. A run refused in any scope holds no slot.
func ExampleClaimSlots() {
	ctx := context.Background()
	store, err := runlease.OpenSQLite(":memory:")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	clock := runlease.WithClock(func() time.Time { return exampleStart })
	scopes := func(principal string) []runlease.Scope {
		return []runlease.Scope{runlease.MemScope(2), runlease.PrincipalScope(principal, 1)}
	}

	first, err := runlease.ClaimSlots(ctx, store, "run-1", scopes("alice"), clock)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range first.Held() {
		fmt.Println("run-1 holds", s.Scope, "slot", s.Slot)
	}
	_, err = runlease.ClaimSlots(ctx, store, "run-2", scopes("alice"), clock)
	fmt.Println("run-2:", err)
	_, err = runlease.ClaimSlots(ctx, store, "run-3", scopes("bob"), clock)
	fmt.Println("run-3:", err)
	_, err = runlease.ClaimSlots(ctx, store, "run-4", scopes("carol"), clock)
	fmt.Println("run-4:", err)

	if err := first.Release(ctx); err != nil {
		fmt.Println(err)
		return
	}
	_, err = runlease.ClaimSlots(ctx, store, "run-4", scopes("carol"), clock)
	fmt.Println("run-4, after run-1 ended:", err)
	// Output:
	// run-1 holds mem slot 0
	// run-1 holds principal:alice slot 0
	// run-2: RUN-E022: concurrency limit reached in scope "principal:alice" (limit 1, 1 held, 1 asked)
	// run-3: <nil>
	// run-4: RUN-E022: concurrency limit reached in scope "mem" (limit 2, 2 held, 1 asked)
	// run-4, after run-1 ended: <nil>
}

// Peek tells a status page who holds a run and when another driver may take
// it over, without changing anything.
func ExamplePeek() {
	ctx := context.Background()
	store, err := runlease.OpenSQLite(":memory:")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	now := exampleStart
	clock := runlease.WithClock(func() time.Time { return now })
	if _, err := runlease.Acquire(ctx, store, "run-42", "billing#node-1", clock, runlease.WithTTL(time.Minute)); err != nil {
		fmt.Println(err)
		return
	}

	info, err := runlease.Peek(ctx, store, "run-42", clock)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.Holder, "holds run-42 at fence", info.Fence, "live:", info.Live,
		"takeover at", info.Until.Format(time.TimeOnly))

	now = now.Add(2 * time.Minute) // the holder stopped renewing
	info, _ = runlease.Peek(ctx, store, "run-42", clock)
	fmt.Println("two minutes later, live:", info.Live)

	info, _ = runlease.Peek(ctx, store, "run-7", clock)
	fmt.Println("run-7 has a lease row:", info.Found)
	// Output:
	// billing#node-1 holds run-42 at fence 1 live: true takeover at 09:01:00
	// two minutes later, live: false
	// run-7 has a lease row: false
}

// Occupancy lists who holds which slot until when, for status surfaces.
func ExampleOccupancy() {
	ctx := context.Background()
	store, err := runlease.OpenSQLite(":memory:")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	clock := runlease.WithClock(func() time.Time { return exampleStart })
	for i, principal := range []string{"alice", "bob"} {
		run := fmt.Sprintf("run-%d", i+1)
		scopes := []runlease.Scope{runlease.MemScope(4), runlease.PrincipalScope(principal, 2)}
		if _, err := runlease.ClaimSlots(ctx, store, run, scopes, clock, runlease.WithTTL(time.Minute)); err != nil {
			fmt.Println(err)
			return
		}
	}

	slots, err := runlease.Occupancy(ctx, store, clock)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range slots {
		fmt.Printf("%s slot %d: %s until %s\n", s.Scope, s.Slot, s.RunID, s.Until.Format(time.TimeOnly))
	}
	// Output:
	// mem slot 0: run-1 until 09:01:00
	// mem slot 1: run-2 until 09:01:00
	// principal:alice slot 0: run-1 until 09:01:00
	// principal:bob slot 0: run-2 until 09:01:00
}

// A Keeper renews a lease in the background while a long superstep runs.
// The superstep's work runs under the keeper's context, which is cancelled,
// with the reason as its cause, the moment the lease is lost.
func ExampleKeep() {
	ctx := context.Background()
	store, err := runlease.OpenSQLite(":memory:")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	lease, err := runlease.Acquire(ctx, store, "run-42", "billing#node-1", runlease.WithTTL(time.Minute))
	if err != nil {
		fmt.Println(err)
		return
	}
	keeper, err := runlease.Keep(ctx, lease)
	if err != nil {
		fmt.Println(err)
		return
	}

	work := keeper.Context()
	for step := 1; step <= 3; step++ {
		if work.Err() != nil {
			fmt.Println("stop:", context.Cause(work)) // lost: another driver has the run
			return
		}
		fmt.Println("step", step, "at fence", lease.Fence())
	}
	fmt.Println("release:", keeper.Release(ctx))
	fmt.Println("keeper:", keeper.Err())
	// Output:
	// step 1 at fence 1
	// step 2 at fence 1
	// step 3 at fence 1
	// release: <nil>
	// keeper: RUN-E024: keeper stopped
}
