package consumermatrix_test

// The checks of issue 26 in the real programs: GPU Feature Discovery's
// vfio strategy on a passthrough node, and NVML paired with its sysfs
// (compareNVMLSysfs) where NVML lists the nvidia-bound GPUs alone.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// gfdVFIO runs GFD with --device-discovery-strategy vfio, which reads PCI
// sysfs alone through go-nvlib (the GPUs whose driver is vfio-pci): with
// the tree it must label the profile's vfio-bound GPUs, their count,
// product and memory; a profile with none, and the node without the tree,
// get no GPU labels (the negative controls). The memory GFD labels is
// go-nvlib's GetTotalAddressableMemory(true) of the GPU's BARs: their
// 64-bit total rounded up to a power of two, in bytes, though GFD's
// vfioDevice calls it MiB (GetTotalMemoryMiB).
func gfdVFIO(t *testing.T, x *subject, s *suite, served map[string]hosttest.Served, row func(string) *row) {
	t.Helper()
	var vfio []profilefacts.GPU
	for _, g := range x.gpus {
		if g.Driver == profilefacts.DriverVFIO {
			vfio = append(vfio, g)
		}
	}
	for _, name := range []string{servedTree, servedNone} {
		labels, failed := s.runGFD(t, served[name], x.nvml, "vfio")
		if failed != "" && name == servedTree {
			row(name).check(t, colGFDVFIO, "exits: "+failed, false, "GFD's vfio strategy failed: "+failed)
			continue
		}
		count, memory, product := labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"], labels["nvidia.com/gpu.product"]
		if name == servedNone || len(vfio) == 0 {
			none := count == "" || count == "0"
			row(name).check(t, colGFDVFIO, "no GPUs (none bound to vfio-pci)", none,
				fmt.Sprintf("GFD's vfio strategy labelled gpu.count=%s on a node with no GPU bound to vfio-pci", count))
			continue
		}
		wantProduct, wantMemory, known := vfioLabels(t, vfio[0])
		if !known {
			ok := count == strconv.Itoa(len(vfio)) && product != "" && memory != ""
			row(name).check(t, colGFDVFIO, fmt.Sprintf("count %s, %s, memory %s (no capture of %s: product and memory not compared)", count, product, memory, vfio[0].Name), ok,
				fmt.Sprintf("want gpu.count=%d, a gpu.product and a gpu.memory; labels %v", len(vfio), labels))
			continue
		}
		ok := count == strconv.Itoa(len(vfio)) && memory == wantMemory && product == wantProduct
		row(name).check(t, colGFDVFIO, fmt.Sprintf("count %s, %s, memory %s", count, product, memory), ok,
			fmt.Sprintf("want gpu.count=%d, gpu.product=%s (pci.ids) and gpu.memory=%s (twice the capture's BAR1); labels %v", len(vfio), wantProduct, wantMemory, labels))
	}
}

// vfioLabels are the product and memory GFD's vfio strategy must label a
// GPU with, from sources apart from this project's boards table: the
// product is pci.ids's name of its device (Debian's copy), in GFD's form;
// the memory is twice the BAR1 a real node of the same product reports
// (../shared's nvidia-smi capture): GFD labels the 64-bit BARs' total
// rounded up to a power of two, and BAR1, a power of two, with BAR3's few
// MiB beside it rounds up to twice itself. known is false for a GPU with
// no capture.
func vfioLabels(t *testing.T, g profilefacts.GPU) (product, memory string, known bool) {
	t.Helper()
	captures := map[string]struct{ file, product string }{
		// pci.ids: programs.H100SXM5PCIIDs.
		"NVIDIA H100 80GB HBM3": {"qx-h100.xml", "GH100H100-SXM5-80GB"},
	}
	c, ok := captures[g.Name]
	if !ok {
		return "", "", false
	}
	programs.RequirePCIIDsLine(t, programs.H100SXM5PCIIDs)
	xml, err := os.ReadFile(filepath.Join(overlaytest.SharedTestdata(t, "nvidia-smi-captures"), c.file))
	require.NoError(t, err)
	m := regexp.MustCompile(`<bar1_memory_usage>\s*<total>(\d+) MiB</total>`).FindSubmatch(xml)
	require.NotNil(t, m, "%s: no BAR1 total", c.file)
	bar1, err := strconv.ParseUint(string(m[1]), 10, 64)
	require.NoError(t, err)
	return c.product, strconv.FormatUint(2*bar1<<20, 10), true
}

// TestCompareNVMLSysfsPassthrough: on a passthrough node (three GPUs on
// vfio-pci, one on nvidia) NVML listing the nvidia-bound GPU alone pairs
// with the sysfs; NVML listing all four, as nvml-mock's does when served
// the whole profile, is refused, each vfio-pci GPU named; and NVML missing
// the nvidia-bound GPU is refused too.
func TestCompareNVMLSysfsPassthrough(t *testing.T) {
	const device, subsystem = 0x233010de, 0x16c110de
	addrs := []string{"0000:18:00.0", "0000:2a:00.0", "0000:ba:00.0", "0000:db:00.0"}
	sysfs := map[string]sysfsGPU{}
	var nvmlAll []programs.NVMLDevice
	x := &subject{vfio: 3}
	for i, a := range addrs {
		driver := profile.DriverVFIO
		if i == 3 {
			driver = profile.DriverNVIDIA
			x.nvmlGPUs = append(x.nvmlGPUs, profilefacts.GPU{BusID: a, Driver: driver})
		}
		sysfs[a] = sysfsGPU{Address: a, Device: device, SubsystemID: subsystem, Class: 0x030200, Driver: driver}
		nvmlAll = append(nvmlAll, programs.NVMLDevice{Index: i, BusID: "0000" + strings.ToUpper(a), DeviceID: device, SubsystemID: subsystem})
	}
	x.gpus = x.nvmlGPUs

	text, ok, why := compareNVMLSysfs(x, []programs.NVMLDevice{{BusID: "00000000:DB:00.0", DeviceID: device, SubsystemID: subsystem}}, sysfs)
	require.True(t, ok, why)
	require.Equal(t, "1 of NVML's 1 in sysfs's 1 (besides 3 on vfio-pci)", text)

	_, ok, why = compareNVMLSysfs(x, nvmlAll, sysfs)
	require.False(t, ok)
	require.Equal(t, 3, strings.Count(why, "which sysfs binds to vfio-pci"), why)
	require.Contains(t, why, "NVML reports 0000:18:00.0 (device 233010de), which sysfs binds to vfio-pci")
	require.Contains(t, why, "NVML reports 4 GPUs, the profile has 1 not bound to vfio-pci")

	_, ok, why = compareNVMLSysfs(x, nil, sysfs)
	require.False(t, ok)
	require.Contains(t, why, "sysfs shows GPU 0000:db:00.0, NVML reports none there")

	// Each id is compared: another device, another subsystem; NVML's
	// subsystem 0 (a profile that gives none) is not.
	one := func(d programs.NVMLDevice) (bool, string) {
		_, ok, why := compareNVMLSysfs(x, []programs.NVMLDevice{d}, sysfs)
		return ok, why
	}
	ok, why = one(programs.NVMLDevice{BusID: "00000000:DB:00.0", DeviceID: 0x233110de, SubsystemID: subsystem})
	require.False(t, ok)
	require.Contains(t, why, "0000:db:00.0: NVML reports device 233110de, sysfs 233010de")
	ok, why = one(programs.NVMLDevice{BusID: "00000000:DB:00.0", DeviceID: device, SubsystemID: 0x16c210de})
	require.False(t, ok)
	require.Contains(t, why, "0000:db:00.0: NVML reports subsystem 16c210de, sysfs 16c110de")
	ok, why = one(programs.NVMLDevice{BusID: "00000000:DB:00.0", DeviceID: device})
	require.True(t, ok, why)
}
