package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// slices prints, as YAML or JSON, the list of ResourceSlices of the node
// the profile (or the fleet map's choice for the node) gives:
// overlay/resourceslices proves their content against the real driver;
// this checks the command line reaches it.
func TestSlices(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fleetMap := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleetMap, []byte("nodes:\n  a: hgx-h100\nlabels:\n  - match: {gpu: t4}\n    profile: t4-vm\n"), 0o644))
	for _, tc := range []struct {
		args  []string
		node  string
		gpus  int
		first string
		hcas  int // dra.net's devices, a slice of their own
	}{
		{[]string{"--profile", "t4-vm", "--node-name", "n1"}, "n1", 4, "0000:00:1b.0", 0},
		{[]string{"--profile", "dgx-a100", "--node-name", "n2", "--format", "json"}, "n2", 8, "0000:07:00.0", 8},
		{[]string{"--fleet", fleetMap, "--node-name", "a"}, "a", 8, "0000:53:00.0", 8},
		{[]string{"--fleet", fleetMap, "--node-name", "b", "--node-labels", "gpu=t4"}, "b", 4, "0000:00:1b.0", 0},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"slices"}, tc.args...)...)
		require.Equal(t, exitOK, code, "%v: %s", tc.args, stderr)
		require.Empty(t, stderr, "%v: a built-in leaves nothing to nvml-mock's defaults", tc.args)
		var list resourcev1.ResourceSliceList
		require.NoError(t, yaml.Unmarshal([]byte(stdout), &list), "%v", tc.args)
		want := 1
		if tc.hcas > 0 {
			want = 2
		}
		require.Len(t, list.Items, want, "%v", tc.args)
		if tc.hcas > 0 {
			n := list.Items[1].Spec
			require.Equal(t, "dra.net", n.Driver)
			require.Equal(t, tc.node, *n.NodeName)
			require.Len(t, n.Devices, tc.hcas, "%v", tc.args)
		}
		s := list.Items[0].Spec
		require.Equal(t, "gpu.nvidia.com", s.Driver)
		require.Equal(t, tc.node, *s.NodeName)
		require.Equal(t, tc.node, s.Pool.Name)
		require.Len(t, s.Devices, tc.gpus, "%v", tc.args)
		require.Equal(t, "gpu-0", s.Devices[0].Name)
		require.Equal(t, tc.first, *s.Devices[0].Attributes["resource.kubernetes.io/pciBusID"].StringValue, "%v", tc.args)
	}
	code, _, stderr := runCLI(t, "slices", "--fleet", fleetMap, "--node-name", "c")
	require.Equal(t, exitFailure, code)
	require.Contains(t, stderr, "node c matches no rule")
}

// A profile that leaves NVML facts to nvml-mock's A100 defaults gets the
// slices all the same, and a warning line for each such field, naming it
// and the default.
func TestSlicesWarnsOfMockDefaults(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "bare.yaml")
	require.NoError(t, os.WriteFile(file, []byte("version: \"1.0\"\nsystem: {driver_version: \"580.65.06\", cuda_version: \"13.0\"}\ndevice_defaults: {name: \"NVIDIA H100 80GB HBM3\", brand: nvidia, memory: {total_bytes: 85899345920}, compute_capability: {major: 9, minor: 0}, pci: {device_id: 0x233010DE}}\ndevices:\n  - {index: 0, pci: {bus_id: \"0000:1a:00.0\"}}\n"), 0o644))
	code, stdout, stderr := runCLI(t, "slices", "--profile", file, "--node-name", "n")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "gpu.nvidia.com")
	require.Equal(t, "nvml-mock-sysfs: slices: warning: profile "+file+": device_defaults.architecture not set: nvml-mock's NVML reports its A100 default, ampere\n", stderr)
}
