package containerdtest

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

func TestParentOf(t *testing.T) {
	ppid, ok := parentOf(os.Getpid())
	require.True(t, ok)
	require.Equal(t, os.Getppid(), ppid)
	_, ok = parentOf(-1)
	require.False(t, ok)
}

// TestOwnProcesses finds a process in a mount namespace of its own, its
// child there, and its child in yet another namespace (as a container is
// the shim's), and not this test.
func TestOwnProcesses(t *testing.T) {
	overlaytest.RequireRoot(t)
	require.Empty(t, ownProcesses(""), "no namespace, no processes")
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", "sleep 60 & unshare --mount sleep 60 & wait")
	require.NoError(t, cmd.Start())
	var ns string
	var own []int
	t.Cleanup(func() {
		for _, pid := range append(own, cmd.Process.Pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = cmd.Wait()
	})
	self, err := os.Readlink("/proc/self/ns/mnt")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ns, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid))
		if err != nil || ns == self {
			return false
		}
		own = ownProcesses(ns)
		return len(own) == 3
	}, 10*time.Second, 10*time.Millisecond, "sh and its two sleeps")
	require.Contains(t, own, cmd.Process.Pid)
	require.NotContains(t, own, os.Getpid())
}
