package resourceslices

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// bareProfile states the GPUs' PCI identity and nothing NVML reports of
// them: nvml-mock's NVML would fill every fact from its A100 defaults.
const bareProfile = `version: "1.0"
device_defaults:
  name: "NVIDIA H100 80GB HBM3"
  pci: {device_id: 0x233010DE}
devices:
  - {index: 0, pci: {bus_id: "0000:1a:00.0"}}
  - {index: 1, name: "NVIDIA H100 PCIe", pci: {bus_id: "0000:1b:00.0"}}
pcie_topology:
  root_complexes:
    - {id: "pci0000:00", numa_node: 1, devices: ["0000:1a:00.0", "0000:1b:00.0"]}
`

// MockDefaults names every field the profile leaves to nvml-mock's A100
// defaults, with the default, once each; a built-in leaves none.
func TestMockDefaults(t *testing.T) {
	mockDefaults := func(source, data string) []string {
		t.Helper()
		p, err := Parse(source, []byte(data))
		require.NoError(t, err)
		return p.MockDefaults()
	}
	require.Equal(t, []string{
		"profile bare.yaml: system.driver_version not set: nvml-mock's NVML reports its A100 default, 550.163.01 (nvml-mock's NVML refuses the profile without it and serves its own 8 A100s)",
		"profile bare.yaml: system.cuda_version not set: nvml-mock's NVML reports its A100 default, 12.4",
		"profile bare.yaml: device_defaults.brand not set: nvml-mock's NVML reports its A100 default, nvidia",
		"profile bare.yaml: device_defaults.architecture not set: nvml-mock's NVML reports its A100 default, ampere",
		"profile bare.yaml: device_defaults.memory.total_bytes not set: nvml-mock's NVML reports its A100 default, 42949672960 (40960 MiB)",
		"profile bare.yaml: device_defaults.compute_capability not set: nvml-mock's NVML reports its A100 default, 8.0",
	}, mockDefaults("bare.yaml", bareProfile))
	// A GPU without a name of its own or device_defaults' is named too.
	unnamed := mockDefaults("unnamed.yaml", "version: \"1.0\"\nsystem: {driver_version: \"580.65.06\", cuda_version: \"13.0\"}\ndevice_defaults: {brand: nvidia, architecture: hopper, compute_capability: {major: 9, minor: 0}, memory: {total_bytes: 1}, pci: {device_id: 0x233010DE}}\ndevices:\n  - {index: 0, name: \"NVIDIA H100 80GB HBM3\", pci: {bus_id: \"0000:1a:00.0\"}}\n  - {index: 1, pci: {bus_id: \"0000:1b:00.0\"}}\n")
	require.Equal(t, []string{"profile unnamed.yaml: device_defaults.name not set: nvml-mock's NVML reports its A100 default, Mock NVIDIA A100-SXM4-40GB"}, unnamed)
	_, err := Parse("broken.yaml", []byte("devices: ["))
	require.ErrorContains(t, err, "broken.yaml", "a profile ForNode refuses has no Profile to warn of")
	for _, name := range shipped.Names() {
		source, data, err := ReadProfile(name)
		require.NoError(t, err)
		require.Empty(t, mockDefaults(source, string(data)), "built-in %s", name)
	}
}

// The NVIDIA driver publishes numaNode on a GPU whose root complex has a
// NUMA node, as a scalar (its default form), and none on a GPU without
// one.
func TestNVIDIAGPUNUMANode(t *testing.T) {
	numa := func(name string) map[string]*int64 {
		t.Helper()
		source, data, err := ReadProfile(name)
		require.NoError(t, err)
		p, err := Parse(source, data)
		require.NoError(t, err)
		got, err := NVIDIAGPU{}.Slices(p, "n")
		require.NoError(t, err)
		require.Len(t, got, 1)
		out := map[string]*int64{}
		for _, d := range got[0].Spec.Devices {
			a := d.Attributes["resource.kubernetes.io/numaNode"]
			require.Nil(t, a.IntValues, "%s: the scalar form", d.Name)
			out[d.Name] = a.IntValue
		}
		return out
	}
	h100 := numa("hgx-h100")
	for gpu, want := range map[string]int64{"gpu-0": 0, "gpu-3": 0, "gpu-4": 1, "gpu-7": 1} {
		require.NotNil(t, h100[gpu], gpu)
		require.Equal(t, want, *h100[gpu], gpu)
	}
	for gpu, n := range numa("t4-vm") {
		require.Nil(t, n, "%s: a VM's GPU has no NUMA node", gpu)
	}
}
