package sysfs

// The resource file (bus/pci/devices/<bdf>/resource): one "start end
// flags" line per resource, as the kernel prints it and go-nvlib reads it.
const (
	ResourceLinesDevice    = 13 // BARs 0-5, the ROM and six SR-IOV BARs
	ResourceLinesBridge    = 17 // plus four bridge windows
	ResourceROMLine        = 6  // the expansion ROM, after the six BARs
	ResourceWindowMemLine  = 14 // a bridge's memory window
	ResourceWindowPrefLine = 15 // a bridge's prefetchable memory window
)

// Resource flags as the resource file shows them: the kernel's
// IORESOURCE_* bits, whose low nibble repeats a memory BAR's type bits.
const (
	ResourceFlagsMem32      = 0x00040200 // IORESOURCE_MEM | IORESOURCE_SIZEALIGN
	ResourceFlagsMem64      = 0x00140204 // MEM_64 | SIZEALIGN | MEM | 64-bit type bits
	ResourceFlagsMem64Pref  = 0x0014220c // MEM_64 | SIZEALIGN | PREFETCH | MEM | 64-bit prefetchable type bits
	ResourceFlagsROM        = 0x00046200 // ROM: READONLY | SIZEALIGN | PREFETCH | MEM
	ResourceFlagsWindow     = 0x00000200 // a bridge's memory window
	ResourceFlagsWindowPref = 0x00102201 // a bridge's 64-bit prefetchable window
	ResourceFlagPrefetch    = 0x2000     // IORESOURCE_PREFETCH
)

// A memory BAR's type bits, in its config-space register and in the low
// nibble of its resource flags.
const (
	BARType64       = 0x4 // 64-bit: the BAR takes the next register too
	BARPrefetchable = 0x8
)
