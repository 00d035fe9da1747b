package profile

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSharedProfilesInfiniBand reads the infiniband block of nvml-mock's
// profiles: ConnectX-6 on the A100, ConnectX-7 on H100 and GB200, none on
// the T4 (enabled: false), and the machine type of the board: GB200's
// known by its NVML name although nvml-mock gives it a placeholder id.
func TestSharedProfilesInfiniBand(t *testing.T) {
	want := map[string]struct {
		typ, name string
		device    uint16
		machine   string
	}{
		"a100.yaml":  {"MT4123", "ConnectX-6", 0x101b, "DGX A100"},
		"h100.yaml":  {"MT4129", "ConnectX-7", 0x1021, "DGX H100"},
		"gb200.yaml": {"MT4129", "ConnectX-7", 0x1021, "DGX GB200"},
		"t4.yaml":    {},
	}
	for _, f := range sharedProfiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			m := load(t, f)
			w := want[filepath.Base(f)]
			require.Equal(t, w.machine, m.ProductName)
			if w.typ == "" {
				require.Nil(t, m.HCAs)
				return
			}
			require.Equal(t, &HCASpec{Type: w.typ, Name: w.name, Device: w.device, LinkLayer: LinkLayerInfiniBand, Class: ClassInfiniBand, PerGPU: 1,
				Link: m.HCAs.Link, VFDevice: m.HCAs.VFDevice}, m.HCAs)
			// The effective profile carries the block, and reads back the same.
			again, err := Normalize("effective", m.Effective(), Options{})
			require.NoError(t, err)
			require.Equal(t, m.HCAs, again.HCAs)
			require.Equal(t, m.ProductName, again.ProductName)
		})
	}
}

func TestInfiniBandBlock(t *testing.T) {
	const head = "device_defaults:\n  pci:\n    device_id: 0x233010DE\ndevices:\n  - pci: {bus_id: \"0000:18:00.0\"}\n"
	tests := []struct {
		name, yaml string
		want       *HCASpec
		err        string
	}{
		{"disabled", "infiniband:\n  enabled: false\n  hca_type: MT9999\n", nil, ""},
		{"absent", "", nil, ""},
		{"defaults: the board's paired HCA, InfiniBand, one per GPU", "infiniband: {enabled: true}\n",
			&HCASpec{Type: "MT4129", Name: "ConnectX-7", Device: 0x1021, LinkLayer: "InfiniBand", Class: 0x020700, PerGPU: 1, Link: Link{5, 5, 16, 16}, VFDevice: 0x101e}, ""},
		{"ConnectX-6 Dx in Ethernet mode, two per GPU", "infiniband: {enabled: true, hca_type: mt4125, link_layer: ethernet, hcas_per_gpu: 2}\n",
			&HCASpec{Type: "MT4125", Name: "ConnectX-6 Dx", Device: 0x101d, LinkLayer: "Ethernet", Class: 0x020000, PerGPU: 2, Link: Link{4, 4, 16, 16}, VFDevice: 0x101e}, ""},
		{"nvml-mock's other keys, unquoted", "infiniband: {enabled: true, hw_rev: 0x0, rate_gbps: 400, fw_version: 28.39.2048, guid_prefix: a088c2:0300:ab}\n",
			&HCASpec{Type: "MT4129", Name: "ConnectX-7", Device: 0x1021, LinkLayer: "InfiniBand", Class: 0x020700, PerGPU: 1, Link: Link{5, 5, 16, 16}, VFDevice: 0x101e}, ""},
		{"virtual functions (this tool's extension)", "infiniband: {enabled: true, hca_type: MT4123, sriov_totalvfs: 8}\n",
			&HCASpec{Type: "MT4123", Name: "ConnectX-6", Device: 0x101b, LinkLayer: "InfiniBand", Class: 0x020700, PerGPU: 1, Link: Link{4, 4, 16, 16}, TotalVFs: 8, VFDevice: 0x101c}, ""},
		{"too many virtual functions", "infiniband: {enabled: true, sriov_totalvfs: 128}\n", nil,
			`profile p.yaml: infiniband.sriov_totalvfs: value "128": want 0..127`},
		{"zero HCAs per GPU", "infiniband: {enabled: true, hcas_per_gpu: 0}\n", nil, ""},
		{"unknown type", "infiniband: {enabled: true, hca_type: MT9999}\n", nil,
			`profile p.yaml: infiniband.hca_type: value "MT9999": unknown HCA type: want one of MT4119 (ConnectX-5)`},
		{"not an MT number", "infiniband: {enabled: true, hca_type: ConnectX-7}\n", nil,
			`profile p.yaml: infiniband.hca_type: value "ConnectX-7": unknown HCA type`},
		{"unknown link layer", "infiniband: {enabled: true, link_layer: OmniPath}\n", nil,
			`profile p.yaml: infiniband.link_layer: value "OmniPath": want InfiniBand or Ethernet`},
		{"too many per GPU", "infiniband: {enabled: true, hcas_per_gpu: 9}\n", nil,
			`profile p.yaml: infiniband.hcas_per_gpu: value "9": want 0..8`},
		{"negative per GPU", "infiniband: {enabled: true, hcas_per_gpu: -1}\n", nil,
			`profile p.yaml: infiniband.hcas_per_gpu: value "-1": want 0..8`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(head+tc.yaml))
			require.NoError(t, err)
			m, err := Normalize("p.yaml", p, Options{})
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.NotContains(t, err.Error(), "\n")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, m.HCAs)
		})
	}
}

func TestProductName(t *testing.T) {
	tests := []struct {
		name, yaml, want, err string
	}{
		{"the board's machine", "device_defaults: {pci: {device_id: 0x20B010DE}}\n", "DGX A100", ""},
		{"a board without one machine", "device_defaults: {pci: {device_id: 0x1EB810DE}}\n", "", ""},
		{"the profile's own", "system: {product_name: \" ESC4000A-E12 \"}\ndevice_defaults: {pci: {device_id: 0x1EB810DE}}\n", "ESC4000A-E12", ""},
		{"the profile's wins over the board's", "system: {product_name: DGX H100 (lab)}\ndevice_defaults: {pci: {device_id: 0x20B010DE}}\n", "DGX H100 (lab)", ""},
		{"longer than a label", "system: {product_name: " + strings.Repeat("x", 64) + "}\ndevice_defaults: {pci: {device_id: 0x20B010DE}}\n", "",
			`system.product_name: value "xxxxxxxx`},
		{"two lines", "system: {product_name: \"a\\nb\"}\ndevice_defaults: {pci: {device_id: 0x20B010DE}}\n", "",
			`profile p.yaml: system.product_name: value "a\nb": a control character`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(tc.yaml+"devices:\n  - pci: {bus_id: \"0000:18:00.0\"}\n"))
			require.NoError(t, err)
			m, err := Normalize("p.yaml", p, Options{})
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, m.ProductName)
		})
	}
}

// TestInfiniBandGPUs reads infiniband.gpus (this tool's extension): the
// devices[].index of the GPUs that carry HCAs, as on a PCIe server with
// NICs beside some GPUs only. Unset, every GPU; an empty list, none. An
// index no GPU has, or one listed twice, is refused in one line naming the
// file, the item and the value. What is accepted writes back through the
// effective profile, in YAML and in JSON, to the same machine.
func TestInfiniBandGPUs(t *testing.T) {
	const head = "device_defaults: {pci: {device_id: 0x233110DE}}\n" +
		"devices:\n  - {index: 0, pci: {bus_id: \"0000:2a:00.0\"}}\n  - {index: 1, pci: {bus_id: \"0000:4a:00.0\"}}\n  - {index: 2, pci: {bus_id: \"0000:aa:00.0\"}}\n" +
		"infiniband:\n  enabled: true\n  hca_type: MT4129\n"
	tests := []struct {
		name, yaml string
		carriers   []int // the GPUs Carries says yes to; nil, no HCASpec
		gpus       []int // HCASpec.GPUs
		err        string
	}{
		{"unset: every GPU", "", []int{0, 1, 2}, nil, ""},
		{"some GPUs, sorted", "  gpus: [2, 0]\n", []int{0, 2}, []int{0, 2}, ""},
		{"every GPU, listed", "  gpus: [0, 1, 2]\n", []int{0, 1, 2}, []int{0, 1, 2}, ""},
		{"an empty list: none", "  gpus: []\n", nil, nil, ""},
		{"no GPU has the index", "  gpus: [0, 7]\n", nil, nil,
			`profile p.yaml: infiniband.gpus[1]: value "7": no GPU has devices[].index 7`},
		{"a negative index", "  gpus: [-1]\n", nil, nil,
			`profile p.yaml: infiniband.gpus[0]: value "-1": no GPU has devices[].index -1`},
		{"listed twice", "  gpus: [2, 0, 2]\n", nil, nil,
			`profile p.yaml: infiniband.gpus[2]: value "2": the same GPU as infiniband.gpus[0]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(head+tc.yaml))
			require.NoError(t, err)
			require.Empty(t, p.Unknown)
			m, err := Normalize("p.yaml", p, Options{})
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			if tc.carriers == nil {
				require.Nil(t, m.HCAs)
			} else {
				require.Equal(t, tc.gpus, m.HCAs.GPUs)
				var carriers []int
				for _, g := range m.GPUs() {
					if m.HCAs.Carries(g.Index) {
						carriers = append(carriers, g.Index)
					}
				}
				require.Equal(t, tc.carriers, carriers)
			}
			yamlOut, err := Marshal(m.Effective(), "effective")
			require.NoError(t, err)
			jsonOut, err := MarshalJSON(m.Effective())
			require.NoError(t, err)
			requireSameMachine(t, m, yamlOut, jsonOut)
		})
	}
}
