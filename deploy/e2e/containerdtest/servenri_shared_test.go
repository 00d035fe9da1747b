package containerdtest_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
)

// TestServeNRISharedSys serves, through serve --nri on the real containerd
// and runc, a container that binds the node's /sys at /sys with
// Bidirectional propagation, as the NVIDIA DRA driver's chart does with
// PassthroughSupport: it sees our links and module view on top of it, and
// the node's mount namespace gets no mount under /sys from it; likewise
// when its CRI request names our CDI device, whose mounts the runtime
// makes itself. The node is the harness's private mount namespace (made
// with private propagation, so nothing reaches the host's), where /sys is
// made rshared, as on a systemd node, for containerd to accept the
// Bidirectional bind. Control (seen red by hand, with the plugin's
// re-add left out): our module view appears in the node's /sys.
func TestServeNRISharedSys(t *testing.T) {
	h := containerdtest.Start(t, containerdtest.Options{})
	s := serve(t, h, vfioProfile)
	out, err := h.NodeCommand("mount", "--make-rshared", "/sys").CombinedOutput()
	require.NoError(t, err, "make the node's /sys shared: %s", out)
	s.startServeNRI(t, false)
	const script = `set -e
grep -q ' /sys/bus/pci/devices ' /proc/self/mountinfo || { echo "no mount at /sys/bus/pci/devices"; exit 3; }
grep -qx live /sys/module/nvidia/initstate || { echo "no module view at /sys/module"; exit 4; }
grep ' /sys ' /proc/self/mountinfo | grep -q 'master:' || { echo "/sys is not a slave:"; grep ' /sys ' /proc/self/mountinfo; exit 5; }
echo ok`
	c := containerdtest.Container{Name: "gpus", Image: containerdtest.ConsumerImage, Command: []string{"/bin/sh", "-c", script},
		Mounts: []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}, {HostPath: "/sys", ContainerPath: "/sys", Bidirectional: true}}}
	t.Run("served", func(t *testing.T) {
		runOnSharedSys(t, h, "nri-shared-sys", c)
	})
	t.Run("our CDI device by CRI", func(t *testing.T) {
		c := c
		c.CDIDevices = []string{device}
		runOnSharedSys(t, h, "nri-shared-sys-cdi", c)
	})
}

// runOnSharedSys runs c in a new pod and requires that the node's and the
// host's mounts under /sys are as they were, and that c passed.
func runOnSharedSys(t *testing.T, h *containerdtest.Harness, pod string, c containerdtest.Container) {
	t.Helper()
	hostBefore := mountsUnderSys(t, containerdtest.ReadMountinfo(t, "/proc/self/mountinfo"))
	before := mountsUnderSys(t, h.NodeMounts(t))
	// A mount the row leaves in the node's namespace fails it even when
	// the container did not start (runc mounts ours before the cgroup
	// mount at /sys/fs/cgroup, which fails beneath a shared /sys), and
	// goes at the end, deepest first.
	t.Cleanup(func() {
		left := slices.DeleteFunc(mountsUnderSys(t, h.NodeMounts(t)), func(m string) bool { return slices.Contains(before, m) })
		if len(left) > 0 {
			t.Errorf("mounts reached the node's /sys: %v", left)
		}
		slices.Reverse(left)
		for _, m := range left {
			if out, err := h.NodeCommand("umount", "-l", m).CombinedOutput(); err != nil {
				t.Errorf("unmount %s in the node's namespace: %v: %s", m, err, out)
			}
		}
	})
	res := h.RunPod(t, containerdtest.Pod{Name: pod, Namespace: "nvidia-dra-driver-gpu"}).Run(t, c)
	// The node first: what must never happen is judged apart from what
	// the container saw.
	require.Equal(t, before, mountsUnderSys(t, h.NodeMounts(t)), "the node's mounts under /sys after the container ran")
	require.Equal(t, hostBefore, mountsUnderSys(t, containerdtest.ReadMountinfo(t, "/proc/self/mountinfo")), "the host's mounts under /sys")
	require.Equal(t, 0, res.ExitCode, "%s%s", res.Stdout, res.Stderr)
}

// mountsUnderSys are the mount points at /sys and under it, sorted.
func mountsUnderSys(t *testing.T, mounts []*mountinfo.Info) []string {
	t.Helper()
	var out []string
	for _, m := range mounts {
		if m.Mountpoint == "/sys" || strings.HasPrefix(m.Mountpoint, "/sys/") {
			out = append(out, m.Mountpoint)
		}
	}
	slices.Sort(out)
	return out
}
