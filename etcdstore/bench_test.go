package etcdstore_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
)

// The benchmarks set runlease against the bare etcd Txn doing the same
// compare-and-put on the same cluster, in the same run: Renew is one Txn
// with a value comparison, as is each half of Acquire+Release on a released
// row. Run them with -cpu 1,4,16 for the goroutine counts of the issue.

func BenchmarkRenew(b *testing.B) {
	s := benchStore(b)
	var ids atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		l, err := runlease.Acquire(b.Context(), s, "run"+strconv.FormatInt(ids.Add(1), 10), "A")
		if err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			if err := l.Renew(b.Context()); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkBareTxnRenew(b *testing.B) {
	s := benchStore(b)
	kv := s.Client().KV
	var ids atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := s.Prefix() + "bare" + strconv.FormatInt(ids.Add(1), 10)
		cur := "0"
		if _, err := kv.Put(b.Context(), key, cur); err != nil {
			b.Error(err)
			return
		}
		for i := 1; pb.Next(); i++ {
			next := strconv.Itoa(i)
			if err := bareCAS(b.Context(), kv, key, cur, next); err != nil {
				b.Error(err)
				return
			}
			cur = next
		}
	})
}

func BenchmarkAcquireRelease(b *testing.B) {
	s := benchStore(b)
	var ids atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		run := "run" + strconv.FormatInt(ids.Add(1), 10)
		for pb.Next() {
			l, err := runlease.Acquire(b.Context(), s, run, "A")
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(b.Context()); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkBareTxnAcquireRelease(b *testing.B) {
	s := benchStore(b)
	kv := s.Client().KV
	var ids atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := s.Prefix() + "bare" + strconv.FormatInt(ids.Add(1), 10)
		if _, err := kv.Put(b.Context(), key, "free"); err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			if err := bareCAS(b.Context(), kv, key, "free", "held"); err != nil {
				b.Error(err)
				return
			}
			if err := bareCAS(b.Context(), kv, key, "held", "free"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// bareCAS is the compare-and-put the store makes, written directly.
func bareCAS(ctx context.Context, kv clientv3.KV, key, cur, next string) error {
	resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", cur)).Then(clientv3.OpPut(key, next)).Commit()
	if err == nil && !resp.Succeeded {
		err = errors.New("the compare failed, though only this goroutine writes " + key)
	}
	return err
}

// benchStore returns a store of its own for a benchmark, after warming the
// cluster and the client's connections up with puts from 16 goroutines, so
// that whichever benchmark runs first in a binary does not pay for a cold
// cluster (first leader work, connection set-up, page faults) that later
// ones, the bare baselines among them, do not.
func benchStore(b *testing.B) *etcdstore.Store {
	b.Helper()
	s := newStore(b)
	kv := s.Client().KV
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			key := s.Prefix() + "warm" + strconv.Itoa(w)
			for i := range 50 {
				if _, err := kv.Put(b.Context(), key, strconv.Itoa(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ResetTimer()
	return s
}
