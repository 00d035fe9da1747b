package plan

import "encoding/binary"

// ConfigSize is the size of the config file of a PCIe function: the kernel
// exposes the whole 4 KiB extended space.
const ConfigSize = 4096

// Capability layout, as on a real H100: PM at 0x40, MSI at 0x48, the PCI
// Express capability at 0x60.
const (
	capPM   = 0x40
	capMSI  = 0x48
	capPCIe = 0x60

	capIDPM   = 0x01
	capIDMSI  = 0x05
	capIDPCIe = 0x10
)

// PCI Express device/port types (PCIe capability register bits 7:4).
const (
	pcieEndpoint   = 0x0
	pcieRootPort   = 0x4
	pcieUpstream   = 0x5
	pcieDownstream = 0x6
	pciePCIBridge  = 0x7
)

const (
	cmdDefault  = 0x0547 // I/O, memory, bus master, parity, SERR, INTx disable
	statusCaps  = 0x0010 // capability list present
	headerType0 = 0x00
	headerType1 = 0x01
	multiFunc   = 0x80
)

// configSpace renders a node's config space, consistent with its other
// files: ids, class, revision, BARs, bus numbers, IRQ and link.
func configSpace(n *Node, irq int, multiFunction bool) []byte {
	c := make([]byte, ConfigSize)
	le16 := func(off int, v uint16) { binary.LittleEndian.PutUint16(c[off:], v) }
	le32 := func(off int, v uint32) { binary.LittleEndian.PutUint32(c[off:], v) }
	id := n.Identity
	le16(0x00, id.Vendor)
	le16(0x02, id.Device)
	le16(0x04, cmdDefault)
	le16(0x06, statusCaps)
	c[0x08] = id.Revision
	c[0x09] = byte(id.Class)
	c[0x0a] = byte(id.Class >> 8)
	c[0x0b] = byte(id.Class >> 16)
	c[0x34] = capPM
	c[0x3c] = byte(irq)
	c[0x3d] = 1 // INTA
	var header byte = headerType0
	if n.Role.IsBridge() {
		header = headerType1
	}
	if multiFunction {
		header |= multiFunc
	}
	c[0x0e] = header

	if n.Role.IsBridge() {
		parentBus := n.Address.Bus
		c[0x18], c[0x19], c[0x1a] = parentBus, n.Secondary, n.Subordinate
		c[0x1c], c[0x1d] = 0xf0, 0x00 // no I/O window
		le16(0x20, 0xfff0)            // no memory window unless set below
		le16(0x22, 0x0000)
		le16(0x24, 0xfff1) // no prefetchable window unless set below
		le16(0x26, 0x0001)
		for _, b := range n.bars {
			switch b.index {
			case windowMemIndex:
				le16(0x20, uint16(b.start>>16)&0xfff0)
				le16(0x22, uint16(b.end()>>16)&0xfff0)
			case windowPrefIndex:
				le16(0x24, uint16(b.start>>16)&0xfff0|1)
				le16(0x26, uint16(b.end()>>16)&0xfff0|1)
				le32(0x28, uint32(b.start>>32))
				le32(0x2c, uint32(b.end()>>32))
			}
		}
		le16(0x3e, 0x0002) // bridge control: SERR# enable
	} else {
		for _, b := range n.bars {
			switch {
			case b.index == romIndex:
				le32(0x30, uint32(b.start)) // enable bit clear, as the kernel leaves it
			case b.index < romIndex:
				low := uint32(b.start) &^ 0xf
				if b.is64() {
					low |= 0x4
				}
				if b.prefetch() {
					low |= 0x8
				}
				le32(0x10+4*b.index, low)
				if b.is64() {
					le32(0x10+4*(b.index+1), uint32(b.start>>32))
				}
			}
		}
		le16(0x2c, id.SubsystemVendor)
		le16(0x2e, id.SubsystemDevice)
	}

	// Power management, version 3, in D0.
	c[capPM], c[capPM+1] = capIDPM, capMSI
	le16(capPM+2, 0x0003)
	le16(capPM+4, 0x0008) // No_Soft_Reset
	// MSI: 64-bit, per-vector masking; fills 0x48-0x5f.
	c[capMSI], c[capMSI+1] = capIDMSI, capPCIe
	le16(capMSI+2, 0x0180)
	writePCIeCap(c[capPCIe:], n)
	return c
}

// writePCIeCap fills the PCI Express capability (version 2), whose link
// registers carry the speeds and widths the sysfs files show.
func writePCIeCap(c []byte, n *Node) {
	le16 := func(off int, v uint16) { binary.LittleEndian.PutUint16(c[off:], v) }
	le32 := func(off int, v uint32) { binary.LittleEndian.PutUint32(c[off:], v) }
	c[0], c[1] = capIDPCIe, 0 // last capability
	var portType uint16
	slot := false
	switch n.Role {
	case RootPort:
		portType, slot = pcieRootPort, true
	case SwitchUp:
		portType = pcieUpstream
	case SwitchDown:
		portType, slot = pcieDownstream, true
	case PCIBridge:
		portType = pciePCIBridge
	default:
		portType = pcieEndpoint
	}
	caps := 0x0002 | portType<<4
	if slot {
		caps |= 0x0100
	}
	le16(0x02, caps)
	le32(0x04, 0x00008021) // DevCap: 256-byte payload, extended tags, role-based errors
	le16(0x08, 0x2110)     // DevCtl: 512-byte reads, extended tags, relaxed ordering
	l := n.Link
	portNumber := uint32(n.Address.Device)
	lnkCap := uint32(l.MaxGen) | uint32(l.MaxWidth)<<4 | portNumber<<24
	if n.Role == RootPort || n.Role == SwitchDown {
		lnkCap |= 1 << 20 // data link layer active reporting
	}
	le32(0x0c, lnkCap)
	le16(0x10, 0x0040) // LnkCtl: common clock
	lnkSta := uint16(l.CurrentGen) | uint16(l.CurrentWidth)<<4 | 0x1000
	if n.Role == RootPort || n.Role == SwitchDown {
		lnkSta |= 0x2000 // data link layer active
	}
	le16(0x12, lnkSta)
	if slot {
		le32(0x14, uint32(n.ordinal+1)<<19) // physical slot number
		le16(0x1a, 0x0040)                  // presence detected
	}
	le32(0x24, 0x0000001f)                 // DevCap2: completion timeouts
	le32(0x2c, uint32((1<<l.MaxGen)-1)<<1) // LnkCap2: supported speeds up to the max
	le16(0x30, uint16(l.MaxGen))           // LnkCtl2: target speed
}
