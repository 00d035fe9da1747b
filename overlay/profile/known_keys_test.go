package profile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// The internal tests find nvml-mock's profiles as every other test does,
// through overlaytest (SharedProfilesDir says why this way).
func init() {
	*profile.SharedProfilesDir = func(t testing.TB) string { return overlaytest.SharedTestdata(t, "nvml-mock-profiles") }
}

func unknown(t *testing.T, doc string) []string {
	t.Helper()
	p, err := profile.Parse("x.yaml", []byte(doc))
	require.NoError(t, err)
	var out []string
	for _, u := range p.Unknown {
		out = append(out, u.Error())
	}
	return out
}

// A typo is ignored like a field nvml-mock knows and sysfs does not need,
// and the device silently renders with a default; so every key nvml-mock's
// schema lacks is reported, with its path, line and nearest known key.
func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"subsystem id typo", "devices:\n  - index: 0\n    pci:\n      bus_id: \"0000:07:00.0\"\n      subsytem_id: 0x134F10DE\n",
			[]string{"profile x.yaml: devices[0].pci.subsytem_id: unknown key (line 5), not in nvml-mock's profile schema; nearest known key: subsystem_id"}},
		{"bus id typo", "devices:\n  - index: 0\n  - index: 1\n    pci: {bus_idd: \"0000:07:00.0\"}\n",
			[]string{"profile x.yaml: devices[1].pci.bus_idd: unknown key (line 4), not in nvml-mock's profile schema; nearest known key: bus_id"}},
		{"top-level typo", "device_default:\n  pci: {device_id: 0x20B010DE}\ndevices:\n  - index: 0\n",
			[]string{"profile x.yaml: device_default: unknown key (line 1), not in nvml-mock's profile schema; nearest known key: device_defaults"}},
		{"deep in a field sysfs ignores", "device_defaults:\n  ecc:\n    mode_current: Enabled\n    errors: {volatil: {}}\n",
			[]string{"profile x.yaml: device_defaults.ecc.errors.volatil: unknown key (line 4), not in nvml-mock's profile schema; nearest known key: volatile"}},
		{"inside an unknown key, nothing more", "devices:\n  - index: 0\n    pcie_x: {a: 1, b: 2}\n",
			[]string{"profile x.yaml: devices[0].pcie_x: unknown key (line 3), not in nvml-mock's profile schema; nearest known key: pcie"}},
		{"through a merge key", "x_defaults: &d {bus_idd: a}\ndevices:\n  - index: 0\n    pci:\n      <<: *d\n",
			[]string{
				"profile x.yaml: x_defaults: unknown key (line 1), not in nvml-mock's profile schema; nearest known key: device_defaults",
				"profile x.yaml: devices[0].pci.bus_idd: unknown key (line 1), not in nvml-mock's profile schema; nearest known key: bus_id",
			}},
		{"fields nvml-mock knows and sysfs does not use", "version: \"1.0\"\nsystem: {driver_version: \"550\", cuda_version_major: 12}\ndevice_defaults:\n  memory: {total_bytes: 1}\n  clocks: {graphics_max: 1}\n  mig: {}\ndevices:\n  - {index: 0, uuid: GPU-x, minor_number: 0, ecc: {}}\nnvlink:\n  links_per_gpu: 12\n  switches: [{bdf: \"0000:c4:00.0\", uuid: x}]\npcie_topology: {cores_per_numa: 2, root_complexes: [{id: pci0000:00, cpu_affinity: \"0-1\", devices: []}]}\ninfiniband: {enabled: true, hca_type: MT4123}\ndynamic_metrics_defaults: {power: {base_mw: 1}}\n", nil},
		{"this tool's extensions", "system: {num_devices: 1, product_name: DGX}\ndevice_defaults: {pci: {class: 0x030200, driver: vfio-pci}}\ndevices: [{index: 0, pci: {class: 0x030000, driver: nvidia}}]\nnvlink: {switches: [{bdf: \"0000:c4:00.0\", device_id: 0x22A310DE, driver: nvidia-nvswitch}]}\npcie_topology: {hierarchy: hgx, root_complexes: []}\ninfiniband: {enabled: true, sriov_totalvfs: 8, gpus: [0]}\n", nil},
		// Only a GPU's driver is chosen (pci.driver); an HCA is always on
		// mlx5_core, so infiniband has no driver key: asking for vfio-pci
		// there warns like any key nvml-mock lacks, and the HCAs render on
		// mlx5_core. A refusal would make the one unknown key that stops a
		// render; a newer nvml-mock's keys must only warn.
		{"no driver for HCAs", "infiniband: {enabled: true, driver: vfio-pci}\n",
			[]string{"profile x.yaml: infiniband.driver: unknown key (line 1), not in nvml-mock's profile schema; nearest known key: hw_rev"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, unknown(t, tc.doc))
		})
	}
}

// nvml-mock's own profiles give no warnings: the built-ins always, its
// shipped configs and shared profiles where ../shared is beside the
// checkout.
func TestNvmlMockProfilesHaveNoUnknownKeys(t *testing.T) {
	for _, name := range shipped.Names() {
		t.Run("built-in "+name, func(t *testing.T) {
			p, _ := shipped.Get(name)
			out, err := profile.Marshal(p, "")
			require.NoError(t, err)
			require.Empty(t, unknown(t, string(out)))
		})
	}
	t.Run("shared profiles", func(t *testing.T) {
		dir := overlaytest.SharedTestdata(t, "nvml-mock-profiles")
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if len(files) == 0 {
			t.Fatalf("%s holds no profile: nvml-mock's profiles are its *.yaml", dir)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			require.Empty(t, unknown(t, string(data)), f)
		}
	})
}

// A profile holding every key of nvml-mock's schema (profile.NvmlMockKeys,
// written from its config types; their source is not in any registry, so
// this list is the record) gives no warning. A device key is listed once,
// under device_defaults, since a device override inlines it.
func TestEveryNvmlMockKeyIsKnown(t *testing.T) {
	paths := strings.Fields(profile.NvmlMockKeys)
	require.NotEmpty(t, paths)
	doc := map[string]any{}
	for _, p := range paths {
		put(doc, strings.Split(p, "."))
		if rest, ok := strings.CutPrefix(p, "device_defaults."); ok {
			put(doc, strings.Split("devices[]."+rest, "."))
		}
	}
	data, err := yaml.Marshal(doc)
	require.NoError(t, err)
	require.Empty(t, unknown(t, string(data)))
}

// put sets a path in a document: a[] makes a one-item sequence; leaves are
// null, which the decoder takes as unset.
func put(m map[string]any, parts []string) {
	key, seq := strings.CutSuffix(parts[0], "[]")
	if len(parts) == 1 {
		if _, there := m[key]; !there {
			m[key] = nil
		}
		return
	}
	if seq {
		items, _ := m[key].([]any)
		if len(items) == 0 {
			items = []any{map[string]any{}}
			m[key] = items
		}
		put(items[0].(map[string]any), parts[1:])
		return
	}
	child, _ := m[key].(map[string]any)
	if child == nil {
		child = map[string]any{}
		m[key] = child
	}
	put(child, parts[1:])
}
