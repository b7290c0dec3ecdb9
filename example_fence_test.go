package runlease_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/areev/runlease"
)

// A system outside the store can refuse a replaced driver's writes by keeping
// the highest fence it has seen: it accepts a write only when the writer's
// fence is not lower. Here the downstream system is a table in another
// database.
func ExampleLease_Fence() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "runlease-example")
	defer os.RemoveAll(dir)
	downstream, _ := sql.Open("sqlite", filepath.Join(dir, "downstream.db"))
	defer downstream.Close()
	downstream.Exec(`CREATE TABLE runs (id TEXT PRIMARY KEY, fence INTEGER NOT NULL, state TEXT NOT NULL)`)
	downstream.Exec(`INSERT INTO runs VALUES ('run-42', 0, '')`)
	write := func(l *runlease.Lease, state string) bool {
		res, err := downstream.Exec(`UPDATE runs SET fence = ?, state = ? WHERE id = ? AND fence <= ?`,
			l.Fence(), state, l.RunID(), l.Fence())
		if err != nil {
			return false
		}
		n, _ := res.RowsAffected()
		return n == 1
	}

	store, _ := runlease.OpenSQLite(":memory:")
	defer store.Close()
	now := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	clock := runlease.WithClock(func() time.Time { return now })
	ttl := runlease.WithTTL(runlease.MinTTL)

	a, _ := runlease.Acquire(ctx, store, "run-42", "A", clock, ttl)
	fmt.Println("A at fence", a.Fence(), "writes:", write(a, "a-1"))

	now = now.Add(time.Minute) // A stalls past its TTL; B takes over
	b, _ := runlease.Acquire(ctx, store, "run-42", "B", clock, ttl)
	fmt.Println("B at fence", b.Fence(), "writes:", write(b, "b-1"))
	fmt.Println("A, resumed, writes:", write(a, "a-2"))

	var state string
	downstream.QueryRow(`SELECT state FROM runs WHERE id = 'run-42'`).Scan(&state)
	fmt.Println("downstream state:", state)
	// Output:
	// A at fence 1 writes: true
	// B at fence 2 writes: true
	// A, resumed, writes: false
	// downstream state: b-1
}

// A checkpoint written through the lease lands only while the lease holds.
func ExampleLease_Write() {
	ctx := context.Background()
	store, _ := runlease.OpenSQLite(":memory:")
	defer store.Close()
	now := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	clock := runlease.WithClock(func() time.Time { return now })
	ttl := runlease.WithTTL(runlease.MinTTL)

	a, _ := runlease.Acquire(ctx, store, "run-42", "A", clock, ttl)
	fmt.Println("A's checkpoint:", a.Write(ctx, runlease.Put("ckpt:run-42", "step 1 done")))

	now = now.Add(time.Minute)
	runlease.Acquire(ctx, store, "run-42", "B", clock, ttl)
	fmt.Println("A's late checkpoint:", a.Write(ctx, runlease.Put("ckpt:run-42", "step 2 done")))

	ckpt, _, _ := store.MetaGet(ctx, "ckpt:run-42")
	fmt.Println("stored:", ckpt)
	// Output:
	// A's checkpoint: <nil>
	// A's late checkpoint: RUN-E021: lease on run "run-42" lost: held by another holder (holder "B", fence 2, until 2026-12-02T09:01:05Z)
	// stored: step 1 done
}
