package profile

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// DeviceKind says what a rendered endpoint is.
type DeviceKind int

const (
	// GPU is a device of devices[]: class 0x0302xx or 0x0300xx.
	GPU DeviceKind = iota
	// NVSwitch is an nvlink.switches[] entry: class 0x068000.
	NVSwitch
	// HCA is a ConnectX adapter of the infiniband block, beside a GPU.
	HCA
)

func (k DeviceKind) String() string { return [...]string{"gpu", "nvswitch", "hca"}[k] }

// Plural names several of a kind.
func (k DeviceKind) Plural() string { return [...]string{"gpus", "nvswitches", "hcas"}[k] }

// Class codes, as the kernel's class file shows them.
const (
	Class3DController  uint32 = 0x030200
	ClassVGAController uint32 = 0x030000
	ClassNVSwitch      uint32 = 0x068000
	ClassPCIBridge     uint32 = 0x060400
	ClassInfiniBand    uint32 = 0x020700
	ClassEthernet      uint32 = 0x020000
)

// Link is a PCIe link's generation (sysfs.LinkSpeed names each) and width.
type Link struct {
	MaxGen       int
	CurrentGen   int
	MaxWidth     int
	CurrentWidth int
}

// Device is one PCI endpoint to render.
type Device struct {
	Kind            DeviceKind
	Index           int // devices[].index for a GPU, the position in nvlink.switches for an NVSwitch
	Name            string
	Address         pciaddr.Address
	RootComplex     pciaddr.RootComplex
	NUMANode        int
	Vendor          uint16
	DeviceID        uint16
	SubsystemVendor uint16
	SubsystemDevice uint16
	Class           uint32
	Revision        uint8
	BAR1Bytes       uint64
	Link            Link
	// Driver is the driver the function is bound to: for a GPU DriverNVIDIA
	// or DriverVFIO; NVSwitches and HCAs keep their own (the planner's).
	Driver string
	// UUID and Minor are a GPU's NVML uuid and minor number, the ones
	// nvml-mock's NVML reports as the suites serve it the profile
	// (gpuNVMLIdentity), for the driver's /proc files to name the GPU as
	// NVML does.
	UUID  string
	Minor uint32
}

// Drivers a profile may bind its devices to (pci.driver, nvlink.switches[].driver).
const (
	DriverNVIDIA   = "nvidia"
	DriverVFIO     = "vfio-pci"
	DriverNVSwitch = "nvidia-nvswitch"
)

// DriverMLX5 is the driver a ConnectX HCA is bound to. A profile cannot
// choose it: an HCA is always on it, on a passthrough node too.
const DriverMLX5 = "mlx5_core"

// RootComplex is a host bridge and its NUMA node.
type RootComplex struct {
	ID       pciaddr.RootComplex
	NUMANode int
}

// Machine is a normalised profile: every device with explicit ids, every
// address lower-case, every device under exactly one root complex.
type Machine struct {
	Source        string
	Hierarchy     boards.Hierarchy
	RootComplexes []RootComplex // sorted by domain, bus
	Devices       []Device      // sorted by address
	// HCAs, when set, gives the GPUs that carry HCAs (HCAs.Carries) theirs;
	// the planner places them.
	HCAs *HCASpec
	// ProductName is the machine type for dmi/product_name; "" renders none.
	ProductName string
	// ProductNameFrom says where ProductName came from:
	// ProductNameFromProfile, or ProductNameFromBoard; "" with no name.
	ProductNameFrom string
	// DriverVersion is the profile's system.driver_version, "" where it
	// gives none; NVIDIAVersion is what a node with this profile runs.
	DriverVersion string
	// OffBusSwitches are the nvlink.switches that sit off this tray's PCIe
	// bus, as NVL72's do in switch trays of their own: on a bus no root
	// complex of the topology covers, and without a device_id. They render
	// nothing; their Index keeps the profile's order.
	OffBusSwitches []Device
}

// Where a machine's ProductName came from.
const (
	ProductNameFromProfile = "system.product_name"
	ProductNameFromBoard   = "the GPU board"
)

// GPUs returns the machine's GPUs, sorted by address.
func (m *Machine) GPUs() []Device {
	var out []Device
	for _, d := range m.Devices {
		if d.Kind == GPU {
			out = append(out, d)
		}
	}
	return out
}

// RootComplexIDs lists the machine's host bridges, in order, for the bus
// range questions pciaddr.LastBus and pciaddr.Covering answer.
func (m *Machine) RootComplexIDs() []pciaddr.RootComplex {
	ids := make([]pciaddr.RootComplex, len(m.RootComplexes))
	for i, rc := range m.RootComplexes {
		ids[i] = rc.ID
	}
	return ids
}

// Limits on what one profile may ask for, far above any real node.
const (
	MaxDevices       = 16384
	MaxRootComplexes = 4096
	maxBAR1Bytes     = uint64(1) << 44 // 16 TiB
	minBAR1Bytes     = uint64(1) << 20
	revisionA1       = 0xa1 // every board in REAL-HARDWARE.md
)

// Options adjust normalisation.
type Options struct {
	// Hierarchy overrides the profile's pcie_topology.hierarchy.
	Hierarchy boards.Hierarchy
}

// Normalize validates a profile and resolves defaults. source names the
// profile in errors.
func Normalize(source string, p *Profile, opts Options) (*Machine, error) {
	n := normalizer{source: source, p: p}
	return n.run(opts)
}

type normalizer struct {
	source string
	p      *Profile
}

func (n *normalizer) fail(field, value string, format string, args ...any) error {
	return &Error{Source: n.source, Field: field, Value: value, Err: fmt.Errorf(format, args...)}
}

func (n *normalizer) run(opts Options) (*Machine, error) {
	p := n.p
	slots, err := n.slots()
	if err != nil {
		return nil, err
	}
	m := &Machine{Source: n.source}
	seen := map[pciaddr.Address]string{}
	claim := func(a pciaddr.Address, field, value string) error {
		if other, dup := seen[a]; dup {
			return n.fail(field, value, "the same PCI address as %s", other)
		}
		seen[a] = field
		return nil
	}
	for _, sl := range slots {
		d, field, value, err := n.gpu(sl)
		if err != nil {
			return nil, err
		}
		if err := claim(d.Address, field, value); err != nil {
			return nil, err
		}
		m.Devices = append(m.Devices, d)
	}
	h, err := n.hierarchy(opts, m.Devices)
	if err != nil {
		return nil, err
	}
	m.Hierarchy = h
	if p.NVLink != nil {
		for i := range p.NVLink.Switches {
			d, err := n.nvswitch(i, m.Devices[0])
			if err != nil {
				return nil, err
			}
			if err := claim(d.Address, fmt.Sprintf("nvlink.switches[%d].bdf", i), p.NVLink.Switches[i].BDF); err != nil {
				return nil, err
			}
			m.Devices = append(m.Devices, d)
		}
	}
	if len(m.Devices) > MaxDevices {
		return nil, n.fail("nvlink.switches", "", "more than %d devices in all", MaxDevices)
	}
	if err := n.place(m, seen); err != nil {
		return nil, err
	}
	slices.SortFunc(m.Devices, func(a, b Device) int { return a.Address.Compare(b.Address) })
	if err := n.machineExtras(m); err != nil {
		return nil, err
	}
	return m, nil
}

func (n *normalizer) hierarchy(opts Options, gpus []Device) (boards.Hierarchy, error) {
	if opts.Hierarchy != "" {
		if !opts.Hierarchy.Valid() {
			return "", n.fail("--hierarchy", string(opts.Hierarchy), "want one of %v", boards.Hierarchies())
		}
		return opts.Hierarchy, nil
	}
	if t := n.p.PCIeTopology; t != nil && t.Hierarchy != "" {
		h := boards.Hierarchy(t.Hierarchy)
		if !h.Valid() {
			return "", n.fail("pcie_topology.hierarchy", t.Hierarchy, "want one of %v", boards.Hierarchies())
		}
		return h, nil
	}
	first := slices.MinFunc(gpus, func(a, b Device) int { return a.Address.Compare(b.Address) })
	return boards.HierarchyOf(first.Name, first.DeviceID), nil
}

// slot is one device nvml-mock would report: its index, and the devices[]
// entry that overrides device_defaults for it (pos -1 for none).
type slot struct {
	index, pos int
}

// slots lists the devices as nvml-mock counts them: as many as devices[]
// lists or system.num_devices says, whichever is more, each devices[] entry
// overriding the device its index names (its position when it has none).
func (n *normalizer) slots() ([]slot, error) {
	p := n.p
	if len(p.Devices) > MaxDevices {
		return nil, n.fail("devices", fmt.Sprint(len(p.Devices)), "more than %d devices", MaxDevices)
	}
	byIndex := map[int]int{}
	for pos, d := range p.Devices {
		index := pos
		if d.Index != nil {
			index = *d.Index
		}
		field := fmt.Sprintf("devices[%d].index", pos)
		if index < 0 || index >= MaxDevices {
			return nil, n.fail(field, fmt.Sprint(index), "want a device index 0..%d", MaxDevices-1)
		}
		if other, dup := byIndex[index]; dup {
			return nil, n.fail(field, fmt.Sprint(index), "the same device index as devices[%d]", other)
		}
		byIndex[index] = pos
	}
	count := len(p.Devices)
	if num := p.System.NumDevices; num != nil {
		if *num < 0 || *num > MaxDevices {
			return nil, n.fail("system.num_devices", fmt.Sprint(*num), "want 0..%d", MaxDevices)
		}
		count = max(count, *num)
	}
	if count == 0 {
		return nil, n.fail("devices", "", "no devices: list them in devices[] (or set system.num_devices)")
	}
	var out []slot
	for i := 0; i < count; i++ {
		pos, ok := byIndex[i]
		if !ok {
			pos = -1
		}
		out = append(out, slot{index: i, pos: pos})
	}
	for index, pos := range byIndex {
		if index >= count {
			out = append(out, slot{index: index, pos: pos})
		}
	}
	slices.SortFunc(out, func(a, b slot) int { return a.index - b.index })
	return out, nil
}

// gpu resolves one device. It returns the field and value its address came
// from, to name them if another device claims the same address.
func (n *normalizer) gpu(sl slot) (Device, string, string, error) {
	var dc DeviceConfig
	if sl.pos >= 0 {
		dc = n.p.Devices[sl.pos]
	}
	def := n.p.DeviceDefaults
	field := func(f string) string {
		if sl.pos >= 0 {
			return fmt.Sprintf("devices[%d].%s", sl.pos, f)
		}
		return fmt.Sprintf("device_defaults.%s (device %d)", f, sl.index)
	}
	d := Device{Kind: GPU, Index: sl.index, Revision: revisionA1}
	busField, busID := field("pci.bus_id"), dc.PCI.BusID
	if busID == "" && def.PCI.BusID != "" {
		busField, busID = "device_defaults.pci.bus_id", def.PCI.BusID
	}
	if busID == "" {
		// nvml-mock's own rule for a device without an address.
		if sl.index > 0xff {
			return d, "", "", n.fail(field("pci.bus_id"), "", "missing, and device index %d is too large for nvml-mock's default 0000:<index>:00.0", sl.index)
		}
		busID = fmt.Sprintf("0000:%02x:00.0", sl.index)
	}
	a, err := pciaddr.Parse(busID)
	if err != nil {
		return d, "", "", n.fail(busField, busID, "%s", reason(err))
	}
	d.Address = a
	own := (*DeviceConfig)(nil)
	if sl.pos >= 0 {
		own = &n.p.Devices[sl.pos]
	}
	d.UUID, d.Minor = gpuNVMLIdentity(sl.index, own)
	d, err = n.identity(d, dc, def, field)
	return d, busField, busID, err
}

// identity fills a GPU's ids, BAR1 and link from its override and the defaults.
func (n *normalizer) identity(d Device, dc, def DeviceConfig, field func(string) string) (Device, error) {
	d.Name = firstString(dc.Name, def.Name)
	// from names where a value came from: the device's override or the defaults.
	from := func(name string, own bool) string {
		if own {
			return field(name)
		}
		return "device_defaults." + name
	}

	id := firstWord(dc.PCI.DeviceID, def.PCI.DeviceID)
	idField := from("pci.device_id", dc.PCI.DeviceID != nil)
	if id == nil {
		return d, n.fail(field("pci.device_id"), "", "missing, and device_defaults.pci.device_id is not set either")
	}
	d.Vendor, d.DeviceID = id.Unpack()
	if d.Vendor != boards.VendorNVIDIA {
		return d, n.fail(idField, fmt.Sprintf("0x%08X", uint32(*id)), "vendor 0x%04x is not NVIDIA (0x10de); the word is (device<<16)|vendor", d.Vendor)
	}
	if sub := firstWord(dc.PCI.SubsystemID, def.PCI.SubsystemID); sub != nil {
		d.SubsystemVendor, d.SubsystemDevice = sub.Unpack()
	} else {
		// Without a subsystem id, say the board is NVIDIA's own reference design.
		d.SubsystemVendor, d.SubsystemDevice = d.Vendor, d.DeviceID
	}
	d.Class = Class3DController
	if c := firstWord(dc.PCI.Class, def.PCI.Class); c != nil {
		d.Class = uint32(*c)
		if d.Class != Class3DController && d.Class != ClassVGAController {
			return d, n.fail(from("pci.class", dc.PCI.Class != nil), fmt.Sprintf("0x%06x", d.Class), "a GPU is 0x030200 (3D controller) or 0x030000 (VGA); NVSwitches go under nvlink.switches")
		}
	}
	bar1 := firstUint(dc.BAR1Memory.TotalBytes, def.BAR1Memory.TotalBytes)
	if bar1 == nil {
		d.BAR1Bytes = 256 << 20
		if b, ok := d.Board(); ok && b.BAR1Bytes != 0 {
			d.BAR1Bytes = b.BAR1Bytes
		}
	} else {
		if *bar1 < minBAR1Bytes || *bar1 > maxBAR1Bytes {
			return d, n.fail(from("bar1_memory.total_bytes", dc.BAR1Memory.TotalBytes != nil), fmt.Sprint(*bar1), "want 1 MiB to 16 TiB")
		}
		// A BAR is a power of two; round up as firmware sizes it.
		d.BAR1Bytes = uint64(1) << (64 - bits.LeadingZeros64(*bar1-1))
	}
	link, err := n.link(field, dc.PCIe, def.PCIe, d)
	if err != nil {
		return d, err
	}
	d.Link = link
	d.Driver = DriverNVIDIA
	if drv := firstString(dc.PCI.Driver, def.PCI.Driver); drv != "" {
		d.Driver = strings.TrimSpace(drv)
		if d.Driver != DriverNVIDIA && d.Driver != DriverVFIO {
			return d, n.fail(from("pci.driver", dc.PCI.Driver != ""), drv, "want %s (the default) or %s (a GPU for passthrough)", DriverNVIDIA, DriverVFIO)
		}
	}
	return d, nil
}

// GPUsOn returns the machine's GPUs bound to driver, sorted by address:
// DriverNVIDIA's are those NVML lists, DriverVFIO's those bound for
// passthrough, which it does not.
func (m *Machine) GPUsOn(driver string) []Device {
	var out []Device
	for _, d := range m.GPUs() {
		if d.Driver == driver {
			out = append(out, d)
		}
	}
	return out
}

// VFIOGPUs counts the GPUs bound to vfio-pci.
func (m *Machine) VFIOGPUs() int { return len(m.GPUsOn(DriverVFIO)) }

func (n *normalizer) link(field func(string) string, pc, def PCIeConfig, gpu Device) (Link, error) {
	gen, width := 4, 16
	if b, ok := gpu.Board(); ok {
		gen, width = b.LinkGen, b.LinkWidth
	}
	pick := func(name string, v, dv *int, fallback int, valid func(int) bool, want string) (int, error) {
		f := field("pcie." + name)
		if v == nil {
			f, v = "device_defaults.pcie."+name, dv
		}
		if v == nil {
			return fallback, nil
		}
		if !valid(*v) {
			return 0, n.fail(f, fmt.Sprint(*v), "want %s", want)
		}
		return *v, nil
	}
	gens := fmt.Sprintf("a PCIe generation 1..%d", sysfs.MaxLinkGen)
	widths := "a link width of " + sysfs.LinkWidthsText()
	var l Link
	var err error
	if l.MaxGen, err = pick("max_link_gen", pc.MaxLinkGen, def.MaxLinkGen, gen, sysfs.ValidLinkGen, gens); err != nil {
		return l, err
	}
	if l.CurrentGen, err = pick("current_link_gen", pc.CurrentLinkGen, def.CurrentLinkGen, l.MaxGen, sysfs.ValidLinkGen, gens); err != nil {
		return l, err
	}
	if l.MaxWidth, err = pick("max_link_width", pc.MaxLinkWidth, def.MaxLinkWidth, width, sysfs.ValidLinkWidth, widths); err != nil {
		return l, err
	}
	if l.CurrentWidth, err = pick("current_link_width", pc.CurrentLinkWidth, def.CurrentLinkWidth, l.MaxWidth, sysfs.ValidLinkWidth, widths); err != nil {
		return l, err
	}
	return l, nil
}

func (n *normalizer) nvswitch(i int, gpu Device) (Device, error) {
	sc := n.p.NVLink.Switches[i]
	field := fmt.Sprintf("nvlink.switches[%d].bdf", i)
	a, err := pciaddr.Parse(sc.BDF)
	if err != nil {
		return Device{}, n.fail(field, sc.BDF, "%s", reason(err))
	}
	d := Device{
		Kind: NVSwitch, Index: i, Name: "NVSwitch", Address: a,
		Vendor: boards.VendorNVIDIA, DeviceID: boards.NVSwitchDeviceFor(gpu.Name, gpu.DeviceID),
		Class: ClassNVSwitch, Revision: revisionA1, Link: Link{MaxGen: 4, CurrentGen: 4, MaxWidth: 8, CurrentWidth: 8},
	}
	if sc.DeviceID != nil {
		d.Vendor, d.DeviceID = sc.DeviceID.Unpack()
		if d.Vendor != boards.VendorNVIDIA {
			return d, n.fail(fmt.Sprintf("nvlink.switches[%d].device_id", i), fmt.Sprintf("0x%08X", uint32(*sc.DeviceID)), "vendor 0x%04x is not NVIDIA (0x10de)", d.Vendor)
		}
	}
	d.SubsystemVendor, d.SubsystemDevice = d.Vendor, d.DeviceID
	d.Driver = DriverNVSwitch
	switch drv := strings.TrimSpace(sc.Driver); drv {
	case "", DriverNVSwitch:
	case DriverVFIO:
		return d, n.fail(fmt.Sprintf("nvlink.switches[%d].driver", i), sc.Driver, "only a GPU can be bound to %s (pci.driver in devices[] or device_defaults); an NVSwitch keeps %s", DriverVFIO, DriverNVSwitch)
	default:
		return d, n.fail(fmt.Sprintf("nvlink.switches[%d].driver", i), sc.Driver, "want %s, an NVSwitch's own driver", DriverNVSwitch)
	}
	return d, nil
}

// place gives every device its root complex and NUMA node: those the
// profile's pcie_topology lists go where it says, the rest under the root
// complex whose bus range holds them; without a topology, each domain's
// devices hang under one root complex. With a topology it then checks that
// the numbering could exist: each root complex owns the buses from its
// root bus up to the next root complex's root bus in the same domain.
func (n *normalizer) place(m *Machine, seen map[pciaddr.Address]string) error {
	t := n.p.PCIeTopology
	if t == nil || len(t.RootComplexes) == 0 {
		placeByDomain(m)
		return nil
	}
	if len(t.RootComplexes) > MaxRootComplexes {
		return n.fail("pcie_topology.root_complexes", fmt.Sprint(len(t.RootComplexes)), "more than %d root complexes", MaxRootComplexes)
	}
	placed, err := n.placeListed(m, t.RootComplexes)
	if err != nil {
		return err
	}
	slices.SortFunc(m.RootComplexes, func(a, b RootComplex) int { return a.ID.Compare(b.ID) })
	ids := m.RootComplexIDs()
	if err := n.placeCovered(m, ids, placed, seen); err != nil {
		return err
	}
	numa := map[pciaddr.RootComplex]int{}
	for _, rc := range m.RootComplexes {
		numa[rc.ID] = rc.NUMANode
	}
	for i := range m.Devices {
		d := &m.Devices[i]
		d.NUMANode = numa[d.RootComplex]
		if err := n.checkBus(m.Hierarchy, ids, d, placed[d.Address]); err != nil {
			return err
		}
	}
	return nil
}

// placeByDomain puts each domain's devices under one root complex, on bus
// 00 of that domain: a profile without a topology.
func placeByDomain(m *Machine) {
	domains := map[uint16]bool{}
	for i := range m.Devices {
		d := &m.Devices[i]
		d.RootComplex = pciaddr.RootComplex{Domain: d.Address.Domain}
		if !domains[d.Address.Domain] {
			domains[d.Address.Domain] = true
			m.RootComplexes = append(m.RootComplexes, RootComplex{ID: d.RootComplex})
		}
	}
	slices.SortFunc(m.RootComplexes, func(a, b RootComplex) int { return a.ID.Compare(b.ID) })
}

// placeListed reads the topology's root complexes into m and places the
// devices each lists. It returns the field that placed each device.
func (n *normalizer) placeListed(m *Machine, rcs []RootComplexConfig) (map[pciaddr.Address]string, error) {
	index := map[pciaddr.Address]int{}
	for i, d := range m.Devices {
		index[d.Address] = i
	}
	placed := map[pciaddr.Address]string{}
	rcField := map[pciaddr.RootComplex]string{}
	for i, rc := range rcs {
		field := fmt.Sprintf("pcie_topology.root_complexes[%d]", i)
		parsed, err := n.rootComplex(field, rc, rcField)
		if err != nil {
			return nil, err
		}
		m.RootComplexes = append(m.RootComplexes, parsed)
		for j, s := range rc.Devices {
			df := fmt.Sprintf("%s.devices[%d]", field, j)
			a, err := pciaddr.Parse(s)
			if err != nil {
				return nil, n.fail(df, s, "%s", reason(err))
			}
			di, ok := index[a]
			if !ok {
				return nil, n.fail(df, s, "not in devices[] or nvlink.switches[]: the topology may only place devices the profile declares")
			}
			if other, dup := placed[a]; dup {
				return nil, n.fail(df, s, "already placed by %s: a device sits under one root complex", other)
			}
			placed[a] = df
			m.Devices[di].RootComplex = parsed.ID
		}
	}
	return placed, nil
}

// rootComplex reads one root complex of the topology: its id, unique among
// those read so far (rcField, which it adds to), and its NUMA node.
func (n *normalizer) rootComplex(field string, rc RootComplexConfig, rcField map[pciaddr.RootComplex]string) (RootComplex, error) {
	id, err := pciaddr.ParseRootComplex(rc.ID)
	if err != nil {
		return RootComplex{}, n.fail(field+".id", rc.ID, "%s", reason(err))
	}
	if other, dup := rcField[id]; dup {
		return RootComplex{}, n.fail(field+".id", rc.ID, "the same root complex as %s", other)
	}
	rcField[id] = field + ".id"
	numa := 0
	if rc.NUMANode != nil {
		numa = *rc.NUMANode
		if numa < -1 || numa > 1023 {
			return RootComplex{}, n.fail(field+".numa_node", fmt.Sprint(numa), "want -1 (no affinity) or a node 0..1023")
		}
	}
	return RootComplex{ID: id, NUMANode: numa}, nil
}

// placeCovered puts each device the topology leaves out under the root
// complex whose bus range holds it, as the kernel would find it, and
// records the device's own field as what placed it. An NVSwitch on a bus
// no root complex covers is off this tray's PCIe bus when the profile
// gives it no device_id, as nvml-mock means it (its NVL72 profiles list
// the rack's switches, which live in switch trays that the compute tray's
// lspci never shows): it leaves the machine, into m.OffBusSwitches. Any
// other device there is refused, a switch with a device_id too: the id
// says it is a PCI function of this tray.
func (n *normalizer) placeCovered(m *Machine, ids []pciaddr.RootComplex, placed, seen map[pciaddr.Address]string) error {
	kept := m.Devices[:0]
	for _, d := range m.Devices {
		if _, ok := placed[d.Address]; ok {
			kept = append(kept, d)
			continue
		}
		rc, ok := pciaddr.Covering(ids, d.Address)
		switch {
		case ok:
		case d.Kind == NVSwitch && n.p.NVLink.Switches[d.Index].DeviceID == nil:
			m.OffBusSwitches = append(m.OffBusSwitches, d)
			continue
		case d.Kind == NVSwitch:
			return n.fail(fmt.Sprintf("nvlink.switches[%d].device_id", d.Index), fmt.Sprintf("0x%08X", uint32(*n.p.NVLink.Switches[d.Index].DeviceID)),
				"puts the switch at %s on this tray's PCIe bus, but no root complex in pcie_topology covers bus %02x of domain %04x; list %s under one, or drop device_id for a switch in a switch tray of its own (rendered off the bus)",
				d.Address, d.Address.Bus, d.Address.Domain, d.Address)
		default:
			return n.fail(seen[d.Address], d.Address.String(), "no root complex in pcie_topology covers bus %02x of domain %04x; list the device under one", d.Address.Bus, d.Address.Domain)
		}
		d.RootComplex = rc
		placed[d.Address] = seen[d.Address]
		kept = append(kept, d)
	}
	m.Devices = kept
	return nil
}

// checkBus refuses a device whose bus no real hierarchy could give it; rcs
// are the machine's root complexes.
func (n *normalizer) checkBus(h boards.Hierarchy, rcs []pciaddr.RootComplex, d *Device, field string) error {
	rc := d.RootComplex
	value := d.Address.String()
	switch {
	case d.Address.Domain != rc.Domain:
		return n.fail(field, value, "domain %04x differs from its root complex %s", d.Address.Domain, rc)
	case d.Address.Bus < rc.Bus:
		return n.fail(field, value, "bus %02x is below the root bus %02x of %s: devices sit on or after their root bus", d.Address.Bus, rc.Bus, rc)
	case d.Address.Bus == rc.Bus && h != boards.Flat:
		return n.fail(field, value, "bus %02x is the root bus of %s: only a flat (VM) hierarchy puts a device on the root bus; use a later bus or pcie_topology.hierarchy: flat", d.Address.Bus, rc)
	}
	if last := pciaddr.LastBus(rcs, rc); d.Address.Bus > last {
		// Past rc's last bus starts the next root complex of the domain.
		next := pciaddr.RootComplex{Domain: rc.Domain, Bus: last + 1}
		return n.fail(field, value, "bus %02x lies in the range of %s, not of %s (which owns buses %02x-%02x)", d.Address.Bus, next, rc, rc.Bus, last)
	}
	return nil
}

// Board is the real board a GPU is (boards.Find: by its NVML name, then
// its device id).
func (d Device) Board() (boards.Board, bool) { return boards.Find(d.Name, d.DeviceID) }

func firstString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func firstWord(a, b *Word) *Word {
	if a != nil {
		return a
	}
	return b
}

func firstUint(a, b *uint64) *uint64 {
	if a != nil {
		return a
	}
	return b
}
