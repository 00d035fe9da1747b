package containerdtest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
)

// testCRIContainer checks the parts of a container's CRI config that a
// pod spec's securityContext and a kubelet's stop become, each against
// the runtime's default, so a harness user can rely on them.
func testCRIContainer(t *testing.T, s *served) {
	pod := s.h.RunPod(t, containerdtest.Pod{Name: "security"})
	// status prints the process's capabilities and no_new_privs, then
	// tries to write to the container's root.
	status := func(t *testing.T, name string, sec containerdtest.Security) (string, int) {
		t.Helper()
		res := pod.Run(t, containerdtest.Container{
			Name:     name,
			Image:    containerdtest.ConsumerImage,
			Command:  []string{"/bin/sh", "-c", `grep -E "^(CapEff|NoNewPrivs)" /proc/self/status; echo written > /written`},
			Mounts:   []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}},
			Security: sec,
		})
		return res.Stdout + res.Stderr, res.ExitCode
	}
	t.Run("restricted", func(t *testing.T) {
		s.routes.expect(t, "CRI container security", "the DaemonSet's securityContext", "no capabilities, no_new_privs, read-only root")
		root := int64(0)
		out, code := status(t, "restricted", containerdtest.Security{ReadOnlyRootfs: true, DropCapabilities: []string{"ALL"}, NoNewPrivs: true, RunAsUser: &root})
		require.NotEqual(t, 0, code, out)
		require.Contains(t, out, "CapEff:\t0000000000000000")
		require.Contains(t, out, "NoNewPrivs:\t1")
		require.Contains(t, out, "Read-only file system")
	})
	t.Run("default", func(t *testing.T) {
		s.routes.expect(t, "CRI container security", "no securityContext", "capabilities, a writable root (the control)")
		out, code := status(t, "default", containerdtest.Security{})
		require.Equal(t, 0, code, out)
		require.NotContains(t, out, "CapEff:\t0000000000000000")
		require.Contains(t, out, "NoNewPrivs:\t0")
	})

	// stop runs a container that handles SIGTERM as told, stops it with a
	// one-second grace period, and returns its exit code.
	stop := func(t *testing.T, name, onTerm string) int {
		t.Helper()
		c := pod.Start(t, containerdtest.Container{
			Name:    name,
			Image:   containerdtest.ConsumerImage,
			Command: []string{"/bin/sh", "-c", "trap '" + onTerm + "' TERM; echo ready; while :; do sleep 0.1; done"},
			Mounts:  []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}},
		})
		defer c.Remove(t)
		require.Eventually(t, func() bool {
			stdout, _ := c.Logs(t)
			return strings.Contains(stdout, "ready")
		}, 30*time.Second, 50*time.Millisecond)
		c.Stop(t, time.Second)
		return c.Wait(t, 30*time.Second)
	}
	t.Run("stop: SIGTERM handled", func(t *testing.T) {
		s.routes.expect(t, "CRI StopContainer", "a container that handles SIGTERM", "exit 0")
		require.Equal(t, 0, stop(t, "term-exits", "exit 0"))
	})
	t.Run("stop: SIGTERM ignored, SIGKILL after the grace period", func(t *testing.T) {
		s.routes.expect(t, "CRI StopContainer", "a container that ignores SIGTERM", "SIGKILL after the grace period, exit 137")
		require.Equal(t, 137, stop(t, "term-ignored", ""))
	})
}
