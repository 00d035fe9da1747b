package plan

import (
	"cmp"
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// modalias is what udev and go-nvlib's VFIO lookup match drivers against.
func modalias(id Identity) string {
	return sysfs.Modalias(id.Vendor, id.Device, id.SubsystemVendor, id.SubsystemDevice, id.Class)
}

// resourceFile renders the resource file: "start end flags" per line, as
// many lines as the kernel prints for the header type.
func resourceFile(n *Node) string {
	lines := sysfs.ResourceLinesDevice
	if n.Role.IsBridge() {
		lines = sysfs.ResourceLinesBridge
	}
	byIndex := map[int]bar{}
	for _, b := range n.bars {
		byIndex[b.index] = b
	}
	var sb strings.Builder
	sb.Grow(lines * 57)
	for i := 0; i < lines; i++ {
		var start, end, flags uint64
		if b, ok := byIndex[i]; ok {
			start, end, flags = b.start, b.end(), b.flags
		}
		fmt.Fprintf(&sb, "0x%016x 0x%016x 0x%016x\n", start, end, flags)
	}
	return sb.String()
}

// DriverPCIePort is the driver of every bridge: the kernel's PCIe port
// service driver.
const DriverPCIePort = "pcieport"

// driverOf names the driver a real node binds each function to.
func driverOf(n *Node) string {
	switch n.Role {
	case RootPort, SwitchUp, SwitchDown:
		return DriverPCIePort
	case Endpoint:
		switch n.Device.Kind {
		case profile.NVSwitch:
			return profile.DriverNVSwitch
		case profile.HCA:
			return profile.DriverMLX5
		}
		return cmp.Or(n.Device.Driver, profile.DriverNVIDIA)
	}
	return ""
}

func uevent(n *Node, driver string) string {
	var b strings.Builder
	if driver != "" {
		fmt.Fprintf(&b, "DRIVER=%s\n", driver)
	}
	id := n.Identity
	fmt.Fprintf(&b, "PCI_CLASS=%X\nPCI_ID=%04X:%04X\nPCI_SUBSYS_ID=%04X:%04X\nPCI_SLOT_NAME=%s\nMODALIAS=%s\n",
		id.Class, id.Vendor, id.Device, id.SubsystemVendor, id.SubsystemDevice, n.Address, modalias(id))
	return b.String()
}

// appendHex appends "0x", v zero-padded to digits hex digits, and a newline.
func appendHex(buf []byte, v uint64, digits int) []byte {
	buf = append(buf, '0', 'x')
	for i := max(1, (bits.Len64(v)+3)/4); i < digits; i++ {
		buf = append(buf, '0')
	}
	return append(strconv.AppendUint(buf, v, 16), '\n')
}
