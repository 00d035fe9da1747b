package consumers_test

// The checks of issue 26 in the real programs: GPU Feature Discovery's
// vfio strategy on a passthrough node.

import (
	"fmt"
	"math/bits"
	"strconv"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
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
func gfdVFIO(t *testing.T, x *subject, s *suite, served map[string]overlaytest.Served, row func(string) *row) {
	t.Helper()
	var vfio []profile.Device
	for _, g := range x.gpus {
		if g.Driver == profile.DriverVFIO {
			vfio = append(vfio, g)
		}
	}
	for _, name := range []string{servedTree, servedNone} {
		labels := s.runGFD(t, served[name], x.File, "vfio")
		count, memory, product := labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"], labels["nvidia.com/gpu.product"]
		if name == servedNone || len(vfio) == 0 {
			none := count == "" || count == "0"
			row(name).check(t, colGFDVFIO, "no GPUs (none bound to vfio-pci)", none,
				fmt.Sprintf("GFD's vfio strategy labelled gpu.count=%s on a node with no GPU bound to vfio-pci", count))
			continue
		}
		_, mem64 := boards.BARTotals(vfio[0].Name, vfio[0].DeviceID, vfio[0].BAR1Bytes)
		wantMemory := strconv.FormatUint(uint64(1)<<bits.Len64(mem64-1), 10)
		ok := count == strconv.Itoa(len(vfio)) && memory == wantMemory && product != ""
		row(name).check(t, colGFDVFIO, fmt.Sprintf("count %s, %s, memory %s", count, product, memory), ok,
			fmt.Sprintf("want gpu.count=%d, gpu.memory=%s (the BARs' 64-bit total, rounded up to a power of two) and a gpu.product; labels %v", len(vfio), wantMemory, labels))
	}
}
