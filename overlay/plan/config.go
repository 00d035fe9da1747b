package plan

import (
	"encoding/binary"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Capability layout, as on a real H100: PM at 0x40, MSI at 0x48, the PCI
// Express capability at 0x60. Exported so that plancheck checks the layout
// the planner promises rather than a copy of it.
const (
	CapPMAt   = sysfs.ConfigHeaderSize
	CapMSIAt  = 0x48
	CapPCIeAt = 0x60
)

// Command is the command register of every planned function, a real
// H100's: I/O, memory, bus master, parity, SERR, INTx disable.
const Command = 0x0547

// configRegs is a config space being written, register by register, in
// the little-endian order PCI keeps.
type configRegs []byte

func (c configRegs) put16(off int, v uint16) { binary.LittleEndian.PutUint16(c[off:], v) }
func (c configRegs) put32(off int, v uint32) { binary.LittleEndian.PutUint32(c[off:], v) }

// configSpace renders a node's config space, consistent with its other
// files: ids, class, revision, BARs, bus numbers, IRQ and link.
func configSpace(n *Node, irq int, multiFunction bool) []byte {
	c := configRegs(make([]byte, sysfs.ConfigSize)) // a PCIe function shows its whole extended space
	c.header(n, irq, multiFunction)
	if n.Role.IsBridge() {
		c.bridgeHeader(n)
	} else {
		c.endpointHeader(n)
	}
	c.capabilities(n)
	return c
}

// header writes the registers type 0 and type 1 headers share.
func (c configRegs) header(n *Node, irq int, multiFunction bool) {
	id := n.Identity
	c.put16(sysfs.ConfigVendorID, id.Vendor)
	c.put16(sysfs.ConfigDeviceID, id.Device)
	c.put16(sysfs.ConfigCommand, Command)
	c.put16(sysfs.ConfigStatus, sysfs.StatusCapList)
	c[sysfs.ConfigRevision] = id.Revision
	// The class code's three bytes: programming interface, sub-class, base.
	c[sysfs.ConfigClass] = byte(id.Class)
	c[sysfs.ConfigClass+1] = byte(id.Class >> 8)
	c[sysfs.ConfigClass+2] = byte(id.Class >> 16)
	c[sysfs.ConfigCapPointer] = CapPMAt
	c[sysfs.ConfigIRQLine] = byte(irq)
	c[sysfs.ConfigIRQPin] = 1 // INTA
	var header byte = sysfs.HeaderTypeEndpoint
	if n.Role.IsBridge() {
		header = sysfs.HeaderTypeBridge
	}
	if multiFunction {
		header |= sysfs.HeaderMultiFunction
	}
	c[sysfs.ConfigHeaderType] = header
}

// bridgeHeader writes a type 1 header's bus numbers and windows: closed
// unless the node forwards a memory range.
func (c configRegs) bridgeHeader(n *Node) {
	c[sysfs.ConfigPrimaryBus] = n.Address.Bus
	c[sysfs.ConfigSecondaryBus] = n.Secondary
	c[sysfs.ConfigSubordinateBus] = n.Subordinate
	c[sysfs.ConfigIOBase], c[sysfs.ConfigIOLimit] = 0xf0, 0x00 // no I/O window
	c.put16(sysfs.ConfigMemoryBase, 0xfff0)                    // no memory window unless set below
	c.put16(sysfs.ConfigMemoryLimit, 0x0000)
	c.put16(sysfs.ConfigPrefMemoryBase, 0xfff1) // no prefetchable window unless set below
	c.put16(sysfs.ConfigPrefMemoryLimit, 0x0001)
	for _, b := range n.bars {
		switch b.index {
		case sysfs.ResourceWindowMemLine:
			c.put16(sysfs.ConfigMemoryBase, uint16(b.start>>16)&0xfff0)
			c.put16(sysfs.ConfigMemoryLimit, uint16(b.end()>>16)&0xfff0)
		case sysfs.ResourceWindowPrefLine:
			c.put16(sysfs.ConfigPrefMemoryBase, uint16(b.start>>16)&0xfff0|1)
			c.put16(sysfs.ConfigPrefMemoryLimit, uint16(b.end()>>16)&0xfff0|1)
			c.put32(sysfs.ConfigPrefBaseUpper32, uint32(b.start>>32))
			c.put32(sysfs.ConfigPrefLimitUpper32, uint32(b.end()>>32))
		}
	}
	c.put16(sysfs.ConfigBridgeControl, 0x0002) // SERR# enable
}

// endpointHeader writes a type 0 header's BARs, ROM and subsystem ids.
func (c configRegs) endpointHeader(n *Node) {
	for _, b := range n.bars {
		switch {
		case b.index == sysfs.ResourceROMLine:
			c.put32(sysfs.ConfigROM, uint32(b.start)) // enable bit clear, as the kernel leaves it
		case b.index < sysfs.ResourceROMLine:
			low := uint32(b.start) &^ 0xf
			if b.is64() {
				low |= sysfs.BARType64
			}
			if b.prefetch() {
				low |= sysfs.BARPrefetchable
			}
			c.put32(sysfs.ConfigBAR0+4*b.index, low)
			if b.is64() {
				c.put32(sysfs.ConfigBAR0+4*(b.index+1), uint32(b.start>>32))
			}
		}
	}
	c.put16(sysfs.ConfigSubsystemVID, n.Identity.SubsystemVendor)
	c.put16(sysfs.ConfigSubsystemID, n.Identity.SubsystemDevice)
}

// capabilities writes the list ConfigCapPointer starts: power management,
// MSI, then PCI Express.
func (c configRegs) capabilities(n *Node) {
	// Power management, version 3, in D0.
	c[CapPMAt], c[CapPMAt+1] = sysfs.CapPM, CapMSIAt
	c.put16(CapPMAt+2, 0x0003)
	c.put16(CapPMAt+4, 0x0008) // No_Soft_Reset
	// MSI: 64-bit, per-vector masking; fills 0x48-0x5f.
	c[CapMSIAt], c[CapMSIAt+1] = sysfs.CapMSI, CapPCIeAt
	c.put16(CapMSIAt+2, 0x0180)
	c[CapPCIeAt:].pcieCap(n)
}

// PCIePortType is the device/port type the PCI Express capability declares
// for a role, and whether that port has a slot.
func PCIePortType(r Role) (portType uint16, slot bool) {
	switch r {
	case RootPort:
		return sysfs.PCIeRootPort, true
	case SwitchUp:
		return sysfs.PCIeUpstreamPort, false
	case SwitchDown:
		return sysfs.PCIeDownstreamPort, true
	case PCIBridge:
		return sysfs.PCIeToPCIBridge, false
	}
	return sysfs.PCIeEndpoint, false
}

// pcieCap fills the PCI Express capability (version 2), whose link
// registers carry the speeds and widths the sysfs files show. c starts at
// the capability.
func (c configRegs) pcieCap(n *Node) {
	c[0], c[1] = sysfs.CapPCIe, 0 // last capability
	portType, slot := PCIePortType(n.Role)
	caps := 0x0002 | portType<<4
	if slot {
		caps |= 0x0100
	}
	c.put16(sysfs.PCIeCapabilities, caps)
	c.put32(sysfs.PCIeDevCap, 0x00008021) // 256-byte payload, extended tags, role-based errors
	c.put16(sysfs.PCIeDevCtl, 0x2110)     // 512-byte reads, extended tags, relaxed ordering
	l := n.Link
	// Ports below which a link trains report the data link layer's state.
	reportsDLL := n.Role == RootPort || n.Role == SwitchDown
	portNumber := uint32(n.Address.Device)
	lnkCap := sysfs.LinkFields(l.MaxGen, l.MaxWidth) | portNumber<<24
	if reportsDLL {
		lnkCap |= 1 << 20 // data link layer active reporting
	}
	c.put32(sysfs.PCIeLinkCap, lnkCap)
	c.put16(sysfs.PCIeLinkCtl, 0x0040) // common clock
	lnkSta := uint16(sysfs.LinkFields(l.CurrentGen, l.CurrentWidth)) | 0x1000
	if reportsDLL {
		lnkSta |= 0x2000 // data link layer active
	}
	c.put16(sysfs.PCIeLinkStatus, lnkSta)
	if slot {
		c.put32(sysfs.PCIeSlotCap, uint32(n.ordinal+1)<<19) // physical slot number
		c.put16(sysfs.PCIeSlotStatus, 0x0040)               // presence detected
	}
	c.put32(sysfs.PCIeDevCap2, 0x0000001f)                  // completion timeouts
	c.put32(sysfs.PCIeLinkCap2, uint32((1<<l.MaxGen)-1)<<1) // supported speeds up to the max
	c.put16(sysfs.PCIeLinkCtl2, uint16(l.MaxGen))           // target speed
}
