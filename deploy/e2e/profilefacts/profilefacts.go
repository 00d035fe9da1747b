// Package profilefacts reads, straight from an nvml-mock profile file, the
// facts the end-to-end suites judge a render by: each GPU's bus id, NVML
// name, ids, class and driver, the root complex and NUMA node its
// pcie_topology gives it, how many HCAs its infiniband block puts beside
// it, and the machine type the profile names.
//
// It is the suites' own reader, written apart from the product's
// (overlay/profile): it imports nothing of the product, so that an
// expectation read here is an oracle of its own, not the renderer's
// normaliser agreeing with itself. It states, it does not infer: a GPU the
// profile's pcie_topology does not place has no root here (RootGiven is
// false), and a profile that names no machine (system.product_name) has
// none, where the renderer fills both in (a root per PCI domain, the
// board's machine). A suite judges those against literals of its own.
//
// The rules read are nvml-mock's and the product's documented ones
// (docs/reference/profiles.md): devices are as many as devices[] lists or
// system.num_devices says, whichever is more; each devices[] entry
// overrides device_defaults for the device its index names (its position
// without one); a device without a bus id is nvml-mock's 0000:<index>:00.0;
// a bus id is DDDD:BB:DD.F or NVML's 0000DDDD:BB:DD.F in either case.
package profilefacts

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// The values a profile leaves out, as docs/reference/profiles.md gives them.
const (
	// Class3D is a GPU's class without pci.class: a 3D controller.
	Class3D = 0x030200
	// ClassVGA is the other class a GPU may have.
	ClassVGA = 0x030000
	// DriverNVIDIA is a GPU's driver without pci.driver; DriverVFIO binds
	// it for passthrough, and NVML does not list it.
	DriverNVIDIA = "nvidia"
	DriverVFIO   = "vfio-pci"
)

// Profile is what one profile file says.
type Profile struct {
	// File names the profile in errors and rows.
	File string
	// Machine is system.product_name, trimmed; empty when the profile
	// names no machine (the renderer then takes its board's, an
	// inference this reader does not make, but Literal may fill in).
	Machine string
	// MachineFrom says where Machine comes from: FromProfile or
	// FromLiteral (which may say there is none: a PCIe board's); empty
	// when the machine is unknown.
	MachineFrom string
	// Topology is true when the profile has pcie_topology.root_complexes.
	Topology bool
	// GPUs are the profile's GPUs by index.
	GPUs []GPU
	// HCAs is whether the infiniband block gives GPUs HCAs: enabled,
	// hcas_per_gpu (1 unless given) above 0, and its gpus list, where
	// given, not empty.
	HCAs bool
	// HCAType is infiniband.hca_type as given (MT4129), trimmed; empty
	// when the profile names none (the renderer then takes the board's
	// HCA, an inference this reader does not make).
	HCAType string
	// TotalVFs is infiniband.sriov_totalvfs (this tool's extension): how
	// many virtual functions each HCA's physical function offers; 0 when
	// not given.
	TotalVFs int
	// DriverVersion is system.driver_version, trimmed: what
	// /proc/driver/nvidia/version and the module view's nvidia/version
	// carry.
	DriverVersion string
}

// HCADevice is the PCI device id HCAType names: docs/reference/profiles.md
// names a ConnectX generation by its MT<n>, n the device id in decimal
// (MT4129, ConnectX-7: 0x1021).
func (p *Profile) HCADevice() (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimPrefix(p.HCAType, "MT"), 10, 16)
	if err != nil || !strings.HasPrefix(p.HCAType, "MT") {
		return 0, fmt.Errorf("profile %s: infiniband.hca_type: value %q: not MT<device id in decimal>", p.File, p.HCAType)
	}
	return uint16(n), nil
}

// GPU is one GPU as the profile states it.
type GPU struct {
	Index int
	// BusID is the address as sysfs names it: lower case, a 4-digit domain
	// (0002:3b:00.0).
	BusID string
	// Name is devices[].name, else device_defaults.name: NVML's name.
	Name string
	// DeviceID and SubsystemID are the packed words (device<<16)|vendor
	// as the profile gives them; SubsystemID is 0 when it gives none.
	DeviceID, SubsystemID uint32
	// Class is pci.class, else Class3D.
	Class uint32
	// Driver is pci.driver, else DriverNVIDIA.
	Driver string
	// Root is the id of the pcie_topology root complex that lists the GPU
	// (pci0000:15), empty when none does (Literal may fill it in).
	Root string
	// RootFrom says where Root comes from: FromProfile or FromLiteral;
	// empty when Root is.
	RootFrom string
	// NUMANode is that root complex's numa_node, meaningful when
	// NUMAGiven.
	NUMANode  int
	NUMAGiven bool
	// HCAs is how many HCAs the infiniband block puts beside the GPU, on
	// its root complex: hcas_per_gpu (1 unless given) when the block is
	// enabled and its gpus list names the GPU's index or is not given;
	// else 0.
	HCAs int
}

// RootGiven reports whether the profile's pcie_topology places the GPU.
func (g GPU) RootGiven() bool { return g.RootFrom == FromProfile }

// RootSaid is the GPU's root complex as a row says it: the id, with where
// it comes from when that is a literal, or that the profile gives none.
func (g GPU) RootSaid() string {
	switch g.RootFrom {
	case FromProfile:
		return g.Root
	case FromLiteral:
		return g.Root + " (" + FromLiteral + ")"
	}
	return "not given (no pcie_topology places it)"
}

// Product is the device part of DeviceID: 0x2330 for an H100.
func (g GPU) Product() uint16 { return uint16(g.DeviceID >> 16) }

// Read reads the profile file.
func Read(file string) (*Profile, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return Parse(file, data)
}

// document is the part of the file read: nvml-mock's keys and the
// renderer's extensions that name a fact judged.
type document struct {
	System struct {
		NumDevices    *int   `yaml:"num_devices"`
		ProductName   string `yaml:"product_name"`
		DriverVersion string `yaml:"driver_version"`
	} `yaml:"system"`
	DeviceDefaults device   `yaml:"device_defaults"`
	Devices        []device `yaml:"devices"`
	InfiniBand     *struct {
		Enabled    bool   `yaml:"enabled"`
		HCAsPerGPU *int   `yaml:"hcas_per_gpu"`
		GPUs       *[]int `yaml:"gpus"`
		HCAType    string `yaml:"hca_type"`
		TotalVFs   int    `yaml:"sriov_totalvfs"`
	} `yaml:"infiniband"`
	PCIeTopology *struct {
		RootComplexes []struct {
			ID       string   `yaml:"id"`
			NUMANode *int     `yaml:"numa_node"`
			Devices  []string `yaml:"devices"`
		} `yaml:"root_complexes"`
	} `yaml:"pcie_topology"`
}

type device struct {
	Index *int   `yaml:"index"`
	Name  string `yaml:"name"`
	PCI   struct {
		BusID       string `yaml:"bus_id"`
		DeviceID    *word  `yaml:"device_id"`
		SubsystemID *word  `yaml:"subsystem_id"`
		Class       *word  `yaml:"class"`
		Driver      string `yaml:"driver"`
	} `yaml:"pci"`
}

// word is a 32-bit value written as YAML's hex integer (0x233010DE) or as
// a string of one.
type word uint32

func (w *word) UnmarshalYAML(n *yaml.Node) error {
	v, err := strconv.ParseUint(strings.TrimSpace(n.Value), 0, 32)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a 32-bit number", n.Line, n.Value)
	}
	*w = word(v)
	return nil
}

// Parse reads a profile's text; name names it in errors.
func Parse(name string, data []byte) (*Profile, error) {
	var doc document
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("profile %s: %w", name, err)
	}
	p := &Profile{File: name, Machine: strings.TrimSpace(doc.System.ProductName), DriverVersion: strings.TrimSpace(doc.System.DriverVersion)}
	// The GPUs that carry HCAs (nil: every one), and how many each.
	var carriers map[int]bool
	perGPU := 1
	if ib := doc.InfiniBand; ib != nil && ib.Enabled {
		if ib.HCAsPerGPU != nil {
			perGPU = *ib.HCAsPerGPU
		}
		p.HCAs = perGPU > 0 && (ib.GPUs == nil || len(*ib.GPUs) > 0)
		p.HCAType, p.TotalVFs = strings.TrimSpace(ib.HCAType), ib.TotalVFs
		if ib.GPUs != nil {
			carriers = map[int]bool{}
			for _, index := range *ib.GPUs {
				carriers[index] = true
			}
		}
	}
	if p.Machine != "" {
		p.MachineFrom = FromProfile
	}
	// Where each devices[] entry goes.
	byIndex := map[int]int{}
	for pos, d := range doc.Devices {
		index := pos
		if d.Index != nil {
			index = *d.Index
		}
		if _, dup := byIndex[index]; dup || index < 0 {
			return nil, fmt.Errorf("profile %s: devices[%d].index: value %d: negative or another entry's", name, pos, index)
		}
		byIndex[index] = pos
	}
	count := len(doc.Devices)
	if n := doc.System.NumDevices; n != nil {
		count = max(count, *n)
	}
	indexes := map[int]bool{}
	for i := range count {
		indexes[i] = true
	}
	for i := range byIndex {
		indexes[i] = true
	}
	// The root complex and NUMA node pcie_topology gives each address.
	type placed struct {
		root      string
		numa      int
		numaGiven bool
	}
	at := map[string]placed{}
	if t := doc.PCIeTopology; t != nil && len(t.RootComplexes) > 0 {
		p.Topology = true
		for i, rc := range t.RootComplexes {
			for j, a := range rc.Devices {
				bdf, err := busID(a)
				if err != nil {
					return nil, fmt.Errorf("profile %s: pcie_topology.root_complexes[%d].devices[%d]: %w", name, i, j, err)
				}
				pl := placed{root: strings.ToLower(strings.TrimSpace(rc.ID))}
				if rc.NUMANode != nil {
					pl.numa, pl.numaGiven = *rc.NUMANode, true
				}
				at[bdf] = pl
			}
		}
	}
	def := doc.DeviceDefaults
	for _, index := range slices.Sorted(maps.Keys(indexes)) {
		var own device
		field := fmt.Sprintf("device_defaults (device %d)", index)
		if pos, ok := byIndex[index]; ok {
			own, field = doc.Devices[pos], fmt.Sprintf("devices[%d]", pos)
		}
		g := GPU{Index: index, Name: strings.TrimSpace(first(own.Name, def.Name)), Class: Class3D, Driver: DriverNVIDIA}
		bus := own.PCI.BusID
		if bus == "" {
			bus = fmt.Sprintf("0000:%02x:00.0", index)
		}
		var err error
		if g.BusID, err = busID(bus); err != nil {
			return nil, fmt.Errorf("profile %s: %s.pci.bus_id: %w", name, field, err)
		}
		if w := firstWord(own.PCI.DeviceID, def.PCI.DeviceID); w != nil {
			g.DeviceID = uint32(*w)
		}
		if w := firstWord(own.PCI.SubsystemID, def.PCI.SubsystemID); w != nil {
			g.SubsystemID = uint32(*w)
		}
		if w := firstWord(own.PCI.Class, def.PCI.Class); w != nil {
			g.Class = uint32(*w)
		}
		if d := strings.TrimSpace(first(own.PCI.Driver, def.PCI.Driver)); d != "" {
			g.Driver = d
		}
		if pl, ok := at[g.BusID]; ok {
			g.Root, g.RootFrom, g.NUMANode, g.NUMAGiven = pl.root, FromProfile, pl.numa, pl.numaGiven
		}
		if p.HCAs && (carriers == nil || carriers[index]) {
			g.HCAs = perGPU
		}
		p.GPUs = append(p.GPUs, g)
	}
	return p, nil
}

// busID is an address as sysfs names it, from either of the forms a
// profile may write.
func busID(s string) (string, error) {
	var domain, bus, dev, fn uint64
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) != 3 {
		return "", fmt.Errorf("value %q: not DDDD:BB:DD.F", s)
	}
	slot, f, ok := strings.Cut(parts[2], ".")
	var errs [4]error
	domain, errs[0] = strconv.ParseUint(parts[0], 16, 32)
	bus, errs[1] = strconv.ParseUint(parts[1], 16, 8)
	dev, errs[2] = strconv.ParseUint(slot, 16, 8)
	fn, errs[3] = strconv.ParseUint(f, 16, 8)
	if !ok || len(parts[0]) != 4 && len(parts[0]) != 8 || domain > 0xffff || dev > 0x1f || fn > 7 || errs != [4]error{} {
		return "", fmt.Errorf("value %q: not DDDD:BB:DD.F", s)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn), nil
}

func first(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func firstWord(w ...*word) *word {
	for _, v := range w {
		if v != nil {
			return v
		}
	}
	return nil
}

// NVIDIABound are the GPUs the nvidia driver holds: those NVML lists
// (a GPU bound to vfio-pci it does not).
func (p *Profile) NVIDIABound() []GPU {
	var out []GPU
	for _, g := range p.GPUs {
		if g.Driver != DriverVFIO {
			out = append(out, g)
		}
	}
	return out
}

// VFIOBound are the GPUs the profile binds to vfio-pci for passthrough,
// in index order. docs/user/passthrough.md gives each an IOMMU group of
// its own, holding it alone (an SXM or superchip GPU is a single-function
// device behind ACS): the group's number is the render's to choose, its
// being the GPU's alone is the profile's fact.
func (p *Profile) VFIOBound() []GPU {
	var out []GPU
	for _, g := range p.GPUs {
		if g.Driver == DriverVFIO {
			out = append(out, g)
		}
	}
	return out
}

// Names are the distinct GPU names, in index order.
func (p *Profile) Names() []string {
	var out []string
	for _, g := range p.GPUs {
		if !slices.Contains(out, g.Name) {
			out = append(out, g.Name)
		}
	}
	return out
}

// Classes are the distinct GPU classes, in index order.
func (p *Profile) Classes() []uint32 {
	var out []uint32
	for _, g := range p.GPUs {
		if !slices.Contains(out, g.Class) {
			out = append(out, g.Class)
		}
	}
	return out
}
