package etcdtest

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Leader returns the index of the member that leads the cluster now.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	eps := c.Endpoints()
	cli, err := clientv3.New(c.config(eps...))
	if err != nil {
		return -1, err
	}
	defer cli.Close()
	for i, ep := range eps {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			continue
		}
		if st.Leader == st.Header.MemberId {
			return i, nil
		}
	}
	return -1, fmt.Errorf("etcdtest: no member says it leads")
}

// Kill ends member i at once (SIGKILL), as a crash would, and waits for its
// process to exit.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[i]
	if m.cmd == nil {
		return
	}
	m.cmd.Process.Kill()
	<-m.exited
	m.cmd = nil
}

// Restart starts member i again on its data, after [Cluster.Kill], and
// waits until every member answers.
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	m := c.members[i]
	var err error
	if m.cmd == nil {
		err = c.startMember(m, "existing")
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitHealthy(startTimeout)
}
