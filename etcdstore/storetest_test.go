package etcdstore_test

import (
	"testing"

	"github.com/areev/runlease"
	"github.com/areev/runlease/etcdstore"
	"github.com/areev/runlease/storetest"
)

func TestConformance(t *testing.T) {
	requireCluster(t)
	storetest.RunWith(t, storetest.Harness{
		New:    func(t *testing.T) runlease.Store { return newStore(t) },
		Reopen: func(t *testing.T, s runlease.Store) runlease.Store { return reopen(t, s.(*etcdstore.Store)) },
		Faulty: faultyStore,
	})
}
