package fidelity_test

import (
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/fidelity"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

func byAttribute(rows []fidelity.Row) map[string]fidelity.Row {
	out := map[string]fidelity.Row{}
	for _, r := range rows {
		out[r.Attribute] = r
	}
	return out
}

// renderedGaps is what a rendered GPU lacks of a real one, and why:
// dma masks and MSI vectors depend on the driver, reset_method on the
// board, resourceN and rom would have to be files as large as the BARs,
// and power/ is runtime PM state.
func renderedGaps() []string {
	return []string{"consistent_dma_mask_bits", "dma_mask_bits", "power", "msi_irqs", "reset_method", "resource0", "rom"}
}

// TestRenderedProfiles checks every device of every built-in render: no
// attribute different, every consumer's attribute present, and exactly the
// known gaps missing.
func TestRenderedProfiles(t *testing.T) {
	for _, name := range []string{"dgx-a100", "hgx-h100", "gb200-tray", "t4-vm"} {
		t.Run(name, func(t *testing.T) {
			m, err := overlay.LoadMachine(name, "")
			require.NoError(t, err)
			root, _ := overlaytest.Render(t, m, plan.Options{})
			rows := fidelity.CheckMachine(os.DirFS(filepath.Join(root, "sys")), m)
			require.Len(t, rows, len(m.Devices)*len(fidelity.Attributes()))
			for _, r := range rows {
				require.False(t, r.Failing(), "%+v", r)
				if r.Status == fidelity.Missing {
					require.Contains(t, renderedGaps(), r.Attribute, "%s lacks %s", r.Device, r.Attribute)
				} else {
					require.NotContains(t, renderedGaps(), r.Attribute, "%s now has %s: update the list of gaps", r.Device, r.Attribute)
				}
			}
		})
	}
}

// realGPU writes a GPU directory as a real HGX H100 node shows it, from the
// facts in REAL-HARDWARE.md, with its driver, group and subsystem.
func realGPU() fstest.MapFS {
	cfg := make([]byte, sysfs.ConfigSize)
	binary.LittleEndian.PutUint16(cfg[sysfs.ConfigVendorID:], 0x10de)
	binary.LittleEndian.PutUint16(cfg[sysfs.ConfigDeviceID:], 0x2330)
	binary.LittleEndian.PutUint16(cfg[sysfs.ConfigCommand:], 0x0547)
	binary.LittleEndian.PutUint16(cfg[sysfs.ConfigStatus:], 0x0010)
	cfg[sysfs.ConfigRevision] = 0xa1
	cfg[sysfs.ConfigClass], cfg[sysfs.ConfigClass+1], cfg[sysfs.ConfigClass+2] = 0x00, 0x02, 0x03
	// PM at 0x40, MSI at 0x48, PCI Express at 0x60, as an H100 lists them.
	cfg[sysfs.ConfigCapPointer] = 0x40
	cfg[0x40], cfg[0x41] = 0x01, 0x48
	cfg[0x48], cfg[0x49] = 0x05, 0x60
	cfg[0x60], cfg[0x61] = 0x10, 0x00
	binary.LittleEndian.PutUint32(cfg[0x60+sysfs.PCIeLinkCap:], 5|16<<4)
	const dir = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	link := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s), Mode: fs.ModeSymlink} }
	res := "0x000020a000000000 0x000020a000ffffff 0x000000000014220c\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x0000208000000000 0x0000209fffffffff 0x000000000014220c\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x000020a002000000 0x000020a003ffffff 0x000000000014220c\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x00000000e0000000 0x00000000e007ffff 0x0000000000046200\n"
	return fstest.MapFS{
		sysfs.LinksDir + "/0000:18:00.0":              link("../../../" + dir),
		"bus/pci/drivers/nvidia/bind":                 file(""),
		"kernel/iommu_groups/30/devices/0000:18:00.0": link("../../../../" + dir),
		dir + "/vendor":                               file("0x10de\n"),
		dir + "/device":                               file("0x2330\n"),
		dir + "/subsystem_vendor":                     file("0x10de\n"),
		dir + "/subsystem_device":                     file("0x16c1\n"),
		dir + "/class":                                file("0x030200\n"),
		dir + "/revision":                             file("0xa1\n"),
		dir + "/numa_node":                            file("0\n"),
		dir + "/irq":                                  file("21\n"),
		dir + "/resource":                             file(res),
		dir + "/config":                               {Data: cfg},
		dir + "/modalias":                             file("pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00\n"),
		dir + "/local_cpus":                           file("00000000,0000ffff\n"),
		dir + "/local_cpulist":                        file("0-15\n"),
		dir + "/enable":                               file("1\n"),
		dir + "/power_state":                          file("D0\n"),
		dir + "/d3cold_allowed":                       file("1\n"),
		dir + "/uevent":                               file("DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SUBSYS_ID=10DE:16C1\nPCI_SLOT_NAME=0000:18:00.0\nMODALIAS=pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00\n"),
		dir + "/broken_parity_status":                 file("0\n"),
		dir + "/msi_bus":                              file("1\n"),
		dir + "/driver_override":                      file("(null)\n"),
		dir + "/ari_enabled":                          file("0\n"),
		dir + "/consistent_dma_mask_bits":             file("47\n"),
		dir + "/dma_mask_bits":                        file("47\n"),
		dir + "/subsystem":                            link("../../../../../../bus/pci"),
		dir + "/power/control":                        file("on\n"),
		dir + "/driver":                               link("../../../../../../bus/pci/drivers/nvidia"),
		dir + "/iommu_group":                          link("../../../../../../kernel/iommu_groups/30"),
		dir + "/current_link_speed":                   file("32.0 GT/s PCIe\n"),
		dir + "/max_link_speed":                       file("32.0 GT/s PCIe\n"),
		dir + "/current_link_width":                   file("16\n"),
		dir + "/max_link_width":                       file("16\n"),
		dir + "/msi_irqs/120":                         file("msix\n"),
		dir + "/reset_method":                         file("bus\n"),
		dir + "/resource0":                            file(""),
		dir + "/rom":                                  file(""),
	}
}

func h100Expect() *fidelity.Expect {
	return fidelity.ExpectFor(profile.Device{
		Kind: profile.GPU, Vendor: 0x10de, DeviceID: 0x2330, SubsystemVendor: 0x10de, SubsystemDevice: 0x16c1,
		Class: 0x030200, Revision: 0xa1, NUMANode: 0, BAR1Bytes: 128 << 30,
		Link: profile.Link{MaxGen: 5, CurrentGen: 5, MaxWidth: 16, CurrentWidth: 16},
	})
}

const gpuDir = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"

func TestRealGPUIsPresentThroughout(t *testing.T) {
	for _, exp := range []*fidelity.Expect{nil, h100Expect()} {
		rows := fidelity.Check(realGPU(), sysfs.LinksDir+"/0000:18:00.0", exp)
		for _, r := range rows {
			require.Equal(t, fidelity.Present, r.Status, "%+v", r)
		}
		require.Equal(t, "7 lines, BARs 0:16M 64-bit pref, 2:128G 64-bit pref, 4:32M 64-bit pref", byAttribute(rows)["resource"].Detail)
	}
}

// TestCheckFindsDifferences breaks one thing at a time in a real-looking
// GPU and expects exactly that attribute to turn different or missing.
func TestCheckFindsDifferences(t *testing.T) {
	set := func(name, value string) func(fstest.MapFS) {
		return func(m fstest.MapFS) { m[gpuDir+"/"+name] = &fstest.MapFile{Data: []byte(value)} }
	}
	tests := []struct {
		name      string
		mutate    func(fstest.MapFS)
		attribute string
		status    fidelity.Status
		detail    string
		also      []string // attributes whose cross-checks see the same break
	}{
		{"wrong class", set("class", "0x038000\n"), "class", fidelity.Different, "0x038000, profile says 0x030200", []string{"config", "modalias"}},
		{"class without newline", set("class", "0x030200"), "class", fidelity.Different, "no trailing newline", nil},
		{"upper-case vendor", set("vendor", "0x10DE\n"), "vendor", fidelity.Different, "is not in the kernel's format", []string{"config"}},
		{"other subsystem", set("subsystem_device", "0x1658\n"), "subsystem_device", fidelity.Different, "0x1658, profile says 0x16c1", []string{"modalias"}},
		{"numa", set("numa_node", "1\n"), "numa_node", fidelity.Different, "1, profile says 0", nil},
		{"four fields", set("resource", "0x0 0x0 0x0 0x0\n"), "resource", fidelity.Different, "go-nvlib wants exactly 3 space-separated fields", nil},
		{"BAR1 smaller", set("resource", "0x000020a000000000 0x000020a000ffffff 0x000000000014220c\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n0x0000208000000000 0x000020800fffffff 0x000000000014220c\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n0x000020a002000000 0x000020a003ffffff 0x000000000014220c\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n"),
			"resource", fidelity.Different, "BARs 0:16M 64-bit pref, 2:256M 64-bit pref, 4:32M 64-bit pref, want 0:16M 64-bit pref, 2:128G 64-bit pref, 4:32M 64-bit pref", nil},
		{"short config", set("config", "\x00"), "config", fidelity.Different, "1 bytes; the kernel shows at least 256", nil},
		{"lower-case modalias", set("modalias", "pci:v000010ded00002330sv000010DEsd000016C1bc03sc02i00\n"), "modalias", fidelity.Different, "is not in the kernel's format", []string{"uevent"}},
		{"modalias of another board", set("modalias", "pci:v000010DEd00002331sv000010DEsd000016C1bc03sc02i00\n"), "modalias", fidelity.Different, "the id files make pci:v000010DEd00002330", []string{"uevent"}},
		{"local_cpus disagrees", set("local_cpus", "00000000,000000ff\n"), "local_cpus", fidelity.Different, "is CPUs 0-7, local_cpulist says 0-15", nil},
		{"slow link", set("current_link_speed", "16.0 GT/s PCIe\n"), "current_link_speed", fidelity.Different, "16.0 GT/s PCIe (Gen4), profile says Gen5", nil},
		{"narrow link", set("current_link_width", "8\n"), "current_link_width", fidelity.Different, "x8, profile says x16", nil},
		{"uevent slot", set("uevent", "PCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SUBSYS_ID=10DE:16C1\nPCI_SLOT_NAME=0000:19:00.0\nMODALIAS=pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00\nDRIVER=nvidia\n"), "uevent", fidelity.Different, "PCI_SLOT_NAME 0000:19:00.0 is not 0000:18:00.0", nil},
		{"dangling driver", func(m fstest.MapFS) { delete(m, "bus/pci/drivers/nvidia/bind") }, "driver", fidelity.Different, "does not resolve", nil},
		{"driver link climbing out of sysfs", func(m fstest.MapFS) {
			m[gpuDir+"/driver"] = &fstest.MapFile{Data: []byte("../../../../../../../bus/pci/drivers/nvidia"), Mode: fs.ModeSymlink}
		}, "driver", fidelity.Different, "climbs 7 levels from a directory 6 below sys/", nil},
		{"vfio instead of nvidia", func(m fstest.MapFS) {
			m["bus/pci/drivers/vfio-pci/bind"] = &fstest.MapFile{}
			m[gpuDir+"/driver"] = &fstest.MapFile{Data: []byte("../../../../../../bus/pci/drivers/vfio-pci"), Mode: fs.ModeSymlink}
		}, "driver", fidelity.Different, "want driver nvidia", []string{"uevent"}},
		{"group without the device", func(m fstest.MapFS) {
			delete(m, "kernel/iommu_groups/30/devices/0000:18:00.0")
			m["kernel/iommu_groups/30/type"] = &fstest.MapFile{}
		}, "iommu_group", fidelity.Different, "the group's devices/ does not list 0000:18:00.0", nil},
		{"driver as a file", set("driver", "nvidia"), "driver", fidelity.Different, "a file, want a link", nil},
		{"no vendor", func(m fstest.MapFS) { delete(m, gpuDir+"/vendor") }, "vendor", fidelity.Missing, "", nil},
		{"no power_state", func(m fstest.MapFS) { delete(m, gpuDir+"/power_state") }, "power_state", fidelity.Missing, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := realGPU()
			tc.mutate(m)
			rows := fidelity.Check(m, sysfs.LinksDir+"/0000:18:00.0", h100Expect())
			for _, r := range rows {
				if r.Attribute == tc.attribute {
					require.Equal(t, tc.status, r.Status, "%+v", r)
					require.Contains(t, r.Detail, tc.detail)
					continue
				}
				if slices.Contains(tc.also, r.Attribute) {
					require.Equal(t, fidelity.Different, r.Status, "%+v", r)
					continue
				}
				require.Equal(t, fidelity.Present, r.Status, "only %s should change: %+v", tc.attribute, r)
			}
		})
	}
}

func TestFailing(t *testing.T) {
	tests := []struct {
		need   fidelity.Need
		status fidelity.Status
		fail   bool
	}{
		{fidelity.Consumer, fidelity.Present, false},
		{fidelity.Consumer, fidelity.Missing, true},
		{fidelity.Consumer, fidelity.Different, true},
		{fidelity.Kernel, fidelity.Present, false},
		{fidelity.Kernel, fidelity.Missing, false},
		{fidelity.Kernel, fidelity.Different, true},
	}
	for _, tc := range tests {
		require.Equal(t, tc.fail, fidelity.Row{Need: tc.need, Status: tc.status}.Failing(), "%s %s", tc.need, tc.status)
	}
}

// TestHostKernelAgrees checks the attribute list and its format checks
// against this machine's real kernel: every attribute the list gives every
// PCI function is there, and nothing the kernel wrote reads as different.
func TestHostKernelAgrees(t *testing.T) {
	entries, err := os.ReadDir(sysfs.KernelLinksDir)
	if err != nil || len(entries) == 0 {
		overlaytest.Missing(t, "this machine shows no PCI devices in %s (%v)", sysfs.KernelLinksDir, err)
	}
	kernel := os.DirFS(sysfs.Mount)
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) {
			for _, r := range fidelity.Check(kernel, sysfs.LinksDir+"/"+e.Name(), nil) {
				require.NotEqual(t, fidelity.Different, r.Status, "%+v", r)
				if r.Scope == fidelity.Every {
					require.Equal(t, fidelity.Present, r.Status, "the kernel shows %s for every function: %+v", r.Attribute, r)
				}
			}
		})
	}
}

// TestExpectForBoards checks that the expectation follows the board's BAR
// layout and the device's kind.
func TestExpectForBoards(t *testing.T) {
	gpu := fidelity.ExpectFor(profile.Device{Kind: profile.GPU, DeviceID: 0x20b0, BAR1Bytes: 64 << 30})
	require.Equal(t, boards.BARs("", 0x20b0, 64<<30), gpu.BARs)
	require.Equal(t, profile.DriverNVIDIA, gpu.Driver)
	sw := fidelity.ExpectFor(profile.Device{Kind: profile.NVSwitch, DeviceID: 0x22a3})
	require.Nil(t, sw.BARs)
	require.Equal(t, profile.DriverNVSwitch, sw.Driver)
	// The device's own driver wins: a passthrough GPU is on vfio-pci.
	vfio := fidelity.ExpectFor(profile.Device{Kind: profile.GPU, DeviceID: 0x2330, Driver: profile.DriverVFIO})
	require.Equal(t, profile.DriverVFIO, vfio.Driver)
}

// TestByteSize pins both spellings: fidelity's rows ("64G", as lspci) and
// compat's matrix ("64 GiB") share ByteSize.
func TestByteSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n          uint64
		short, iec string
	}{
		{64 << 30, "64G", "64 GiB"}, {2 << 40, "2T", "2 TiB"}, {16 << 20, "16M", "16 MiB"},
		{32 << 10, "32K", "32768 B"}, {1025 << 20, "1025M", "1025 MiB"}, {100, "100", "100 B"}, {0, "0", "0 B"},
	} {
		require.Equal(t, c.short, fidelity.ByteSize(c.n, fidelity.Short), "%d", c.n)
		require.Equal(t, c.iec, fidelity.ByteSize(c.n, fidelity.IEC), "%d", c.n)
	}
}
