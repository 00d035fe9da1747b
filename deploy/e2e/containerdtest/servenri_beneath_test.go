package containerdtest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
)

// vfioProfile binds a GPU to vfio-pci, so the module view has vfio_pci.
const vfioProfile = "../../../testdata/profiles/vfio-passthrough.yaml"

// TestServeNRIBeneath serves, through serve --nri on the real containerd
// and runc, a container that mounts the node's / at /host-root as the
// NVIDIA DRA driver's chart does, and one that mounts its /sys at
// /host-sys as nfd-worker's does: beneath them they see the module view
// (what the DRA driver stats before a VFIO prepare) and the tree's iommu
// groups; the node's own /sys stays the container's /sys. On a node
// whose sysfs has no kernel/iommu_groups (served as one by a stand-in
// --host-sysfs), where runc could not make that mount target beneath the
// node's sysfs and would fail the container, the tree's sys/kernel stands
// in beneath those mounts. Control: the same container opted out sees
// the node's own modules, which have no vfio_pci.
func TestServeNRIBeneath(t *testing.T) {
	for _, m := range []string{"/sys/module/vfio_pci", "/sys/module/nvidia"} {
		if _, err := os.Stat(m); err == nil {
			t.Skipf("the node has %s: the control could not tell ours from the node's", m)
		}
	}
	h := containerdtest.Start(t, containerdtest.Options{})
	s := serve(t, h, vfioProfile)
	// One shell line per fact, so a failure names the one that failed.
	const draPrepare = `set -e
test -d /host-root/sys/module/vfio_pci || { echo "no /host-root/sys/module/vfio_pci"; exit 3; }
test -n "$(ls /host-root/sys/kernel/iommu_groups)" || { echo "no iommu group at /host-root/sys/kernel/iommu_groups"; exit 4; }
grep -qx live /host-root/sys/module/nvidia/initstate || { echo "nvidia not live at /host-root/sys/module"; exit 5; }
test -d /sys/kernel/mm || { echo "the container's own /sys/kernel is not the node's"; exit 6; }
echo ok`
	const nfd = `set -e
test -d /host-sys/module/vfio_pci || { echo "no /host-sys/module/vfio_pci"; exit 3; }
test -e /host-sys/module/vfio_pci/drivers/pci:vfio-pci || { echo "/host-sys/module/vfio_pci/drivers/pci:vfio-pci does not resolve"; exit 4; }
test -n "$(ls /host-sys/kernel/iommu_groups)" || { echo "no iommu group at /host-sys/kernel/iommu_groups"; exit 5; }
echo ok`
	// The GPU Operator's operand gate (main), run once in a container of
	// the node's containerd, served through the plugin with the mount set.
	gate := containerdtest.Container{Name: "toolkit-validation", Image: containerdtest.ConsumerImage, Command: []string{"/bin/sh", "-c", programs.OperandGate},
		Mounts: []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}}}
	container := func(name, script, node, at string) containerdtest.Container {
		return containerdtest.Container{
			Name: name, Image: containerdtest.ConsumerImage, Command: []string{"/bin/sh", "-c", script},
			Mounts: []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}, {HostPath: node, ContainerPath: at, ReadOnly: true}},
		}
	}
	rows := func(t *testing.T, pod string) {
		t.Run("the GPU Operator's operand gate", func(t *testing.T) {
			res := h.RunPod(t, containerdtest.Pod{Name: pod + "-gate"}).Run(t, gate)
			require.Equal(t, 0, res.ExitCode, "%s: %s%s", programs.OperandGate, res.Stdout, res.Stderr)
		})
		t.Run("the node's / at /host-root", func(t *testing.T) {
			res := h.RunPod(t, containerdtest.Pod{Name: pod + "-host-root"}).Run(t, container("plugin", draPrepare, "/", "/host-root"))
			require.Equal(t, 0, res.ExitCode, "%s%s", res.Stdout, res.Stderr)
		})
		t.Run("the node's /sys at /host-sys", func(t *testing.T) {
			res := h.RunPod(t, containerdtest.Pod{Name: pod + "-host-sys"}).Run(t, container("worker", nfd, "/sys", "/host-sys"))
			require.Equal(t, 0, res.ExitCode, "%s%s", res.Stdout, res.Stderr)
		})
	}
	t.Run("a node with iommu groups", func(t *testing.T) {
		if _, err := os.Stat("/sys/kernel/iommu_groups"); err != nil {
			t.Skip("this node's sysfs has no kernel/iommu_groups")
		}
		s.startServeNRI(t, false)
		rows(t, "nri-beneath")
		t.Run("opted out", func(t *testing.T) {
			res := h.RunPod(t, containerdtest.Pod{Name: "nri-beneath-opt-out", Annotations: map[string]string{nriplugin.NVMLMockInjectAnnotation: "false"}}).
				Run(t, container("plugin", draPrepare, "/", "/host-root"))
			require.Equal(t, 3, res.ExitCode, "the node's own modules, no vfio_pci: %s%s", res.Stdout, res.Stderr)
			res = h.RunPod(t, containerdtest.Pod{Name: "nri-beneath-gate-opt-out", Annotations: map[string]string{nriplugin.NVMLMockInjectAnnotation: "false"}}).Run(t, gate)
			require.NotEqual(t, 0, res.ExitCode, "opted out, the gate keeps waiting: the node's /sys/module has no nvidia")
		})
	})
	t.Run("a node without", func(t *testing.T) {
		// A node's sysfs always lists some module (the built-in ones), and
		// the tree holds the mount target of the node's modules only then.
		stand := t.TempDir()
		for _, d := range []string{"module/printk", "bus/pci/devices", "kernel/mm"} {
			require.NoError(t, os.MkdirAll(filepath.Join(stand, d), 0o755))
		}
		s.startServeNRI(t, false, "--host-sysfs", stand)
		rows(t, "nri-beneath-no-groups")
	})
}
