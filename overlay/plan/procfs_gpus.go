package plan

import (
	"cmp"
	"fmt"
	"path"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// NVIDIAGPUsDir is /proc/driver/nvidia/gpus: a directory per GPU bound to
// nvidia, named by its address, holding its information file.
const NVIDIAGPUsDir = ProcDir + "/driver/nvidia/gpus"

// What a GPU's information file says that no profile states: fixed
// stand-ins of the driver's own form (kernel-open/nvidia/nv-procfs.c).
const (
	// videoBIOSUnread is what the driver prints for a VBIOS it could not
	// read: the profile's vbios_version is not carried to the plan.
	videoBIOSUnread = "??.??.??.??.??"
	// gpuDMASize and gpuDMAMask are an H100's, on the 580.105.08 open
	// module (as nvml-mock's capture of an 8-GPU node reports them).
	gpuDMASize = 52
	gpuDMAMask = "0xfffffffffffff"
)

// GPUInformationText is /proc/driver/nvidia/gpus/<bdf>/information for
// the GPU d, rendered at irq, of a driver of version v, in the driver's
// layout (nv-procfs.c): each field's name and a tab-aligned value. Model
// is the name NVML reports, UUID and Device Minor NVML's (Device.UUID,
// Minor); Bus Type is PCIe, as for every GPU with a PCIe capability; GPU
// Firmware, which a driver running GSP firmware prints, is the driver's
// version, which the firmware's follows; GPU Excluded is No.
func GPUInformationText(d *profile.Device, irq int, v string) string {
	var buf strings.Builder
	fmt.Fprintf(&buf, "Model: \t\t %s\n", cmp.Or(d.Name, profile.MockNVMLName))
	fmt.Fprintf(&buf, "IRQ:   \t\t %d\n", irq)
	fmt.Fprintf(&buf, "GPU UUID: \t %s\n", d.UUID)
	fmt.Fprintf(&buf, "Video BIOS: \t %s\n", videoBIOSUnread)
	fmt.Fprintf(&buf, "Bus Type: \t PCIe\n")
	fmt.Fprintf(&buf, "DMA Size: \t %d bits\n", gpuDMASize)
	fmt.Fprintf(&buf, "DMA Mask: \t %s\n", gpuDMAMask)
	fmt.Fprintf(&buf, "Bus Location: \t %s\n", d.Address)
	fmt.Fprintf(&buf, "Device Minor: \t %d\n", d.Minor)
	fmt.Fprintf(&buf, "GPU Firmware: \t %s\n", v)
	fmt.Fprintf(&buf, "GPU Excluded:\t No\n")
	return buf.String()
}

// gpuInformation plans an information file per GPU the tree shows bound
// to nvidia (the written state's driver, so a GPU a write moved to
// vfio-pci has none, as the driver removes a GPU's directory when it lets
// go of it).
func (b *builder) gpuInformation() {
	for _, n := range b.tree.Nodes() {
		d := n.Device
		if d == nil || d.Kind != profile.GPU || n.PhysFn != nil {
			continue
		}
		if f := b.functions[n.Address]; f == nil || f.State.Driver != profile.DriverNVIDIA {
			continue
		}
		dir := path.Join(NVIDIAGPUsDir, n.Address.String())
		b.dir(dir)
		b.text(dir, "information", GPUInformationText(d, n.irq(), b.machine.NVIDIAVersion()))
	}
}
