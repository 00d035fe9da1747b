package capture_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/capture"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

func synthCaptureOf(t *testing.T, deviceID string, busIDs ...string) *capture.Capture {
	t.Helper()
	var gpus []synthGPU
	for _, b := range busIDs {
		gpus = append(gpus, gpu(b, deviceID, "134F10DE", "65536 MiB"))
	}
	c, err := capture.ParseNvidiaSMI(strings.NewReader(synthCapture(gpus...)), "test.xml")
	require.NoError(t, err)
	return c
}

// topology flattens pcie_topology to "pciDDDD:BB=numa: dev dev".
func topology(p *profile.Profile) []string {
	var out []string
	for _, rc := range p.PCIeTopology.RootComplexes {
		out = append(out, rc.ID+"="+strconv.Itoa(*rc.NUMANode)+": "+strings.Join(rc.Devices, " "))
	}
	return out
}

func rcSpec(t *testing.T, s string) capture.RootComplexSpec {
	t.Helper()
	spec, err := capture.ParseRootComplexSpec(s)
	require.NoError(t, err)
	return spec
}

func TestRootComplexInference(t *testing.T) {
	const h100, a100, t4 = "233010DE", "20B010DE", "1EB810DE"
	tests := []struct {
		name      string
		device    string
		buses     []string
		opts      func(o *capture.Options)
		hierarchy boards.Hierarchy
		want      []string
	}{
		{"HGX H100: one host bridge three buses above each GPU", h100,
			[]string{"00000000:18:00.0", "00000000:2A:00.0"}, nil, boards.HGX,
			[]string{"pci0000:15=-1: 0000:18:00.0", "pci0000:27=-1: 0000:2A:00.0"}},
		{"DGX A100: five buses above", a100,
			[]string{"00000000:07:00.0", "00000000:0F:00.0"}, nil, boards.DGX,
			[]string{"pci0000:02=-1: 0000:07:00.0", "pci0000:0a=-1: 0000:0F:00.0"}},
		{"GPUs too close share the host bridge before them", h100,
			[]string{"00000000:1A:00.0", "00000000:1B:00.0", "00000000:4A:00.0"}, nil, boards.HGX,
			[]string{"pci0000:17=-1: 0000:1A:00.0 0000:1B:00.0", "pci0000:47=-1: 0000:4A:00.0"}},
		{"the gap limits the host bridge", h100,
			[]string{"00000000:18:00.0", "00000000:1A:00.0"}, nil, boards.HGX,
			[]string{"pci0000:15=-1: 0000:18:00.0", "pci0000:19=-1: 0000:1A:00.0"}},
		{"GPUs on one bus share it (AWS p4d)", a100,
			[]string{"00000000:10:1C.0", "00000000:10:1D.0"}, nil, boards.DGX,
			[]string{"pci0000:0b=-1: 0000:10:1C.0 0000:10:1D.0"}},
		{"bus 01 gets the host bridge at 00", h100,
			[]string{"00000000:01:00.0"}, nil, boards.HGX,
			[]string{"pci0000:00=-1: 0000:01:00.0"}},
		{"cloud VM: GPUs on bus 00 are flat on the root bus", t4,
			[]string{"00000000:00:1E.0", "00000000:00:1B.0"}, nil, boards.Flat,
			[]string{"pci0000:00=-1: 0000:00:1B.0 0000:00:1E.0"}},
		{"a VM GPU makes the whole profile flat", h100,
			[]string{"00000000:00:05.0", "00000000:3B:00.0"}, nil, boards.Flat,
			[]string{"pci0000:00=-1: 0000:00:05.0", "pci0000:3a=-1: 0000:3B:00.0"}},
		{"domains get their own host bridges (Azure)", a100,
			[]string{"00000002:00:00.0", "00000001:00:00.0"}, nil, boards.Flat,
			[]string{"pci0001:00=-1: 0001:00:00.0", "pci0002:00=-1: 0002:00:00.0"}},
		{"per-domain", h100,
			[]string{"00000000:18:00.0", "00000000:2A:00.0", "00000003:05:00.0"},
			func(o *capture.Options) { o.RootComplexes = capture.PerDomain }, boards.HGX,
			[]string{"pci0000:00=-1: 0000:18:00.0 0000:2A:00.0", "pci0003:00=-1: 0003:05:00.0"}},
		{"numa node", h100, []string{"00000000:18:00.0"},
			func(o *capture.Options) { o.NUMANode = 1 }, boards.HGX,
			[]string{"pci0000:15=1: 0000:18:00.0"}},
		{"forced hierarchy changes the spacing", h100, []string{"00000000:18:00.0"},
			func(o *capture.Options) { o.Hierarchy = boards.Flat }, boards.Flat,
			[]string{"pci0000:17=-1: 0000:18:00.0"}},
		{"explicit host bridges", h100,
			[]string{"00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0"},
			func(o *capture.Options) {
				o.Explicit = []capture.RootComplexSpec{rcSpec(t, "pci0000:80=1"), rcSpec(t, "pci0000:00")}
				o.NUMANode = 0
			}, boards.HGX,
			[]string{"pci0000:00=0: 0000:18:00.0 0000:2A:00.0", "pci0000:80=1: 0000:9A:00.0"}},
		{"explicit host bridge on a GPU's bus makes it flat", t4,
			[]string{"00000000:3B:00.0"},
			func(o *capture.Options) { o.Explicit = []capture.RootComplexSpec{rcSpec(t, "pci0000:3b")} }, boards.Flat,
			[]string{"pci0000:3b=-1: 0000:3B:00.0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := capture.DefaultOptions()
			if tc.opts != nil {
				tc.opts(&opts)
			}
			res, err := synthCaptureOf(t, tc.device, tc.buses...).Profile(opts)
			require.NoError(t, err)
			require.Equal(t, string(tc.hierarchy), res.Profile.PCIeTopology.Hierarchy)
			require.Equal(t, tc.hierarchy, res.Machine.Hierarchy)
			require.Equal(t, tc.want, topology(res.Profile))
		})
	}
}

func TestProfileErrors(t *testing.T) {
	tests := []struct {
		name  string
		buses []string
		opts  func(o *capture.Options)
		want  string
	}{
		{"no host bridge covers a GPU", []string{"00000000:18:00.0", "00000001:18:00.0"},
			func(o *capture.Options) { o.Explicit = []capture.RootComplexSpec{rcSpec(t, "pci0000:00")} },
			`nvidia-smi capture test.xml: gpu 00000001:18:00.0: value "0001:18:00.0": no given root complex of domain 0001 has a root bus at or below bus 18`},
		{"non-flat hierarchy with a GPU on the root bus", []string{"00000000:00:1E.0"},
			func(o *capture.Options) { o.Hierarchy = boards.HGX },
			`nvidia-smi capture test.xml: gpu 0000:00:1e.0: value "hgx": the GPU sits on the root bus of pci0000:00, where only the flat hierarchy puts a GPU`},
		{"host bridge twice", []string{"00000000:18:00.0"},
			func(o *capture.Options) {
				o.Explicit = []capture.RootComplexSpec{rcSpec(t, "pci0000:00"), rcSpec(t, "pci0000:00=1")}
			}, `root complex pci0000:00 given twice`},
		{"unknown inference", []string{"00000000:18:00.0"},
			func(o *capture.Options) { o.RootComplexes = "per-socket" },
			`root complex inference "per-socket": want one of [per-gpu per-domain]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := capture.DefaultOptions()
			tc.opts(&opts)
			_, err := synthCaptureOf(t, "233010DE", tc.buses...).Profile(opts)
			require.EqualError(t, err, tc.want)
		})
	}
}

func TestParseRootComplexSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    pciaddr.RootComplex
		numa    *int
		wantErr string
	}{
		{"pci0000:15", pciaddr.RootComplex{Bus: 0x15}, nil, ""},
		{"PCI0001:A0=3", pciaddr.RootComplex{Domain: 1, Bus: 0xa0}, p(3), ""},
		{"pci0000:80=-1", pciaddr.RootComplex{Bus: 0x80}, p(-1), ""},
		{"pci0000:80=x", pciaddr.RootComplex{}, nil, `"pci0000:80=x": the NUMA node after = is -1 or 0..1023`},
		{"pci0000:80=2000", pciaddr.RootComplex{}, nil, `the NUMA node after = is -1 or 0..1023`},
		{"0000:80", pciaddr.RootComplex{}, nil, `is not a root complex id: want pciDDDD:BB`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := capture.ParseRootComplexSpec(tc.in)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got.ID)
			require.Equal(t, tc.numa, got.NUMANode)
		})
	}
}

// TestProfileHoistsShared checks that shared values go to device_defaults
// and differing ones stay with their device.
func TestProfileHoistsShared(t *testing.T) {
	a := gpu("00000000:18:00.0", "233010DE", "16C110DE", "131072 MiB")
	b := gpu("00000000:2A:00.0", "233010DE", "16C110DE", "131072 MiB")
	b.curWidth = "8x"
	b.name = "NVIDIA Other"
	c, err := capture.ParseNvidiaSMI(strings.NewReader(synthCapture(a, b)), "test.xml")
	require.NoError(t, err)
	res, err := c.Profile(capture.DefaultOptions())
	require.NoError(t, err)
	def := res.Profile.DeviceDefaults
	require.Equal(t, profile.Pack(0x10de, 0x2330), def.PCI.DeviceID)
	require.Equal(t, p(16), def.PCIe.MaxLinkWidth)
	require.Nil(t, def.PCIe.CurrentLinkWidth)
	require.Empty(t, def.Name)
	require.Equal(t, []string{"NVIDIA Test GPU", "NVIDIA Other"}, []string{res.Profile.Devices[0].Name, res.Profile.Devices[1].Name})
	require.Equal(t, []*int{p(16), p(8)}, []*int{res.Profile.Devices[0].PCIe.CurrentLinkWidth, res.Profile.Devices[1].PCIe.CurrentLinkWidth})
	require.Nil(t, res.Profile.Devices[0].PCI.DeviceID)
}
