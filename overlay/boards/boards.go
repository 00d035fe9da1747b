// Package boards records what real NVIDIA boards show in PCI sysfs: the
// identities, BAR layouts and PCIe hierarchies from ../shared/REAL-HARDWARE.md.
// Built-in profiles are written from it, and the planner uses it to give a
// profile's GPUs the BAR layout and bridge hierarchy of their real machine.
package boards

import (
	"slices"
	"strings"
)

// VendorNVIDIA is NVIDIA's PCI vendor id.
const VendorNVIDIA uint16 = 0x10de

// Hierarchy names a shape of PCIe tree between a root complex and a GPU.
type Hierarchy string

const (
	// Flat is a cloud VM or a PCIe card: the GPU on the root bus or behind
	// one root port.
	Flat Hierarchy = "flat"
	// HGX is an H100/H200 baseboard: root port, then a PCIe switch (upstream
	// port at depth 4 below /sys, downstream port), then the GPU.
	HGX Hierarchy = "hgx"
	// DGX is a DGX A100: root port, then two cascaded PCIe switches.
	DGX Hierarchy = "dgx"
)

// Hierarchies lists the valid hierarchy names.
func Hierarchies() []Hierarchy { return []Hierarchy{Flat, HGX, DGX} }

// Valid reports whether h names a known hierarchy.
func (h Hierarchy) Valid() bool { return slices.Contains(Hierarchies(), h) }

// BARLayout says which BARs a GPU implements and how.
type BARLayout int

const (
	// Classic is the pre-Hopper layout (A100, L40, T4): BAR0 16 MiB 32-bit
	// non-prefetchable, BAR1 (the "BAR1" of nvidia-smi) and BAR3 32 MiB, both
	// 64-bit prefetchable.
	Classic BARLayout = iota
	// Hopper (H100, H200, GB200): BAR0 16 MiB, BAR2 (nvidia-smi's BAR1) and
	// BAR4 32 MiB, all 64-bit prefetchable.
	Hopper
)

// Board is one real board's identity.
type Board struct {
	Name            string // the product name nvidia-smi prints
	Device          uint16
	SubsystemDevice uint16 // subsystem vendor is NVIDIA on every board here
	BAR1Bytes       uint64 // 0 where no capture told us
	LinkGen         int
	LinkWidth       int
	Hierarchy       Hierarchy
	BARs            BARLayout
	NVSwitchDevice  uint16 // the NVSwitch that boards of this kind pair with, 0 if none
	// Machine is the DMI product name of the NVIDIA system the board ships
	// in (machine.go), "" for a card that goes into many vendors' servers.
	Machine string
	// HCA is the ConnectX type (hcas.go) its real machines carry beside
	// each GPU, "" for boards that ship without (PCIe cards, VMs).
	HCA string
	// MockNames are other NVML names nvml-mock's profiles give the board,
	// and MockDevices the placeholder device ids they give it: its b200
	// is 0x2340, its gb200 0x2341, its gb300 0x2941 (GB200's real id).
	MockNames   []string
	MockDevices []uint16
	// NVML is what NVML reports of the board beyond its name and PCI
	// identity, which the NVIDIA DRA driver and GPU Feature Discovery
	// publish; nil where no source told us. A built-in needs it.
	NVML *NVMLFacts
}

// NVMLFacts is what NVML reports of a real board, in the form an
// nvml-mock profile states it.
type NVMLFacts struct {
	// Brand and Architecture are nvml-mock's names (lower case), which its
	// NVML maps to NVML's enums: nvidia, ampere.
	Brand, Architecture string
	// ComputeMajor and ComputeMinor are the CUDA compute capability.
	ComputeMajor, ComputeMinor int
	// MemoryBytes is the frame buffer NVML reports (nvidia-smi's
	// fb_memory_usage total), which the DRA driver publishes as the memory
	// capacity and GFD as gpu.memory (in MiB): a real board's, a little
	// under its nominal size.
	MemoryBytes uint64
}

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

// All returns every known board: identities, links, BAR1 and hierarchies
// from ../shared/REAL-HARDWARE.md; machines from machine.go's sources.
func All() []Board {
	return []Board{
		{Name: "NVIDIA A100-SXM4-40GB", Device: 0x20b0, SubsystemDevice: 0x134f, BAR1Bytes: 64 * gib, LinkGen: 4, LinkWidth: 16, Hierarchy: DGX, BARs: Classic, NVSwitchDevice: 0x1af1, Machine: machineDGXA100, HCA: "MT4123",
			// ../shared/testdata/nvidia-smi-captures/qx-a100.xml: brand NVIDIA,
			// architecture Ampere, fb total 40960 MiB; compute capability 8.0
			// as nvml-mock's a100 profile states it (NVIDIA's CUDA GPU table).
			NVML: &NVMLFacts{Brand: "nvidia", Architecture: "ampere", ComputeMajor: 8, ComputeMinor: 0, MemoryBytes: 40960 * mib}},
		{Name: "NVIDIA A100 PCIe 40GB", Device: 0x20f1, SubsystemDevice: 0x145f, LinkGen: 4, LinkWidth: 16, Hierarchy: Flat, BARs: Classic},
		{Name: "NVIDIA A100 80GB PCIe", Device: 0x20b5, SubsystemDevice: 0x1533, LinkGen: 4, LinkWidth: 16, Hierarchy: Flat, BARs: Classic},
		{Name: "NVIDIA H100 80GB HBM3", Device: 0x2330, SubsystemDevice: 0x16c1, BAR1Bytes: 128 * gib, LinkGen: 5, LinkWidth: 16, Hierarchy: HGX, BARs: Hopper, NVSwitchDevice: 0x22a3, Machine: machineDGXH100, HCA: "MT4129",
			// qx-h100.xml: brand NVIDIA, architecture Hopper, fb total 81559
			// MiB; compute capability 9.0 as nvml-mock's h100 profile states it.
			NVML: &NVMLFacts{Brand: "nvidia", Architecture: "hopper", ComputeMajor: 9, ComputeMinor: 0, MemoryBytes: 81559 * mib}},
		{Name: "NVIDIA H100 PCIe", Device: 0x2331, SubsystemDevice: 0x1626, LinkGen: 5, LinkWidth: 16, Hierarchy: Flat, BARs: Hopper},
		{Name: "NVIDIA H200", Device: 0x2335, SubsystemDevice: 0x18be, LinkGen: 5, LinkWidth: 16, Hierarchy: HGX, BARs: Hopper, NVSwitchDevice: 0x22a3, Machine: machineDGXH200, HCA: "MT4129"},
		// HGX B200: five bridges between the root port and the GPU, as
		// DGX's two cascaded switches (REAL-HARDWARE.md).
		{Name: "NVIDIA B200", Device: 0x2901, SubsystemDevice: 0x1999, BAR1Bytes: 256 * gib, LinkGen: 5, LinkWidth: 16, Hierarchy: DGX, BARs: Hopper, Machine: machineDGXB200, HCA: "MT4129", MockDevices: []uint16{0x2340}},
		{Name: "NVIDIA GB200", Device: 0x2941, SubsystemDevice: 0x2046, BAR1Bytes: 256 * gib, LinkGen: 5, LinkWidth: 16, Hierarchy: Flat, BARs: Hopper, Machine: machineDGXGB200, HCA: "MT4129", MockDevices: []uint16{0x2341},
			// qx-gb200.xml: brand NVIDIA, architecture Blackwell, fb total
			// 189471 MiB; compute capability 10.0 as nvml-mock's gb200 profile
			// states it.
			NVML: &NVMLFacts{Brand: "nvidia", Architecture: "blackwell", ComputeMajor: 10, ComputeMinor: 0, MemoryBytes: 189471 * mib}},
		{Name: "NVIDIA GB300", Device: 0x31c2, SubsystemDevice: 0x21f1, BAR1Bytes: 512 * gib, LinkGen: 6, LinkWidth: 16, Hierarchy: Flat, BARs: Hopper, Machine: machineDGXGB300, HCA: "MT4131", MockNames: []string{"NVIDIA GB300 NVL"}, MockDevices: []uint16{0x2941}},
		// Vera Rubin trays put each superchip in a PCI domain of its own,
		// its GPUs behind root ports of root bus 80 (REAL-HARDWARE.md).
		// Driver 615 names it GenericName, which resolves nothing: Find
		// knows it by its id.
		{Name: GenericName, Device: 0x307f, SubsystemDevice: 0x221a, BAR1Bytes: 512 * gib, LinkGen: 6, LinkWidth: 16, Hierarchy: Flat, BARs: Hopper, Machine: machineVeraRubinNVL72, HCA: "MT4133"},
		{Name: "NVIDIA L40S", Device: 0x26b9, SubsystemDevice: 0x1851, LinkGen: 4, LinkWidth: 16, Hierarchy: Flat, BARs: Classic},
		{Name: "Tesla T4", Device: 0x1eb8, SubsystemDevice: 0x12a2, BAR1Bytes: 256 * mib, LinkGen: 3, LinkWidth: 16, Hierarchy: Flat, BARs: Classic,
			// qx-t4.xml: name Tesla T4 (nvml-mock's t4 profile says "NVIDIA
			// T4"), brand NVIDIA, architecture Turing, fb total 15360 MiB;
			// compute capability 7.5 as nvml-mock's t4 profile states it.
			NVML: &NVMLFacts{Brand: "nvidia", Architecture: "turing", ComputeMajor: 7, ComputeMinor: 5, MemoryBytes: 15360 * mib}},
		{Name: "Tesla V100-SXM2-32GB", Device: 0x1db5, SubsystemDevice: 0x1249, LinkGen: 3, LinkWidth: 16, Hierarchy: HGX, BARs: Classic},
	}
}

// GenericName is what the driver names a board whose marketing name has
// not shipped in its product table; it says nothing about the board.
const GenericName = "NVIDIA Graphics Device"

// Lookup finds a board by its real PCI device id.
func Lookup(device uint16) (Board, bool) {
	for _, b := range All() {
		if b.Device == device {
			return b, true
		}
	}
	return Board{}, false
}

// Find resolves a GPU to its board, by the NVML name the profile gives it
// (device_defaults.name or devices[].name) first, then by its device id:
// a real id first, then nvml-mock's placeholders. The name goes first
// because the ids are ambiguous: nvml-mock's gb300 carries GB200's real
// id 0x2941, and only its name, "NVIDIA GB300 NVL", tells them apart.
// Names are compared without case and surrounding space; GenericName
// matches no board by name.
func Find(name string, device uint16) (Board, bool) {
	all := All()
	if n := strings.TrimSpace(name); n != "" && !strings.EqualFold(n, GenericName) {
		for _, b := range all {
			if strings.EqualFold(n, b.Name) || slices.ContainsFunc(b.MockNames, func(m string) bool { return strings.EqualFold(n, m) }) {
				return b, true
			}
		}
	}
	if b, ok := Lookup(device); ok {
		return b, true
	}
	for _, b := range all {
		if slices.Contains(b.MockDevices, device) {
			return b, true
		}
	}
	return Board{}, false
}

// BARLayoutOf gives the BAR layout of a GPU (named and identified as Find
// takes it): the board's where known, otherwise the classic layout that
// most NVIDIA GPUs have.
func BARLayoutOf(name string, device uint16) BARLayout {
	if b, ok := Find(name, device); ok {
		return b.BARs
	}
	return Classic
}

// HierarchyOf gives the hierarchy of a GPU's real machine; an unknown GPU
// gets the HGX shape, the commonest multi-GPU server.
func HierarchyOf(name string, device uint16) Hierarchy {
	if b, ok := Find(name, device); ok {
		return b.Hierarchy
	}
	return HGX
}

// NVSwitchDeviceFor gives the NVSwitch device id that pairs with a GPU.
func NVSwitchDeviceFor(gpuName string, gpuDevice uint16) uint16 {
	if b, ok := Find(gpuName, gpuDevice); ok && b.NVSwitchDevice != 0 {
		return b.NVSwitchDevice
	}
	return 0x22a3 // third-generation NVSwitch, the one current boards carry
}

// BAR is one base address register of a board.
type BAR struct {
	Index    int // 0..5
	Size     uint64
	Is64     bool
	Prefetch bool
}

// BARs gives a GPU's BARs: its board's layout, with nvidia-smi's BAR1 of
// bar1 bytes.
func BARs(name string, device uint16, bar1 uint64) []BAR {
	if BARLayoutOf(name, device) == Hopper {
		return []BAR{{0, 16 * mib, true, true}, {2, bar1, true, true}, {4, 32 * mib, true, true}}
	}
	return []BAR{{0, 16 * mib, false, false}, {1, bar1, true, true}, {3, 32 * mib, true, true}}
}

// BARTotals sums a GPU's 32-bit and 64-bit BARs, as go-nvlib's
// GetTotalAddressableMemory reports them.
func BARTotals(name string, device uint16, bar1 uint64) (mem32, mem64 uint64) {
	for _, b := range BARs(name, device, bar1) {
		if b.Is64 {
			mem64 += b.Size
		} else {
			mem32 += b.Size
		}
	}
	return mem32, mem64
}
