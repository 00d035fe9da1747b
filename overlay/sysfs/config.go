package sysfs

// Config-space register offsets (PCI Local Bus 3.0, section 6.1), as the
// kernel's config file exposes them: the renderer writes these registers
// and the checkers read them back, so both name them from here.
const (
	ConfigVendorID     = 0x00 // 16 bits
	ConfigDeviceID     = 0x02 // 16 bits
	ConfigCommand      = 0x04 // 16 bits
	ConfigStatus       = 0x06 // 16 bits
	ConfigRevision     = 0x08 // 8 bits
	ConfigClass        = 0x09 // 24 bits: programming interface, sub-class, base class
	ConfigHeaderType   = 0x0e // 8 bits; bit 7 is multi-function
	ConfigBAR0         = 0x10 // six 32-bit BARs on a type-0 header
	ConfigSubsystemVID = 0x2c // 16 bits, type 0
	ConfigSubsystemID  = 0x2e // 16 bits, type 0
	ConfigROM          = 0x30 // 32 bits, type 0
	ConfigCapPointer   = 0x34 // 8 bits
	ConfigIRQLine      = 0x3c // 8 bits
	ConfigIRQPin       = 0x3d // 8 bits

	// Type-1 (bridge) header.
	ConfigPrimaryBus       = 0x18 // 8 bits
	ConfigSecondaryBus     = 0x19 // 8 bits
	ConfigSubordinateBus   = 0x1a // 8 bits
	ConfigIOBase           = 0x1c // 8 bits
	ConfigIOLimit          = 0x1d // 8 bits
	ConfigMemoryBase       = 0x20 // 16 bits
	ConfigMemoryLimit      = 0x22 // 16 bits
	ConfigPrefMemoryBase   = 0x24 // 16 bits
	ConfigPrefMemoryLimit  = 0x26 // 16 bits
	ConfigPrefBaseUpper32  = 0x28 // 32 bits
	ConfigPrefLimitUpper32 = 0x2c // 32 bits
	ConfigBridgeControl    = 0x3e // 16 bits

	// ConfigHeaderSize is the standard header; capabilities follow it.
	ConfigHeaderSize = 0x40
)

// Sizes of the config file: a conventional PCI function shows 256 bytes, a
// PCIe function its whole 4 KiB extended space.
const (
	ConfigSizePCI = 256
	ConfigSize    = 4096
)

// Values of the header registers.
const (
	StatusCapList       = 0x0010 // Status: a capability list starts at ConfigCapPointer
	HeaderTypeMask      = 0x7f   // ConfigHeaderType without the multi-function bit
	HeaderTypeEndpoint  = 0x00   // type 0
	HeaderTypeBridge    = 0x01   // type 1, a PCI-to-PCI bridge
	HeaderMultiFunction = 0x80
)

// Capability ids (PCI Code and ID Assignment, section 2): each capability
// starts with its id, then the offset of the next one.
const (
	CapPM     = 0x01
	CapMSI    = 0x05
	CapVendor = 0x09
	CapSSVID  = 0x0d
	CapPCIe   = 0x10
	CapMSIX   = 0x11
)

// Registers of the PCI Express capability, as offsets from its start
// (PCIe Base 4.0, section 7.5.3).
const (
	PCIeCapabilities = 0x02 // 16 bits: device/port type in bits 7:4, slot implemented bit 8
	PCIeDevCap       = 0x04 // 32 bits
	PCIeDevCtl       = 0x08 // 16 bits
	PCIeLinkCap      = 0x0c // 32 bits: max speed 3:0, max width 9:4, port number 31:24
	PCIeLinkCtl      = 0x10 // 16 bits
	PCIeLinkStatus   = 0x12 // 16 bits: current speed 3:0, width 9:4
	PCIeSlotCap      = 0x14 // 32 bits: physical slot number 31:19
	PCIeSlotStatus   = 0x1a // 16 bits
	PCIeDevCap2      = 0x24 // 32 bits
	PCIeLinkCap2     = 0x2c // 32 bits: supported speeds vector 7:1
	PCIeLinkCtl2     = 0x30 // 16 bits: target speed 3:0
)

// PCI Express device/port types, in bits 7:4 of PCIeCapabilities.
const (
	PCIeEndpoint       = 0x0
	PCIeRootPort       = 0x4
	PCIeUpstreamPort   = 0x5
	PCIeDownstreamPort = 0x6
	PCIeToPCIBridge    = 0x7
)

// PCIePortTypeOf is the device/port type field of a PCIeCapabilities value.
func PCIePortTypeOf(caps uint16) uint16 { return caps >> 4 & 0xf }

// LinkSpeedGen and LinkWidth read a link register (PCIeLinkCap or
// PCIeLinkStatus): the generation in bits 3:0, the width in bits 9:4.
func LinkSpeedGen(reg uint32) int { return int(reg & 0xf) }

// LinkWidth is the width field of a link register; see LinkSpeedGen.
func LinkWidth(reg uint32) int { return int(reg>>4) & 0x3f }

// LinkFields packs a generation and width as a link register holds them.
func LinkFields(gen, width int) uint32 { return uint32(gen)&0xf | (uint32(width)&0x3f)<<4 }
