package runlease_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/areev/runlease"
)

// openExampleStore opens an embedded store in a folder of its own, and
// returns it with the func that closes it and removes the folder.
func openExampleStore() (*runlease.SQLiteStore, func(), error) {
	dir, err := os.MkdirTemp("", "runlease-example-")
	if err != nil {
		return nil, nil, err
	}
	store, err := runlease.OpenSQLite(filepath.Join(dir, "runs.db"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return store, func() { store.Close(); os.RemoveAll(dir) }, nil
}

// A second driver waits for a run the first holds, and takes it at the
// next fence as soon as the first releases it (the store wakes the
// waiter; without a release it would take the run once the lease
// expired).
func ExampleAcquireWait() {
	ctx := context.Background()
	store, done, err := openExampleStore()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()

	first, err := runlease.Acquire(ctx, store, "run-42", "billing#node-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("node-1 holds run-42 at fence", first.Fence())

	type acquired struct {
		lease *runlease.Lease
		err   error
	}
	next := make(chan acquired, 1)
	go func() {
		l, err := runlease.AcquireWait(ctx, store, "run-42", "billing#node-2")
		next <- acquired{l, err}
	}()

	fmt.Println("node-1 releases:", first.Release(ctx))
	got := <-next
	if got.err != nil {
		fmt.Println(got.err)
		return
	}
	fmt.Println("node-2 holds run-42 at fence", got.lease.Fence())
	fmt.Println("release:", got.lease.Release(ctx))
	// Output:
	// node-1 holds run-42 at fence 1
	// node-1 releases: <nil>
	// node-2 holds run-42 at fence 2
	// release: <nil>
}

// A run waits for a slot under its keeper, which renews the lease however
// long the wait takes and keeps the slots from the moment the run is
// admitted; Release gives both back. Were the lease lost meanwhile, the
// wait would end with the loss, the run admitted nowhere.
func ExampleKeeper_ClaimSlotsWait() {
	ctx := context.Background()
	store, done, err := openExampleStore()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()
	scopes := []runlease.Scope{runlease.MemScope(1)}

	// Another run holds the only slot for now.
	busy, err := runlease.ClaimSlots(ctx, store, "run-7", scopes)
	if err != nil {
		fmt.Println(err)
		return
	}

	lease, err := runlease.Acquire(ctx, store, "run-42", "billing#node-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	keeper, err := runlease.Keep(ctx, lease)
	if err != nil {
		fmt.Println(err)
		return
	}

	type admission struct {
		slots *runlease.Slots
		err   error
	}
	admitted := make(chan admission, 1)
	go func() {
		slots, err := keeper.ClaimSlotsWait(ctx, scopes)
		admitted <- admission{slots, err}
	}()

	fmt.Println("run-7 releases:", busy.Release(ctx))
	a := <-admitted
	if a.err != nil {
		fmt.Println("not admitted:", a.err) // the keeper's reason when it ended
		return
	}
	for _, slot := range a.slots.Held() {
		fmt.Println("run-42 holds", slot.Scope, "slot", slot.Slot)
	}
	fmt.Println("kept by the keeper:", keeper.Slots() == a.slots)

	fmt.Println("release:", keeper.Release(ctx))
	live, err := runlease.Occupancy(ctx, store)
	fmt.Println("slots live:", len(live), err)
	// Output:
	// run-7 releases: <nil>
	// run-42 holds mem slot 0
	// kept by the keeper: true
	// release: <nil>
	// slots live: 0 <nil>
}

// For a hard limit, a run waits on its keeper's context and hands the
// slots over with KeepSlotsStrict: from then on a slot given up ends the
// keeper. A hand-over the keeper refuses leaves the slots the run's to
// release.
func ExampleKeeper_KeepSlotsStrict() {
	ctx := context.Background()
	store, done, err := openExampleStore()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()

	lease, err := runlease.Acquire(ctx, store, "run-42", "billing#node-1")
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
	slots, err := lease.ClaimSlotsWait(work, []runlease.Scope{runlease.NamedScope("gpu", 8).Take(2)})
	if err != nil {
		fmt.Println("not admitted:", context.Cause(work)) // the keeper's reason when it ended
		return
	}
	if err := keeper.KeepSlotsStrict(slots); err != nil {
		fmt.Println("not kept:", err)
		fmt.Println("release:", slots.Release(ctx))
		return
	}
	fmt.Println("kept strictly:", len(keeper.Slots().Held()), "slots")

	// A slot given up ends the keeper and cancels the work.
	fmt.Println("release the slots:", slots.Release(ctx))
	<-work.Done()
	fmt.Println("work:", context.Cause(work))
	fmt.Println("release:", keeper.Release(ctx))
	// Output:
	// kept strictly: 2 slots
	// release the slots: <nil>
	// work: RUN-E023: run "run-42" lost 1 slot(s): lease released: ["runslot:gpu:0"]
	// release: <nil>
}
