package capture

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// RootComplexMode says how to infer the root complexes nvidia-smi does not show.
type RootComplexMode string

const (
	// PerGPU gives each GPU bus its own host bridge just far enough above it
	// for the hierarchy's bridges, as on HGX H100 boards (pci0000:15 holds
	// the GPU on bus 18). A GPU too close to the one before it for bridges
	// of its own shares that one's host bridge; a GPU on bus 00 sits on the
	// root bus of pciDDDD:00.
	PerGPU RootComplexMode = "per-gpu"
	// PerDomain puts every GPU of a PCI domain under one host bridge,
	// pciDDDD:00, as nvml-mock profiles without pcie_topology get it.
	PerDomain RootComplexMode = "per-domain"
)

// RootComplexModes lists the valid modes.
func RootComplexModes() []RootComplexMode { return []RootComplexMode{PerGPU, PerDomain} }

// RootComplexSpec is a host bridge of the real node, as
// `ls -d /sys/devices/pci*` lists them, with its NUMA node.
type RootComplexSpec struct {
	ID       pciaddr.RootComplex
	NUMANode *int
}

// ParseRootComplexSpec reads --root-complex: pciDDDD:BB, or pciDDDD:BB=N
// with its NUMA node.
func ParseRootComplexSpec(s string) (RootComplexSpec, error) {
	id, numa, hasNUMA := strings.Cut(s, "=")
	rc, err := pciaddr.ParseRootComplex(id)
	if err != nil {
		return RootComplexSpec{}, err
	}
	spec := RootComplexSpec{ID: rc}
	if hasNUMA {
		var n int
		if _, err := fmt.Sscanf(numa, "%d", &n); err != nil || fmt.Sprint(n) != numa || n < -1 || n > 1023 {
			return RootComplexSpec{}, fmt.Errorf("%q: the NUMA node after = is -1 or 0..1023", s)
		}
		spec.NUMANode = &n
	}
	return spec, nil
}

// Options fill in what nvidia-smi does not show.
type Options struct {
	// RootComplexes is the inference used when Explicit is empty; default PerGPU.
	RootComplexes RootComplexMode
	// Explicit are the node's real host bridges; each GPU goes under the one
	// whose bus range holds it.
	Explicit []RootComplexSpec
	// Hierarchy is the bridge layout; default the board's, and flat when a
	// GPU sits on its root bus.
	Hierarchy boards.Hierarchy
	// NUMANode is given to every root complex without its own; nvidia-smi
	// -q -x shows none, so the default is -1 (no affinity published).
	NUMANode int
}

// DefaultOptions are what `import nvidia-smi` uses without flags.
func DefaultOptions() Options { return Options{RootComplexes: PerGPU, NUMANode: -1} }

// Result is an imported profile and the machine it normalises to.
type Result struct {
	Profile *profile.Profile
	Machine *profile.Machine
	// Header describes the import, for the top of the YAML.
	Header string
	// Notes say what the capture held that the profile could not use.
	Notes []string
}

// Profile writes the capture as an nvml-mock profile and checks that it
// normalises.
func (c *Capture) Profile(opts Options) (*Result, error) {
	opts.RootComplexes = cmp.Or(opts.RootComplexes, PerGPU)
	if !slices.Contains(RootComplexModes(), opts.RootComplexes) {
		return nil, fmt.Errorf("root complex inference %q: want one of %v", opts.RootComplexes, RootComplexModes())
	}
	if opts.Hierarchy != "" && !opts.Hierarchy.Valid() {
		return nil, fmt.Errorf("hierarchy %q: want one of %v", opts.Hierarchy, boards.Hierarchies())
	}
	gpus := slices.Clone(c.GPUs)
	slices.SortFunc(gpus, func(a, b GPU) int { return a.Address.Compare(b.Address) })

	h, err := c.hierarchy(gpus, opts)
	if err != nil {
		return nil, err
	}
	var rcs []profile.RootComplexConfig
	if len(opts.Explicit) > 0 {
		rcs, err = c.explicitRootComplexes(gpus, opts)
		if err != nil {
			return nil, err
		}
	} else {
		rcs = inferRootComplexes(gpus, opts.RootComplexes, h, opts.NUMANode)
	}
	if err := c.checkRootBus(rcs, h); err != nil {
		return nil, err
	}

	p := &profile.Profile{Version: "1.0", PCIeTopology: &profile.PCIeTopology{Hierarchy: string(h), RootComplexes: rcs}}
	var notes []string
	for i, g := range c.GPUs {
		p.Devices = append(p.Devices, deviceConfig(i, g))
		notes = append(notes, g.Notes...)
	}
	hoistDefaults(p)

	m, err := profile.Normalize(c.Source, p, profile.Options{})
	if err != nil {
		return nil, fmt.Errorf("the imported profile does not normalise: %w", err)
	}
	how := "inferred " + string(opts.RootComplexes)
	if len(opts.Explicit) > 0 {
		how = "as given"
	}
	header := fmt.Sprintf("nvml-mock-sysfs profile imported from nvidia-smi -q -x capture %s\n(driver %s, %s, hierarchy %s, root complexes %s).\n"+
		"nvidia-smi shows neither root complexes nor NUMA nodes: check pcie_topology against the node's /sys/devices/pci*.",
		c.Source, cmp.Or(c.DriverVersion, "N/A"), plural(len(c.GPUs), "GPU"), h, how)
	return &Result{Profile: p, Machine: m, Header: header, Notes: notes}, nil
}

// busID writes an address as nvml-mock profiles do: 0000:3B:00.0.
func busID(a pciaddr.Address) string {
	return fmt.Sprintf("%04X:%02X:%02X.%X", a.Domain, a.Bus, a.Device, a.Function)
}

func deviceConfig(i int, g GPU) profile.DeviceConfig {
	d := profile.DeviceConfig{
		Index: &i,
		Name:  g.Name,
		PCI:   profile.PCIConfig{BusID: busID(g.Address), DeviceID: profile.Pack(g.Vendor, g.Device)},
		PCIe: profile.PCIeConfig{
			MaxLinkGen: g.MaxLinkGen, CurrentLinkGen: g.CurrentLinkGen,
			MaxLinkWidth: g.MaxLinkWidth, CurrentLinkWidth: g.CurrentLinkWidth,
		},
		BAR1Memory: profile.MemoryConfig{TotalBytes: g.BAR1Bytes},
	}
	if g.SubsystemVendor != nil {
		d.PCI.SubsystemID = profile.Pack(*g.SubsystemVendor, *g.SubsystemDevice)
	}
	if g.Class != nil {
		w := profile.Word(*g.Class)
		d.PCI.Class = &w
	}
	return d
}

// hierarchy picks the bridge layout: the one asked for, else flat when a
// GPU sits on bus 00 (a VM), else the board's.
func (c *Capture) hierarchy(gpus []GPU, opts Options) (boards.Hierarchy, error) {
	if opts.Hierarchy != "" {
		return opts.Hierarchy, nil
	}
	ids := specIDs(opts.Explicit)
	onRoot := func(g GPU) bool {
		if len(ids) == 0 {
			return g.Address.Bus == 0
		}
		rc, ok := pciaddr.Covering(ids, g.Address)
		return ok && rc.Bus == g.Address.Bus
	}
	if slices.ContainsFunc(gpus, onRoot) {
		return boards.Flat, nil
	}
	return boards.HierarchyOf(gpus[0].Name, gpus[0].Device), nil
}

// checkRootBus refuses a forced non-flat hierarchy for a GPU on its root
// bus, naming the GPU, before the normaliser would name a profile field.
func (c *Capture) checkRootBus(rcs []profile.RootComplexConfig, h boards.Hierarchy) error {
	if h == boards.Flat {
		return nil
	}
	for _, rc := range rcs {
		id, _ := pciaddr.ParseRootComplex(rc.ID)
		for _, s := range rc.Devices {
			a, _ := pciaddr.Parse(s)
			if a.Bus == id.Bus {
				return &Error{Source: c.Source, Field: "gpu " + a.String(), Value: string(h),
					Err: fmt.Errorf("the GPU sits on the root bus of %s, where only the flat hierarchy puts a GPU", id)}
			}
		}
	}
	return nil
}

// bridgeBuses is how many buses a hierarchy's bridges take above a GPU: a
// root port's, and two per switch.
func bridgeBuses(h boards.Hierarchy) int {
	switch h {
	case boards.HGX:
		return 3
	case boards.DGX:
		return 5
	}
	return 1
}

func inferRootComplexes(gpus []GPU, mode RootComplexMode, h boards.Hierarchy, numa int) []profile.RootComplexConfig {
	var rcs []profile.RootComplexConfig
	add := func(id pciaddr.RootComplex) *profile.RootComplexConfig {
		rcs = append(rcs, profile.RootComplexConfig{ID: id.String(), NUMANode: &numa})
		return &rcs[len(rcs)-1]
	}
	var cur *profile.RootComplexConfig
	var curDomain uint16
	prevBus := -1
	for _, g := range gpus {
		a := g.Address
		if cur == nil || a.Domain != curDomain {
			curDomain, prevBus = a.Domain, -1
			cur = nil
		}
		switch mode {
		case PerDomain:
			if cur == nil {
				cur = add(pciaddr.RootComplex{Domain: a.Domain})
			}
		default:
			if int(a.Bus) != prevBus {
				root := max(int(a.Bus)-bridgeBuses(h), prevBus+1)
				if cur == nil || root < int(a.Bus) {
					cur = add(pciaddr.RootComplex{Domain: a.Domain, Bus: uint8(root)})
				}
			}
		}
		cur.Devices = append(cur.Devices, busID(a))
		prevBus = int(a.Bus)
	}
	return rcs
}

func (c *Capture) explicitRootComplexes(gpus []GPU, opts Options) ([]profile.RootComplexConfig, error) {
	specs := slices.Clone(opts.Explicit)
	slices.SortFunc(specs, func(a, b RootComplexSpec) int { return a.ID.Compare(b.ID) })
	var rcs []profile.RootComplexConfig
	index := map[pciaddr.RootComplex]int{}
	for _, s := range specs {
		if _, dup := index[s.ID]; dup {
			return nil, fmt.Errorf("root complex %s given twice", s.ID)
		}
		numa := opts.NUMANode
		if s.NUMANode != nil {
			numa = *s.NUMANode
		}
		index[s.ID] = len(rcs)
		rcs = append(rcs, profile.RootComplexConfig{ID: s.ID.String(), NUMANode: &numa, Devices: []string{}})
	}
	ids := specIDs(specs)
	for _, g := range gpus {
		rc, ok := pciaddr.Covering(ids, g.Address)
		if !ok {
			return nil, &Error{Source: c.Source, Field: "gpu " + g.BusID, Value: g.Address.String(),
				Err: fmt.Errorf("no given root complex of domain %04x has a root bus at or below bus %02x", g.Address.Domain, g.Address.Bus)}
		}
		r := &rcs[index[rc]]
		r.Devices = append(r.Devices, busID(g.Address))
	}
	return rcs, nil
}

// specIDs lists the host bridges of --root-complex, for pciaddr.Covering.
func specIDs(specs []RootComplexSpec) []pciaddr.RootComplex {
	ids := make([]pciaddr.RootComplex, len(specs))
	for i, s := range specs {
		ids[i] = s.ID
	}
	return ids
}

// hoistDefaults moves what every device shares into device_defaults, so
// the profile reads like the nvml-mock ones.
func hoistDefaults(p *profile.Profile) {
	devs := p.Devices
	def := &p.DeviceDefaults
	if name := devs[0].Name; name != "" && !slices.ContainsFunc(devs, func(d profile.DeviceConfig) bool { return d.Name != name }) {
		def.Name = name
		for i := range devs {
			devs[i].Name = ""
		}
	}
	def.PCI.DeviceID = hoist(devs, func(d *profile.DeviceConfig) **profile.Word { return &d.PCI.DeviceID })
	def.PCI.SubsystemID = hoist(devs, func(d *profile.DeviceConfig) **profile.Word { return &d.PCI.SubsystemID })
	def.PCI.Class = hoist(devs, func(d *profile.DeviceConfig) **profile.Word { return &d.PCI.Class })
	def.PCIe.MaxLinkGen = hoist(devs, func(d *profile.DeviceConfig) **int { return &d.PCIe.MaxLinkGen })
	def.PCIe.CurrentLinkGen = hoist(devs, func(d *profile.DeviceConfig) **int { return &d.PCIe.CurrentLinkGen })
	def.PCIe.MaxLinkWidth = hoist(devs, func(d *profile.DeviceConfig) **int { return &d.PCIe.MaxLinkWidth })
	def.PCIe.CurrentLinkWidth = hoist(devs, func(d *profile.DeviceConfig) **int { return &d.PCIe.CurrentLinkWidth })
	def.BAR1Memory.TotalBytes = hoist(devs, func(d *profile.DeviceConfig) **uint64 { return &d.BAR1Memory.TotalBytes })
}

// hoist returns the value every device has set alike, clearing it in the
// devices; nil, changing nothing, when any device lacks it or differs.
func hoist[T comparable](devs []profile.DeviceConfig, field func(*profile.DeviceConfig) **T) *T {
	first := *field(&devs[0])
	if first == nil {
		return nil
	}
	for i := range devs {
		v := *field(&devs[i])
		if v == nil || *v != *first {
			return nil
		}
	}
	for i := range devs {
		*field(&devs[i]) = nil
	}
	return first
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
