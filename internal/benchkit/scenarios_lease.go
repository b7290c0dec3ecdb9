package benchkit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/areev/runlease"
)

// leaseOpts are the options of every lease and slot the scenarios take.
var leaseOpts = []runlease.Option{runlease.WithTTL(leaseTTL)}

// freshRuns returns a function that names a new run id at each call.
func freshRuns(e *Env, kind string) func() string {
	prefix, i := fmt.Sprintf("bench-%s-%d-", kind, e.Seq()), 0
	return func() string {
		i++
		return prefix + strconv.Itoa(i)
	}
}

// Acquire is Acquire of a run id that has no row yet.
var Acquire = Scenario{
	Name: "acquire", Title: "Acquire (fresh run id)", BaseDesc: "INSERT … ON CONFLICT DO NOTHING",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		next := freshRuns(e, "acq")
		return &Worker{Op: func(ctx context.Context) error {
			_, err := runlease.Acquire(ctx, e.Store, next(), Holder(w), leaseOpts...)
			return err
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		next := freshRuns(e, "acq")
		return &Worker{Op: func(ctx context.Context) error {
			return must(e.Raw.Insert(ctx, runlease.LeasePrefix+next(), liveRow(Holder(w), 1)))
		}}, nil
	},
}

// AcquireRelease is Acquire of a run id that has no row yet, then Release,
// against the cycle that notifies in every releasing statement (on
// Postgres, UPDATE … RETURNING pg_notify, as releases did before they
// notified only when someone waits).
var AcquireRelease = Scenario{
	Name: "acquire-release", Title: "Acquire+Release (fresh run id)",
	BaseDesc: "INSERT … ON CONFLICT DO NOTHING; UPDATE … WHERE key AND value (Postgres: RETURNING pg_notify)",
	Store:    acquireRelease,
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		return rawAcquireRelease(e, w, e.Raw.UpdateNotify), nil
	},
}

// AcquireReleasePlain is AcquireRelease against a baseline without
// pg_notify: the least SQL the cycle needs, so the difference from
// AcquireRelease is what waking other nodes costs.
var AcquireReleasePlain = Scenario{
	Name: "acquire-release-plain", Title: "Acquire+Release vs plain UPDATE",
	BaseDesc: "INSERT … ON CONFLICT DO NOTHING; UPDATE … WHERE key AND value",
	Store:    acquireRelease,
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		return rawAcquireRelease(e, w, e.Raw.Update), nil
	},
}

// AcquireReleaseDelete is AcquireRelease against an INSERT and a DELETE,
// the cheapest pair of statements that takes and frees a key (the store
// cannot delete: a released row keeps the fence, so fences never go
// backwards).
var AcquireReleaseDelete = Scenario{
	Name: "acquire-release-delete", Title: "Acquire+Release vs INSERT+DELETE",
	BaseDesc: "INSERT … ON CONFLICT DO NOTHING; DELETE … WHERE key AND value",
	Store:    acquireRelease,
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		next := freshRuns(e, "acqrel")
		return &Worker{Op: func(ctx context.Context) error {
			key, row := runlease.LeasePrefix+next(), liveRow(Holder(w), 1)
			if err := must(e.Raw.Insert(ctx, key, row)); err != nil {
				return err
			}
			return must(e.Raw.Delete(ctx, key, row))
		}}, nil
	},
}

func acquireRelease(ctx context.Context, e *Env, w int) (*Worker, error) {
	next := freshRuns(e, "acqrel")
	return &Worker{Op: func(ctx context.Context) error {
		l, err := runlease.Acquire(ctx, e.Store, next(), Holder(w), leaseOpts...)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}}, nil
}

func rawAcquireRelease(e *Env, w int, release func(ctx context.Context, key, old, value string) (bool, error)) *Worker {
	next := freshRuns(e, "acqrel")
	return &Worker{Op: func(ctx context.Context) error {
		key, row := runlease.LeasePrefix+next(), liveRow(Holder(w), 1)
		if err := must(e.Raw.Insert(ctx, key, row)); err != nil {
			return err
		}
		return must(release(ctx, key, row, rowValue("", 1, time.Now().UnixMilli())))
	}}
}

// acquireOwn acquires a lease of a fresh run id for goroutine w, with the
// extra options.
func acquireOwn(ctx context.Context, e *Env, w int, kind string, opts ...runlease.Option) (*runlease.Lease, error) {
	return runlease.Acquire(ctx, e.Store, freshRuns(e, kind)(), Holder(w), append(opts, leaseOpts...)...)
}

// renewing returns the options of a lease or slots that the goroutine
// renews in a loop: every renewal then writes a new row (see tickClock).
func renewing() runlease.Option { return runlease.WithClock((&tickClock{}).Now) }

// Renew is Lease.Renew of a lease the goroutine holds.
var Renew = Scenario{
	Name: "renew", Title: "Lease.Renew", BaseDesc: "UPDATE … WHERE key AND value",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		l, err := acquireOwn(ctx, e, w, "renew", renewing())
		if err != nil {
			return nil, err
		}
		return &Worker{Op: l.Renew}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		return rawSwap(ctx, e, runlease.LeasePrefix+freshRuns(e, "renew")(), Holder(w))
	},
}

// Write is Lease.Write of one checkpoint key: a fenced write.
var Write = Scenario{
	Name: "write", Title: "Lease.Write (fenced, 1 key)", BaseDesc: "fenced write: UPDATE … WHERE key AND value, then upsert, in one transaction",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		l, err := acquireOwn(ctx, e, w, "write", renewing())
		if err != nil {
			return nil, err
		}
		key, i := "ckpt:"+l.RunID(), int64(0)
		return &Worker{Op: func(ctx context.Context) error {
			i++
			return l.Write(ctx, runlease.Put(key, payload(i)))
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		run := freshRuns(e, "write")()
		return rawFenced(ctx, e, runlease.LeasePrefix+run, "ckpt:"+run, Holder(w))
	},
}

// Peek is Peek of a live lease.
var Peek = Scenario{
	Name: "peek", Title: "Peek", BaseDesc: "SELECT value WHERE key",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		l, err := acquireOwn(ctx, e, w, "peek")
		if err != nil {
			return nil, err
		}
		return &Worker{Op: func(ctx context.Context) error {
			info, err := runlease.Peek(ctx, e.Store, l.RunID())
			if err == nil && !info.Live {
				return fmt.Errorf("peek: run %s is not live", l.RunID())
			}
			return err
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		return Get.Base(ctx, e, w)
	},
}

// slotScope returns the scope of goroutine w's claims at limit, and its
// key prefix.
func slotScope(limit, w int) (runlease.Scope, string) {
	name := fmt.Sprintf("bench-l%d-w%d", limit, w)
	return runlease.NamedScope(name, limit), runlease.SlotPrefix + name + ":"
}

// claimSetUp fills every slot but the last of goroutine w's scope at limit
// with live rows of other runs, once per Env.
func claimSetUp(ctx context.Context, e *Env, limit, w int) error {
	_, prefix := slotScope(limit, w)
	return e.Once(prefix, func() error {
		until := time.Now().Add(6 * time.Hour).UnixMilli()
		var rows []runlease.Row
		for k := range limit - 1 {
			rows = append(rows, runlease.Row{Key: prefix + strconv.Itoa(k), Value: rowValue(fmt.Sprintf("held-%d", k), 0, until)})
			if len(rows) == 500 || k == limit-2 {
				if err := e.Raw.Upsert(ctx, rows); err != nil {
					return err
				}
				rows = rows[:0]
			}
		}
		return nil
	})
}

// Claim is ClaimSlots of one scope at limit, whose slots are all held by
// other runs but the last, then Slots.Release: the claim's round trips do
// not depend on the limit.
func Claim(limit int) Scenario {
	return Scenario{
		Name:     fmt.Sprintf("claim-%d", limit),
		Title:    fmt.Sprintf("ClaimSlots+Release (limit %d, %d held)", limit, limit-1),
		BaseDesc: "range SELECT of the scope; INSERT … ON CONFLICT DO NOTHING; DELETE … WHERE key AND value",
		Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
			if err := claimSetUp(ctx, e, limit, w); err != nil {
				return nil, err
			}
			scope, _ := slotScope(limit, w)
			next := freshRuns(e, "claim")
			return &Worker{Op: func(ctx context.Context) error {
				s, err := runlease.ClaimSlots(ctx, e.Store, next(), []runlease.Scope{scope}, leaseOpts...)
				if err != nil {
					return err
				}
				return s.Release(ctx)
			}}, nil
		},
		Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
			if err := claimSetUp(ctx, e, limit, w); err != nil {
				return nil, err
			}
			_, prefix := slotScope(limit, w)
			key, next := prefix+strconv.Itoa(limit-1), freshRuns(e, "claim")
			return &Worker{Op: func(ctx context.Context) error {
				rows, err := e.Raw.Scan(ctx, prefix)
				if err := wantRows(rows, err, limit-1); err != nil {
					return err
				}
				row := liveRow(next(), 0)
				if err := must(e.Raw.Insert(ctx, key, row)); err != nil {
					return err
				}
				return must(e.Raw.Delete(ctx, key, row))
			}}, nil
		},
	}
}

// SlotsRenew is Slots.Renew of one slot the goroutine holds.
var SlotsRenew = Scenario{
	Name: "slots-renew", Title: "Slots.Renew (1 scope)", BaseDesc: "UPDATE … WHERE key AND value",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		scope := runlease.NamedScope(fmt.Sprintf("bench-sr-%d", e.Seq()), 1)
		s, err := runlease.ClaimSlots(ctx, e.Store, freshRuns(e, "sr")(), []runlease.Scope{scope}, append(leaseOpts, renewing())...)
		if err != nil {
			return nil, err
		}
		return &Worker{Op: s.Renew}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		return rawSwap(ctx, e, fmt.Sprintf("%sbench-sr-%d:0", runlease.SlotPrefix, e.Seq()), Holder(w))
	},
}

// occupancySlots is how many live slots the Occupancy scenario's store holds.
const occupancySlots = 10

// Occupancy is Occupancy of a store holding occupancySlots live slots.
var Occupancy = Scenario{
	Name: "occupancy", Title: fmt.Sprintf("Occupancy (%d slots)", occupancySlots), BaseDesc: "SELECT key, value WHERE key >= p AND key < succ(p)",
	Store: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		if err := occupancySetUp(ctx, e); err != nil {
			return nil, err
		}
		return &Worker{Op: func(ctx context.Context) error {
			slots, err := runlease.Occupancy(ctx, e.Store)
			if err == nil && len(slots) != occupancySlots {
				return fmt.Errorf("occupancy: %d live slots, want %d", len(slots), occupancySlots)
			}
			return err
		}}, nil
	},
	Base: func(ctx context.Context, e *Env, w int) (*Worker, error) {
		if err := occupancySetUp(ctx, e); err != nil {
			return nil, err
		}
		return &Worker{Op: func(ctx context.Context) error {
			rows, err := e.Raw.Scan(ctx, runlease.SlotPrefix)
			return wantRows(rows, err, occupancySlots)
		}}, nil
	},
}

func occupancySetUp(ctx context.Context, e *Env) error {
	return e.Once("occupancy", func() error {
		scope := []runlease.Scope{runlease.NamedScope("bench-occ", occupancySlots)}
		for i := range occupancySlots {
			// Held for hours, so they stay live through the longest run.
			_, err := runlease.ClaimSlots(ctx, e.Store, fmt.Sprintf("bench-occ-%d", i), scope, runlease.WithTTL(6*time.Hour))
			if err != nil {
				return err
			}
		}
		return nil
	})
}
