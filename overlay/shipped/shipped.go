// Package shipped holds the profiles that ship with the tool, written from
// the facts in REAL-HARDWARE.md: each has its real board's identity, BAR1
// size, link and PCIe hierarchy.
package shipped

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// Default is the profile used when none is named: a DGX A100.
const Default = "dgx-a100"

// NVMLMockNames are the names of nvml-mock's own profiles (its configs/ and
// its Helm chart's profiles/). No built-in takes one of them unless it
// places its GPUs exactly where that profile does, with the same ids: NVML
// serves nvml-mock's profile, and a sysfs with other bus ids would silently
// disagree with it.
func NVMLMockNames() []string {
	return []string{"a100", "b200", "gb200", "gb300", "h100", "l40s", "t4"}
}

// Profile is one shipped profile. New builds a fresh copy each call, so a
// caller may change it.
type Profile struct {
	Name        string
	Description string
	New         func() *profile.Profile
}

// All lists the built-in profiles.
func All() []Profile {
	return []Profile{
		{Name: "dgx-a100", Description: "DGX A100: 8x A100-SXM4-40GB behind two cascaded PCIe switches, 6 NVSwitches, 2 NUMA nodes", New: dgxA100},
		{Name: "hgx-h100", Description: "HGX H100: 8x H100 80GB HBM3 (SXM5), each behind a PCIe switch on its own root complex, 4 NVSwitches", New: hgxH100},
		{Name: "gb200-tray", Description: "GB200 compute tray: 4x GB200 behind Grace root ports, 2 NUMA nodes", New: gb200Tray},
		{Name: "t4-vm", Description: "cloud VM (like AWS g4dn.12xlarge): 4x T4 on the root bus, no NUMA affinity", New: t4VM},
	}
}

// Names lists the built-in profile names.
func Names() []string {
	var names []string
	for _, b := range All() {
		names = append(names, b.Name)
	}
	return names
}

// Get returns a built-in profile by name.
func Get(name string) (*profile.Profile, bool) {
	for _, b := range All() {
		if b.Name == name {
			return b.New(), true
		}
	}
	return nil, false
}

// File is the built-in name as a profile file, the bytes `profiles --show`
// prints: a complete nvml-mock profile, which nvml-mock's NVML serves as
// it is and the suites hand it unchanged. ok is false for a name that is
// no built-in.
func File(name string) (data []byte, ok bool, err error) {
	p, ok := Get(name)
	if !ok {
		return nil, false, nil
	}
	data, err = profile.Marshal(p, fmt.Sprintf("nvml-mock-sysfs built-in profile %q", name))
	return data, true, err
}

// Load resolves --profile: a built-in name, or else a file path. It returns
// the profile and the name to use for it in messages.
func Load(nameOrPath string) (*profile.Profile, string, error) {
	nameOrPath = cmp.Or(nameOrPath, Default)
	if !strings.ContainsAny(nameOrPath, "/.") {
		if p, ok := Get(nameOrPath); ok {
			return p, "built-in " + nameOrPath, nil
		}
		if _, err := os.Stat(nameOrPath); err != nil {
			return nil, "", &UnknownError{Name: nameOrPath, Err: err}
		}
	}
	p, err := profile.LoadFile(nameOrPath)
	return p, nameOrPath, err
}

// UnknownError is a --profile that names neither a built-in nor a file: a
// usage error, which commands exit 2 on.
type UnknownError struct {
	Name string
	Err  error // why it is not a file
}

func (e *UnknownError) Error() string {
	hint := ""
	if slices.Contains(NVMLMockNames(), e.Name) {
		// The name of one of nvml-mock's profiles: render that profile's
		// own file, the one its NVML serves.
		hint = fmt.Sprintf("; for nvml-mock's %s, pass its profile file (the config.yaml its NVML reads)", e.Name)
	}
	return fmt.Sprintf("profile %q: not a built-in (%s) and not a file%s: %v", e.Name, strings.Join(Names(), ", "), hint, e.Err)
}

func (e *UnknownError) Unwrap() error { return e.Err }

type gpuSpec struct {
	bus  string
	rc   string
	numa int
}

// driverSpec is the NVIDIA driver a built-in's NVML reports: the driver
// and CUDA versions of the real capture of its board
// (../shared/testdata/nvidia-smi-captures), which nvml-mock's NVML
// requires (it refuses a profile without system.driver_version and serves
// its own defaults).
type driverSpec struct {
	version              string
	cudaMajor, cudaMinor int
}

// build makes a profile of identical GPUs from one board's facts: its PCI
// identity, link and BAR1 for the render, and what NVML reports of it
// (name, brand, architecture, compute capability, memory) with the
// driver's versions and each GPU's uuid and minor number, so that
// nvml-mock's NVML serves the profile as it is and reports the board,
// not its A100 defaults.
func build(board uint16, h boards.Hierarchy, driver driverSpec, gpus []gpuSpec, switches []gpuSpec) *profile.Profile {
	b, ok := boards.Lookup(board)
	if !ok || b.NVML == nil {
		panic(fmt.Sprintf("builtin: board %04x is not in the boards table with its NVML facts", board))
	}
	p := &profile.Profile{
		Version: "1.0",
		System: profile.SystemConfig{NVMLSystem: profile.NVMLSystem{
			DriverVersion:    driver.version,
			CUDAVersion:      fmt.Sprintf("%d.%d", driver.cudaMajor, driver.cudaMinor),
			CUDAVersionMajor: ptr(driver.cudaMajor), CUDAVersionMinor: ptr(driver.cudaMinor),
		}},
		DeviceDefaults: profile.DeviceConfig{
			Name: b.Name,
			NVMLFacts: profile.NVMLFacts{
				Brand: b.NVML.Brand, Architecture: b.NVML.Architecture,
				ComputeCapability: profile.ComputeCapability{Major: ptr(b.NVML.ComputeMajor), Minor: ptr(b.NVML.ComputeMinor)},
				Memory:            profile.NVMLMemory{TotalBytes: ptr(b.NVML.MemoryBytes)},
			},
			PCI: profile.PCIConfig{
				DeviceID:    profile.Pack(boards.VendorNVIDIA, b.Device),
				SubsystemID: profile.Pack(boards.VendorNVIDIA, b.SubsystemDevice),
			},
			PCIe: profile.PCIeConfig{
				MaxLinkGen: ptr(b.LinkGen), CurrentLinkGen: ptr(b.LinkGen),
				MaxLinkWidth: ptr(b.LinkWidth), CurrentLinkWidth: ptr(b.LinkWidth),
			},
			BAR1Memory: profile.MemoryConfig{TotalBytes: ptr(b.BAR1Bytes)},
		},
		PCIeTopology: &profile.PCIeTopology{Hierarchy: string(h)},
	}
	if hca := b.HCA; hca != "" {
		// The board's real machines carry one HCA beside each GPU.
		p.InfiniBand = &profile.InfiniBand{Enabled: true, HCAType: hca, LinkLayer: profile.LinkLayerInfiniBand, HCAsPerGPU: ptr(1)}
	}
	rcIndex := map[string]int{}
	place := func(s gpuSpec) {
		i, ok := rcIndex[s.rc]
		if !ok {
			i = len(p.PCIeTopology.RootComplexes)
			rcIndex[s.rc] = i
			p.PCIeTopology.RootComplexes = append(p.PCIeTopology.RootComplexes, profile.RootComplexConfig{ID: s.rc, NUMANode: ptr(s.numa)})
		}
		rc := &p.PCIeTopology.RootComplexes[i]
		rc.Devices = append(rc.Devices, s.bus)
	}
	for i, g := range gpus {
		// Minor number the index, uuid by IdentifyDevices' rule: what the
		// suites gave the built-ins before they stated them.
		p.Devices = append(p.Devices, profile.DeviceConfig{
			Index:     ptr(i),
			NVMLFacts: profile.NVMLFacts{UUID: profile.DeviceUUID(i, g.bus), MinorNumber: ptr(uint32(i))},
			PCI:       profile.PCIConfig{BusID: g.bus},
		})
		place(g)
	}
	if len(switches) > 0 {
		p.NVLink = &profile.NVLink{}
		for _, s := range switches {
			p.NVLink.Switches = append(p.NVLink.Switches, profile.NVSwitchConfig{BDF: s.bus})
			place(s)
		}
	}
	slices.SortStableFunc(p.PCIeTopology.RootComplexes, func(a, b profile.RootComplexConfig) int { return strings.Compare(a.ID, b.ID) })
	return p
}

// dgxA100 is a DGX A100: GPUs in pairs per root complex, each behind a
// PEX88096 switch cascade; NVSwitches behind their own switch. Its bus ids
// are nvml-mock's a100's, but its subsystem (10de:134f) is the real board's,
// not that profile's 10de:1347, so it does not take the name a100.
func dgxA100() *profile.Profile {
	// qx-a100.xml: driver 570.148.08, CUDA 12.8.
	return build(0x20b0, boards.DGX, driverSpec{"570.148.08", 12, 8}, []gpuSpec{
		{"0000:07:00.0", "pci0000:00", 0}, {"0000:0f:00.0", "pci0000:00", 0},
		{"0000:47:00.0", "pci0000:40", 0}, {"0000:4e:00.0", "pci0000:40", 0},
		{"0000:87:00.0", "pci0000:80", 1}, {"0000:90:00.0", "pci0000:80", 1},
		{"0000:b7:00.0", "pci0000:a0", 1}, {"0000:bd:00.0", "pci0000:a0", 1},
	}, []gpuSpec{
		{"0000:c4:00.0", "pci0000:c0", 1}, {"0000:c5:00.0", "pci0000:c0", 1}, {"0000:c6:00.0", "pci0000:c0", 1},
		{"0000:c7:00.0", "pci0000:c0", 1}, {"0000:c8:00.0", "pci0000:c0", 1}, {"0000:c9:00.0", "pci0000:c0", 1},
	})
}

// hgxH100 is an HGX H100 with the bus numbers of a real capture: each GPU on its
// own root complex, three bridges deep, as pci0000:15/15:01.0/16:00.0/17:00.0/18:00.0.
func hgxH100() *profile.Profile {
	// qx-h100.xml: driver 580.105.08, CUDA 13.0.
	return build(0x2330, boards.HGX, driverSpec{"580.105.08", 13, 0}, []gpuSpec{
		{"0000:53:00.0", "pci0000:50", 0}, {"0000:64:00.0", "pci0000:61", 0},
		{"0000:75:00.0", "pci0000:72", 0}, {"0000:86:00.0", "pci0000:83", 0},
		{"0000:97:00.0", "pci0000:94", 1}, {"0000:a8:00.0", "pci0000:a5", 1},
		{"0000:b9:00.0", "pci0000:b6", 1}, {"0000:ca:00.0", "pci0000:c7", 1},
	}, []gpuSpec{
		{"0000:05:00.0", "pci0000:00", 0}, {"0000:06:00.0", "pci0000:00", 0},
		{"0000:07:00.0", "pci0000:00", 0}, {"0000:08:00.0", "pci0000:00", 0},
	})
}

// gb200Tray is one GB200 compute tray with the bus numbers of a real capture:
// two Grace CPUs, each with two GPUs behind root ports.
func gb200Tray() *profile.Profile {
	// qx-gb200.xml: driver 580.173.02, CUDA 13.0.
	return build(0x2941, boards.Flat, driverSpec{"580.173.02", 13, 0}, []gpuSpec{
		{"0000:29:00.0", "pci0000:00", 0}, {"0000:3f:00.0", "pci0000:00", 0},
		{"0000:9c:00.0", "pci0000:80", 1}, {"0000:b2:00.0", "pci0000:80", 1},
	}, nil)
}

// t4VM is a cloud VM: four T4s on the root bus at 00:1b.0-00:1e.0, the last as
// in a real capture, with no NUMA affinity as VMs report.
func t4VM() *profile.Profile {
	// qx-t4.xml: driver 595.91.07, CUDA 13.2.
	return build(0x1eb8, boards.Flat, driverSpec{"595.91.07", 13, 2}, []gpuSpec{
		{"0000:00:1b.0", "pci0000:00", -1}, {"0000:00:1c.0", "pci0000:00", -1},
		{"0000:00:1d.0", "pci0000:00", -1}, {"0000:00:1e.0", "pci0000:00", -1},
	}, nil)
}

func ptr[T any](v T) *T { return &v }
