package runlease

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease/internal/proctest"
	"github.com/areev/runlease/internal/systest"
)

// roleNodeID prints DefaultNodeID as a process running as pid 1 sees it,
// the way every container of a pod does.
var roleNodeID = proctest.Register("default-node-id", func() int {
	getpid = func() int { return 1 }
	fmt.Println(DefaultNodeID())
	return 0
})

// TestDefaultNodeIDDiffersBetweenContainersOfOnePod starts this test binary
// twice with one host name, both seeing pid 1, as two containers of one
// Kubernetes pod (or two compose replicas with a fixed hostname) do.
func TestDefaultNodeIDDiffersBetweenContainersOfOnePod(t *testing.T) {
	systest.Mark(t)
	t.Parallel()
	var ids []string
	for range 2 {
		child := proctest.Start(t, roleNodeID, "HOSTNAME=worker-pod")
		code, err := child.Wait(30 * time.Second)
		require.NoError(t, err)
		require.Equal(t, 0, code, child.Stderr())
		lines := child.Lines()
		require.Len(t, lines, 1)
		ids = append(ids, lines[0])
	}
	for _, id := range ids {
		assert.True(t, strings.HasPrefix(id, "worker-pod/1/"), "%q keeps the host first, then the pid", id)
	}
	assert.NotEqual(t, ids[0], ids[1], "two processes with one host name and pid share no node id")
}
