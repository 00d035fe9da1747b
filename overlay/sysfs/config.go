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
