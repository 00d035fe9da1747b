// Package fidelity compares a PCI device directory with what the kernel
// shows for a real GPU, attribute by attribute, so the gaps of a rendered
// tree are listed rather than guessed.
//
// Attributes() is the list, written from ../shared/REAL-HARDWARE.md (what
// real GPU nodes show), ../shared/CONSUMERS.md (who reads what) and the
// kernel's drivers/pci/pci-sysfs.c. Check reads one device directory
// through an fs.FS and says, for each attribute, whether it is present and
// right, missing, or present but different from what the kernel would
// write or the profile asks for.
package fidelity

// Need says what depends on an attribute.
type Need string

const (
	// Consumer attributes are read by a consumer in CONSUMERS.md; without
	// them, or with a wrong value, that consumer fails or misreports.
	Consumer Need = "consumer"
	// Kernel attributes are what a real kernel shows, but no consumer we
	// know of needs them; their absence is a visible gap, not a failure.
	Kernel Need = "kernel"
)

// Scope says which functions the kernel gives an attribute.
type Scope string

const (
	Every    Scope = "every PCI function"
	PCIe     Scope = "PCI Express functions"
	Bound    Scope = "functions bound to a driver"
	MSI      Scope = "functions with MSI/MSI-X enabled"
	IOMMU    Scope = "hosts with an IOMMU (bare-metal GPU nodes)"
	BARFiles Scope = "functions with memory BARs (mmap files)"
	ROM      Scope = "functions with an expansion ROM"
	Reset    Scope = "functions the kernel can reset"
)

// AttributeKind is what the entry is.
type AttributeKind string

const (
	File AttributeKind = "file"
	Link AttributeKind = "link"
	Dir  AttributeKind = "dir"
)

// Attribute is one entry of a real GPU's sysfs directory.
type Attribute struct {
	Name  string
	Kind  AttributeKind
	Need  Need
	Scope Scope
	// Readers are who reads it, or where the fact comes from.
	Readers string
	check   func(p *probe) (Status, string)
}

// Attributes lists what the kernel shows in a GPU's directory.
func Attributes() []Attribute {
	return []Attribute{
		{"vendor", File, Consumer, Every, "go-nvlib (every entry), lspci, NFD, ghw, hwloc", checkID("vendor", func(e *Expect) uint16 { return e.Vendor })},
		{"device", File, Consumer, Every, "go-nvlib, lspci, NFD, hwloc", checkID("device", func(e *Expect) uint16 { return e.Device })},
		{"subsystem_vendor", File, Consumer, Every, "go-nvlib, NFD, hwloc", checkID("subsystem_vendor", func(e *Expect) uint16 { return e.SubsystemVendor })},
		{"subsystem_device", File, Consumer, Every, "go-nvlib, NFD, hwloc", checkID("subsystem_device", func(e *Expect) uint16 { return e.SubsystemDevice })},
		{"class", File, Consumer, Every, "go-nvlib, GPU Feature Discovery (0x030200 compute, 0x030000 graphics), NFD, lspci", checkClass()},
		{"revision", File, Kernel, Every, "REAL-HARDWARE.md: every board is rev a1", checkRevision()},
		{"numa_node", File, Consumer, Every, "deviceattribute numaNode, go-nvlib", checkNUMA()},
		{"irq", File, Consumer, Every, "lspci -v", checkDecimal("irq")},
		{"resource", File, Consumer, Every, "go-nvlib (3 fields a line; GetTotalAddressableMemory), lspci -v", checkResource},
		{"config", File, Consumer, Every, "GFD vGPU labeler (>= 256 bytes), lspci -t (bridges), hwloc", checkConfig},
		{"modalias", File, Consumer, Every, "ghw (a missing one empties its list), go-nvlib nvpassthrough", checkModalias},
		{"local_cpus", File, Consumer, Every, "hwloc", checkLocalCPUs},
		{"local_cpulist", File, Kernel, Every, "kernel, as local_cpus in list form", checkLocalCPUList},
		{"enable", File, Kernel, Every, "kernel: 1 once a driver enabled the device", checkOneOf("enable", "1", "0")},
		{"power_state", File, Kernel, Every, "kernel (5.x+): D0 while in use", checkOneOf("power_state", "D0", "D1", "D2", "D3hot", "D3cold", "unknown")},
		{"d3cold_allowed", File, Kernel, Every, "kernel", checkOneOf("d3cold_allowed", "1", "0")},
		{"uevent", File, Kernel, Every, "udev", checkUevent},
		{"broken_parity_status", File, Kernel, Every, "kernel", checkOneOf("broken_parity_status", "0", "1")},
		{"msi_bus", File, Kernel, Every, "kernel", checkOneOf("msi_bus", "1", "0")},
		{"driver_override", File, Kernel, Every, "kernel; vfio tooling writes it", nil},
		{"ari_enabled", File, Kernel, Every, "kernel", checkOneOf("ari_enabled", "0", "1")},
		{"consistent_dma_mask_bits", File, Kernel, Every, "kernel", checkDecimal("consistent_dma_mask_bits")},
		{"dma_mask_bits", File, Kernel, Every, "kernel", checkDecimal("dma_mask_bits")},
		{"subsystem", Link, Kernel, Every, "kernel: -> bus/pci", checkLinkTo("subsystem", `^(\.\./)+bus/pci$`)},
		{"power", Dir, Kernel, Every, "kernel runtime PM", nil},
		{"driver", Link, Consumer, Bound, "go-nvlib (EvalSymlinks; a dangling one aborts its scan)", checkDriver},
		{"iommu_group", Link, Kernel, IOMMU, "go-nvlib (EvalSymlinks; a dangling one aborts its scan), VFIO", checkIOMMUGroup},
		{"current_link_speed", File, Kernel, PCIe, "kernel, from LnkSta; REAL-HARDWARE.md: 16.0 GT/s A100, 32.0 GT/s H100", checkLinkSpeed("current_link_speed", true)},
		{"max_link_speed", File, Kernel, PCIe, "kernel, from LnkCap", checkLinkSpeed("max_link_speed", false)},
		{"current_link_width", File, Kernel, PCIe, "kernel, from LnkSta", checkLinkWidth("current_link_width", true)},
		{"max_link_width", File, Kernel, PCIe, "kernel, from LnkCap", checkLinkWidth("max_link_width", false)},
		{"msi_irqs", Dir, Kernel, MSI, "kernel: one entry per vector", nil},
		{"reset_method", File, Kernel, Reset, "kernel (5.15+), e.g. flr bus", nil},
		{"resource0", File, Kernel, BARFiles, "kernel mmap file of BAR0; go-nvlib's mmio opens it only to map registers", nil},
		{"rom", File, Kernel, ROM, "kernel, for the expansion ROM", nil},
	}
}
