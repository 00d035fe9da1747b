package capture_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/capture"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
)

func addr(t *testing.T, s string) pciaddr.Address {
	t.Helper()
	a, err := pciaddr.Parse(s)
	require.NoError(t, err)
	return a
}

func p[T any](v T) *T { return &v }

func TestParseNvidiaSMIFields(t *testing.T) {
	oldStyle := gpu("0000:0A:00.0", "0x1DB510DE", "0x124910DE", "32768 MiB")
	oldStyle.baseClass, oldStyle.subClass = "", "" // older nvidia-smi writes no class
	vga := gpu("00000000:65:00.0", "26B910DE", "185110DE", "65536 MiB")
	vga.subClass = "0"
	na := gpu("00000000:3b:00.0", "20B510DE", "N/A", "N/A")
	na.maxGen, na.curGen, na.curWidth = "N/A", "[N/A]", "Not Supported"
	noBAR := gpu("00000001:00:00.0", "20B510DE", "153310DE", "")
	noBAR.noBAR1 = true
	noBAR.id = "00000001:00:00.0"
	lower := gpu("0000:b1:00.0", "1eb810de", "12a210de", "256 MiB")
	lower.curWidth = "8x"
	onlyID := gpu("", "233010DE", "16C110DE", "131072 MiB")
	onlyID.id, onlyID.busID = "00000000:18:00.0", "N/A"

	tests := []struct {
		name string
		gpu  synthGPU
		want capture.GPU
	}{
		{"current format", gpu("00000000:06:00.0", "20B010DE", "134F10DE", "65536 MiB"), capture.GPU{
			Address: addr(t, "0000:06:00.0"), BusID: "00000000:06:00.0", Name: "NVIDIA Test GPU", Vendor: 0x10de, Device: 0x20b0,
			SubsystemVendor: p(uint16(0x10de)), SubsystemDevice: p(uint16(0x134f)), Class: p(uint32(0x030200)), BAR1Bytes: p(uint64(64 << 30)),
			MaxLinkGen: p(4), CurrentLinkGen: p(4), MaxLinkWidth: p(16), CurrentLinkWidth: p(16),
		}},
		{"older format: 0x ids, no class, 4-digit domain", oldStyle, capture.GPU{
			Address: addr(t, "0000:0a:00.0"), BusID: "0000:0A:00.0", Name: "NVIDIA Test GPU", Vendor: 0x10de, Device: 0x1db5,
			SubsystemVendor: p(uint16(0x10de)), SubsystemDevice: p(uint16(0x1249)), BAR1Bytes: p(uint64(32 << 30)),
			MaxLinkGen: p(4), CurrentLinkGen: p(4), MaxLinkWidth: p(16), CurrentLinkWidth: p(16),
		}},
		{"VGA class", vga, capture.GPU{
			Address: addr(t, "0000:65:00.0"), BusID: "00000000:65:00.0", Name: "NVIDIA Test GPU", Vendor: 0x10de, Device: 0x26b9,
			SubsystemVendor: p(uint16(0x10de)), SubsystemDevice: p(uint16(0x1851)), Class: p(uint32(0x030000)), BAR1Bytes: p(uint64(64 << 30)),
			MaxLinkGen: p(4), CurrentLinkGen: p(4), MaxLinkWidth: p(16), CurrentLinkWidth: p(16),
		}},
		{"N/A fields", na, capture.GPU{
			Address: addr(t, "0000:3b:00.0"), BusID: "00000000:3b:00.0", Name: "NVIDIA Test GPU", Vendor: 0x10de, Device: 0x20b5,
			Class: p(uint32(0x030200)), MaxLinkWidth: p(16),
		}},
		{"no BAR1 element, domain 1", noBAR, capture.GPU{
			Address: addr(t, "0001:00:00.0"), BusID: "00000001:00:00.0", Name: "NVIDIA Test GPU", Vendor: 0x10de, Device: 0x20b5,
			SubsystemVendor: p(uint16(0x10de)), SubsystemDevice: p(uint16(0x1533)), Class: p(uint32(0x030200)),
			MaxLinkGen: p(4), CurrentLinkGen: p(4), MaxLinkWidth: p(16), CurrentLinkWidth: p(16),
		}},
		{"lower case", lower, capture.GPU{
			Address: addr(t, "0000:b1:00.0"), BusID: "0000:b1:00.0", Name: "NVIDIA Test GPU", Vendor: 0x10de, Device: 0x1eb8,
			SubsystemVendor: p(uint16(0x10de)), SubsystemDevice: p(uint16(0x12a2)), Class: p(uint32(0x030200)), BAR1Bytes: p(uint64(256 << 20)),
			MaxLinkGen: p(4), CurrentLinkGen: p(4), MaxLinkWidth: p(16), CurrentLinkWidth: p(8),
		}},
		{"bus id only in the gpu id attribute", onlyID, capture.GPU{
			Address: addr(t, "0000:18:00.0"), BusID: "00000000:18:00.0", Name: "NVIDIA Test GPU", Vendor: 0x10de, Device: 0x2330,
			SubsystemVendor: p(uint16(0x10de)), SubsystemDevice: p(uint16(0x16c1)), Class: p(uint32(0x030200)), BAR1Bytes: p(uint64(128 << 30)),
			MaxLinkGen: p(4), CurrentLinkGen: p(4), MaxLinkWidth: p(16), CurrentLinkWidth: p(16),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := capture.ParseNvidiaSMI(strings.NewReader(synthCapture(tc.gpu)), "test.xml")
			require.NoError(t, err)
			require.Equal(t, "570.148.08", c.DriverVersion)
			require.Len(t, c.GPUs, 1)
			require.Equal(t, tc.want, c.GPUs[0])
		})
	}
}

func TestParseNvidiaSMIEncodings(t *testing.T) {
	g := gpu("00000000:06:00.0", "20B010DE", "134F10DE", "65536 MiB")
	g.curWidth = "x8"
	body := strings.TrimPrefix(synthCapture(g), `<?xml version="1.0" ?>`)
	for _, decl := range []string{`<?xml version="1.0" encoding="UTF-8"?>`, `<?xml version="1.0" encoding="ISO-8859-1"?>`, ""} {
		t.Run(decl, func(t *testing.T) {
			c, err := capture.ParseNvidiaSMI(strings.NewReader(decl+body), "test.xml")
			require.NoError(t, err)
			require.Equal(t, p(8), c.GPUs[0].CurrentLinkWidth)
		})
	}
	_, err := capture.ParseNvidiaSMI(strings.NewReader(`<?xml version="1.0" encoding="UTF-16"?>`+body), "test.xml")
	require.ErrorContains(t, err, `encoding "UTF-16": want UTF-8, as nvidia-smi writes`)
}

func TestParseNvidiaSMINotes(t *testing.T) {
	g := gpu("00000000:06:00.0", "20B010DE", "134F10DE", "96000 MiB")
	g.curWidth = "0x"
	g.maxGen = "7"
	c, err := capture.ParseNvidiaSMI(strings.NewReader(synthCapture(g)), "test.xml")
	require.NoError(t, err)
	got := c.GPUs[0]
	require.Equal(t, p(uint64(96000<<20)), got.BAR1Bytes, "the normaliser rounds it up as firmware sizes a BAR")
	require.Nil(t, got.CurrentLinkWidth)
	require.Nil(t, got.MaxLinkGen)
	require.Equal(t, []string{
		`gpu[0] (00000000:06:00.0).bar1_memory_usage.total "96000 MiB" is not a power of two, as a BAR is; the next power of two is rendered`,
		`gpu[0] (00000000:06:00.0).pci.pci_gpu_link_info.pcie_gen.max_link_gen "7" is not a usable link value; the board's is rendered`,
		`gpu[0] (00000000:06:00.0).pci.pci_gpu_link_info.link_widths.current_link_width "0x" is not a usable link value; the board's is rendered`,
	}, got.Notes)
}

func TestParseNvidiaSMIErrors(t *testing.T) {
	good := gpu("00000000:06:00.0", "20B010DE", "134F10DE", "65536 MiB")
	with := func(f func(g *synthGPU)) string {
		g := good
		f(&g)
		return synthCapture(g)
	}
	tests := []struct {
		name, capture, want string
	}{
		{"not XML", "GPU 00000000:06:00.0\n", `nvidia-smi capture cap.xml: not an nvidia-smi -q -x log: EOF`},
		{"other XML", "<html><body/></html>", `nvidia-smi capture cap.xml: not an nvidia-smi -q -x log: expected element type <nvidia_smi_log> but have <html>`},
		{"no GPU", synthCapture(), `nvidia-smi capture cap.xml: no <gpu> element: capture nvidia-smi -q -x on a node with GPUs`},
		{"bad bus id", with(func(g *synthGPU) { g.busID, g.id = "0000:6:00.0", "" }), `nvidia-smi capture cap.xml: gpu[0].pci.pci_bus_id: value "0000:6:00.0": is not a PCI address (DDDD:BB:DD.F or 0000DDDD:BB:DD.F): the bus has 2 hex digits`},
		{"domain past 16 bits", with(func(g *synthGPU) { g.busID, g.id = "00010000:01:00.0", "" }), `gpu[0].pci.pci_bus_id: value "00010000:01:00.0": is not a PCI address (DDDD:BB:DD.F or 0000DDDD:BB:DD.F): an 8-digit domain must start with 0000`},
		{"no bus id at all", with(func(g *synthGPU) { g.busID, g.id = "", "" }), `gpu[0].pci.pci_bus_id: missing, and the <gpu> element has no id either`},
		{"id attribute disagrees", with(func(g *synthGPU) { g.id = "00000000:07:00.0" }), `gpu[0] (00000000:06:00.0).id: value "00000000:07:00.0": differs from pci.pci_bus_id 00000000:06:00.0`},
		{"not NVIDIA", with(func(g *synthGPU) { g.deviceID = "20B01002" }), `gpu[0] (00000000:06:00.0).pci.pci_device_id: value "20B01002": vendor 0x1002 is not NVIDIA (0x10de); the word is (device<<16)|vendor`},
		{"device id N/A", with(func(g *synthGPU) { g.deviceID = "N/A" }), `gpu[0] (00000000:06:00.0).pci.pci_device_id: value "N/A": missing: the device id is what the GPU is`},
		{"device id not hex", with(func(g *synthGPU) { g.deviceID = "20B0-10DE" }), `pci.pci_device_id: value "20B0-10DE": want a 32-bit hex number such as 20B010DE`},
		{"subsystem not hex", with(func(g *synthGPU) { g.subsystemID = "xyz" }), `pci.pci_sub_system_id: value "xyz": want a 32-bit hex number such as 20B010DE`},
		{"display controller class", with(func(g *synthGPU) { g.subClass = "80" }), `gpu[0] (00000000:06:00.0).pci.pci_base_class: value "3/80": class 0x038000 is not a GPU class nvml-mock-sysfs renders: 0x030200 (3D controller) or 0x030000 (VGA)`},
		{"duplicate GPU", synthCapture(good, good), `gpu[1].pci.pci_bus_id: value "00000000:06:00.0": the same PCI address as gpu[0]`},
		{"too large", synthCapture(good) + strings.Repeat(" ", capture.MaxCaptureSize), `nvidia-smi capture cap.xml: larger than the 64 MiB limit`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := capture.ParseNvidiaSMI(strings.NewReader(tc.capture), "cap.xml")
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), "\n", "one line")
			var ie *capture.Error
			require.ErrorAs(t, err, &ie)
		})
	}
}
