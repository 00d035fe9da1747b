package runtime_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/consumers"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/runtime"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// consumerContainer runs an invocation in a CRI container with the host's
// /usr, the consumer's build, the mock NVML and the profile mounted, and
// an output directory it may write.
func (s *served) consumerContainer(name, buildDir, mockNVML, out string, inv consumers.Invocation, extra ...runtime.Mount) runtime.Container {
	return runtime.Container{
		Name:    name,
		Image:   runtime.ConsumerImage,
		Command: inv.Args,
		Env:     inv.Env,
		Mounts: append(append(runtime.ConsumerMounts(buildDir, mockNVML),
			runtime.Mount{HostPath: s.profile, ContainerPath: profileInImage, ReadOnly: true},
			runtime.Mount{HostPath: out, ContainerPath: runtime.InConsumerOutput},
		), extra...),
	}
}

// The containers of the consumers' pod. On a node, GFD and the DRA
// driver's kubelet plugin ask for no device: the pod's annotation names
// ours per container, and an NRI plugin injects it.
const (
	gfdContainer = "gpu-feature-discovery"
	draContainer = "gpu-kubelet-plugin"
)

// testConsumers runs GPU Feature Discovery and the DRA driver's discovery
// in CRI containers of a pod whose annotation has containerd's NRI
// device-injector give them our CDI device, and, as the negative
// controls, in containers of the same pod that the annotation does not
// name.
func testConsumers(t *testing.T, s *served) {
	mockNVML := consumers.Need(t, consumers.MockNVML())
	s.h.StartDeviceInjector(t)
	pod := s.h.RunPod(t, runtime.Pod{Name: "consumers", Annotations: map[string]string{
		"cdi-devices.noderesource.dev/container." + gfdContainer: "- " + device,
		"cdi-devices.noderesource.dev/container." + draContainer: "- " + device,
	}})

	gfd := func(t *testing.T, name string) map[string]string {
		t.Helper()
		out := t.TempDir()
		inv := consumers.GFDRun{
			Binary:     runtime.InConsumerBuild + "/gpu-feature-discovery",
			MockNVML:   runtime.InMockNVML,
			Profile:    profileInImage,
			OutputFile: runtime.InConsumerOutput + "/labels",
		}.Invocation()
		res := pod.Run(t, s.consumerContainer(name, consumers.Need(t, consumers.GFD()), mockNVML, out, inv))
		require.Equal(t, 0, res.ExitCode, "GFD: %s", res.Stderr)
		data, err := os.ReadFile(filepath.Join(out, "labels"))
		require.NoError(t, err, "GFD wrote no labels: %s", res.Stderr)
		labels, err := consumers.ParseGFDLabels(data)
		require.NoError(t, err)
		return labels
	}
	// GFD's machine label, with no flag: the injected CDI device sets
	// GFD_MACHINE_TYPE_FILE at the overlay's machine type.
	machine := consumers.GFDMachineLabel(s.machine.ProductName)
	require.NotEmpty(t, s.machine.ProductName, "the suite's profile names a machine, so the machine checks can fail")
	t.Run("GFD labels compute", func(t *testing.T) {
		s.routes.expect(t, "NRI device-injector, GPU Feature Discovery", "`cdi-devices.noderesource.dev/container.<name>`", "`nvidia.com/gpu.mode=compute`")
		labels := gfd(t, gfdContainer)
		require.Equal(t, "compute", labels["nvidia.com/gpu.mode"], "labels: %v", labels)
		require.Equal(t, machine, labels["nvidia.com/gpu.machine"], "the profile's machine, through the spec's variable")
		t.Logf("GFD: nvidia.com/gpu.mode=%s, nvidia.com/gpu.count=%s, nvidia.com/gpu.product=%s", labels["nvidia.com/gpu.mode"], labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.product"])
	})
	t.Run("GFD without the device labels unknown", func(t *testing.T) {
		s.routes.expect(t, "NRI device-injector, GPU Feature Discovery", "nothing (a container the annotation does not name)", "`nvidia.com/gpu.mode=unknown`")
		labels := gfd(t, gfdContainer+"-unannotated")
		require.Equal(t, "unknown", labels["nvidia.com/gpu.mode"], "labels: %v", labels)
		require.NotEqual(t, machine, labels["nvidia.com/gpu.machine"], "the node's own machine without the device")
	})

	dra := func(t *testing.T, name string) []consumers.DRADevice {
		t.Helper()
		root := t.TempDir()
		require.NoError(t, consumers.WriteDriverRoot(root, mockNVML))
		inv := consumers.DRADiscoveryRun{
			Binary:     runtime.InConsumerBuild + "/gpu-kubelet-plugin.test",
			DriverRoot: "/driver-root",
			Profile:    profileInImage,
		}.Invocation()
		res := pod.Run(t, s.consumerContainer(name, consumers.Need(t, consumers.DRADiscovery()), mockNVML, t.TempDir(), inv,
			runtime.Mount{HostPath: root, ContainerPath: "/driver-root", ReadOnly: true}))
		require.Equal(t, 0, res.ExitCode, "DRA discovery: %s%s", res.Stdout, res.Stderr)
		found, err := consumers.ParseDRADevices([]byte(res.Stdout))
		require.NoError(t, err)
		return found
	}
	t.Run("DRA discovery finds pcieRoot", func(t *testing.T) {
		s.routes.expect(t, "NRI device-injector, DRA driver's discovery", "`cdi-devices.noderesource.dev/container.<name>`", "each GPU's `resource.kubernetes.io/pcieRoot` is its root complex")
		want, got := map[string]string{}, map[string]string{}
		for _, d := range s.machine.Devices {
			if d.Kind == profile.GPU {
				want[d.Address.String()] = d.RootComplex.String()
			}
		}
		for _, d := range dra(t, draContainer) {
			require.Equal(t, "gpu", d.Type, "%+v", d)
			root, _ := d.PCIeRoot()
			got[strings.ToLower(d.GPUPCIBusID)] = root
			t.Logf("DRA discovery: %s %s %s=%s", d.GPUPCIBusID, d.Type, consumers.PCIeRootAttribute, root)
		}
		require.Equal(t, want, got, "each GPU's pcieRoot is its root complex")
	})
	t.Run("DRA discovery without the device finds no pcieRoot", func(t *testing.T) {
		s.routes.expect(t, "NRI device-injector, DRA driver's discovery", "nothing (a container the annotation does not name)", "no GPU has a pcieRoot")
		found := dra(t, draContainer+"-unannotated")
		require.Len(t, found, len(s.machine.Devices)-countSwitches(s.machine), "the mock NVML still lists every GPU")
		for _, d := range found {
			_, ok := d.PCIeRoot()
			require.False(t, ok, "%s has a pcieRoot without the mock sysfs", d.GPUPCIBusID)
		}
	})
}

func countSwitches(m *profile.Machine) int {
	n := 0
	for _, d := range m.Devices {
		if d.Kind == profile.NVSwitch {
			n++
		}
	}
	return n
}
