package plan

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// Role says what a node of the PCI tree is.
type Role int

const (
	Endpoint   Role = iota // a GPU or NVSwitch from the profile
	RootPort               // a PCIe root port on the root bus
	SwitchUp               // a PCIe switch upstream port
	SwitchDown             // a PCIe switch downstream port
	PCIBridge              // a PCIe-to-PCI bridge, used only as an anchor
)

func (r Role) String() string {
	return [...]string{"endpoint", "root port", "switch upstream port", "switch downstream port", "PCI bridge"}[r]
}

// IsBridge reports whether the node has a type-1 (bridge) config header.
func (r Role) IsBridge() bool { return r != Endpoint }

// Identity is what a PCI function says it is.
type Identity struct {
	Vendor, Device                   uint16
	SubsystemVendor, SubsystemDevice uint16
	Class                            uint32
	Revision                         uint8
}

// Node is one PCI function of the planned tree.
type Node struct {
	Role        Role
	Address     pciaddr.Address
	RootComplex pciaddr.RootComplex
	NUMANode    int
	Identity    Identity
	Link        profile.Link
	Device      *profile.Device // the profile's device, for endpoints
	Parent      *Node           // nil directly under the root complex
	Children    []*Node
	// Secondary and Subordinate are a bridge's bus range.
	Secondary, Subordinate uint8
	// Anchor is the bridge at depth sysfs.LinksDepth (below sys/) an
	// endpoint's link starts from.
	Anchor *Node
	// TotalVFs is an SR-IOV physical function's sriov_totalvfs, VFs its
	// enabled virtual functions; PhysFn is a virtual function's parent.
	TotalVFs int
	VFs      []*Node
	PhysFn   *Node
	// Filled in by the planner once the tree is fixed.
	sysPath string // devices/pciDDDD:BB/.../BDF, relative to sys/
	ordinal int    // position in depth-first order
	bars    []bar
	// vfAddresses are where all TotalVFs virtual functions would sit.
	vfAddresses []pciaddr.Address
}

// SysPath is the node's directory relative to the overlay's sys/.
func (n *Node) SysPath() string { return n.sysPath }

// Depth is the number of path elements of SysPath: a root port is at 3.
func (n *Node) Depth() int { return strings.Count(n.sysPath, "/") + 1 }

// Tree is the planned PCI hierarchy of all root complexes.
type Tree struct {
	RootComplexes []TreeRoot
	Hierarchy     boards.Hierarchy
	HCAs          []HCA   // in GPU index order, then HCA order
	nodes         []*Node // depth-first order
}

// TreeRoot is one host bridge and the nodes directly below it.
type TreeRoot struct {
	ID       pciaddr.RootComplex
	NUMANode int
	Children []*Node
	// Synthetic marks a root complex added only to hold an anchor.
	Synthetic bool
}

// Nodes returns every node in depth-first order.
func (t *Tree) Nodes() []*Node { return t.nodes }

// Bridge identities by hierarchy, from real machines: Intel and AMD root
// ports, Broadcom PEX switches (REAL-HARDWARE.md), QEMU's ports in VMs.
func rootPortIdentity(h boards.Hierarchy) Identity {
	switch h {
	case boards.DGX:
		return Identity{Vendor: 0x1022, Device: 0x1483, SubsystemVendor: 0x1022, SubsystemDevice: 0x1453, Class: profile.ClassPCIBridge}
	case boards.Flat:
		return Identity{Vendor: 0x1b36, Device: 0x000c, SubsystemVendor: 0x1af4, SubsystemDevice: 0x1100, Class: profile.ClassPCIBridge}
	}
	return Identity{Vendor: 0x8086, Device: 0x2030, SubsystemVendor: 0x8086, SubsystemDevice: 0x0000, Class: profile.ClassPCIBridge, Revision: 0x04}
}

func switchIdentity(h boards.Hierarchy) Identity {
	if h == boards.DGX {
		// PEX88096, subsystem 1000:a096, as on DGX A100.
		return Identity{Vendor: 0x1000, Device: 0xc010, SubsystemVendor: 0x1000, SubsystemDevice: 0xa096, Class: profile.ClassPCIBridge, Revision: 0xb0}
	}
	// PEX890xx, as on HGX H100 boards.
	return Identity{Vendor: 0x1000, Device: 0xc030, SubsystemVendor: 0x1000, SubsystemDevice: 0xc030, Class: profile.ClassPCIBridge, Revision: 0xb0}
}

func anchorBridgeIdentity(h boards.Hierarchy) Identity {
	if h == boards.Flat {
		// QEMU's pcie-pci-bridge, found behind a root port in q35 VMs.
		return Identity{Vendor: 0x1b36, Device: 0x000e, SubsystemVendor: 0x1af4, SubsystemDevice: 0x1100, Class: profile.ClassPCIBridge}
	}
	// ASPEED AST1150, the PCIe-to-PCI bridge in front of a server's BMC,
	// which sits at depth 4 on real boards (pci0000:00/00:1c.5/02:00.0).
	return Identity{Vendor: 0x1a03, Device: 0x1150, SubsystemVendor: 0x1a03, SubsystemDevice: 0x1150, Class: profile.ClassPCIBridge, Revision: 0x04}
}

// switchLevels is how many PCIe switches a hierarchy puts above each GPU.
func switchLevels(h boards.Hierarchy) int {
	switch h {
	case boards.HGX:
		return 1
	case boards.DGX:
		return 2
	}
	return 0
}

const (
	// pairSize is how many GPUs share a switch when numbering allows: two per
	// switch on HGX and DGX boards.
	pairSize = 2
	// pairReach is how far (in buses) a GPU may lie from the previous one to
	// still share its switch.
	pairReach = 0x10
	maxPorts  = 32 // device numbers on a switch's internal bus
)

// BuildOptions constrain the tree.
type BuildOptions struct {
	// Reserved addresses belong to someone else (the host's own devices when
	// merging): no bridge takes them, and no bridge range swallows their bus.
	Reserved []pciaddr.Address
	// ReservedBuses are the host bridges' bus ranges: no mock bridge takes
	// a bus of them, even one no host device sits on.
	ReservedBuses []BusRange
}

// BuildTree arranges the machine's devices into a PCI hierarchy. It gives
// every endpoint the hierarchy asked for where the numbering leaves room,
// and a shallower but consistent one where it does not.
func BuildTree(m *profile.Machine, opts BuildOptions) (*Tree, error) {
	t := &Tree{Hierarchy: m.Hierarchy}
	reserved := map[pciaddr.Address]bool{}
	// domain, bus -> the host's device or bridge that owns the bus
	reservedBus := map[[2]uint16]string{}
	for _, r := range opts.ReservedBuses {
		for bus := int(r.First); bus <= int(r.Last); bus++ {
			reservedBus[[2]uint16{r.Domain, uint16(bus)}] = fmt.Sprintf("host bridge %s (buses %02x-%02x)", r.Owner, r.First, r.Last)
		}
	}
	for _, a := range opts.Reserved {
		reserved[a] = true
		reservedBus[[2]uint16{a.Domain, uint16(a.Bus)}] = "host device " + a.String()
	}
	byRC := map[pciaddr.RootComplex][]*profile.Device{}
	for i := range m.Devices {
		d := &m.Devices[i]
		byRC[d.RootComplex] = append(byRC[d.RootComplex], d)
	}
	var builders []*rcBuilder
	ids := m.RootComplexIDs()
	for _, rc := range m.RootComplexes {
		b := &rcBuilder{
			root:        TreeRoot{ID: rc.ID, NUMANode: rc.NUMANode},
			limit:       pciaddr.LastBus(ids, rc.ID),
			hierarchy:   m.Hierarchy,
			reserved:    reserved,
			reservedBus: reservedBus,
			usedDev:     map[uint8]bool{},
		}
		if err := b.build(byRC[rc.ID]); err != nil {
			return nil, err
		}
		builders = append(builders, b)
	}
	if err := addAnchors(t, &builders, reserved, reservedBus); err != nil {
		return nil, err
	}
	if err := placeHCAs(m, t, builders); err != nil {
		return nil, err
	}
	for _, b := range builders {
		t.RootComplexes = append(t.RootComplexes, b.root)
	}
	t.index()
	return t, nil
}

// rcBuilder lays out one root complex.
type rcBuilder struct {
	root        TreeRoot
	limit       uint8 // the last bus this root complex owns
	hierarchy   boards.Hierarchy
	reserved    map[pciaddr.Address]bool
	reservedBus map[[2]uint16]string // the host's owner of a bus, if any
	usedDev     map[uint8]bool       // device numbers taken on the root bus
	groups      []*group
	cursor      uint8 // the highest bus in use so far
}

// group is one root port and the switches below it.
type group struct {
	rootPort *Node
	levels   int     // switch levels actually built
	buses    int     // distinct endpoint buses below
	switches []*Node // upstream ports, outermost first; the last is where new ports go
}

func (b *rcBuilder) isReservedBus(bus uint8) bool {
	return b.hostOwner(bus) != ""
}

// hostOwner names the host's device or bridge that owns a bus.
func (b *rcBuilder) hostOwner(bus uint8) string {
	return b.reservedBus[[2]uint16{b.root.ID.Domain, uint16(bus)}]
}

func (b *rcBuilder) build(devs []*profile.Device) error {
	b.cursor = b.root.ID.Bus
	// Endpoints on the root bus itself sit directly under the host bridge.
	byBus := map[uint8][]*profile.Device{}
	var buses []uint8
	for _, d := range devs {
		if d.Address.Bus == b.root.ID.Bus {
			b.usedDev[d.Address.Device] = true
			b.root.Children = append(b.root.Children, endpointNode(d, nil))
			continue
		}
		if _, ok := byBus[d.Address.Bus]; !ok {
			buses = append(buses, d.Address.Bus)
		}
		byBus[d.Address.Bus] = append(byBus[d.Address.Bus], d)
	}
	for a := range b.reserved {
		if a.Domain == b.root.ID.Domain && a.Bus == b.root.ID.Bus {
			b.usedDev[a.Device] = true
		}
	}
	slices.Sort(buses)
	for _, bus := range buses {
		for _, d := range byBus[bus] {
			if b.reserved[d.Address] {
				return fmt.Errorf("%s (%s) is also a device of the host", d.Address, d.Kind)
			}
		}
		if b.isReservedBus(bus) {
			d := d0(byBus[bus])
			// Name the root complex first, as place's errors do: the bus
			// alone does not say which host bridge the planner was filling.
			return &HostDevicesError{Reason: fmt.Sprintf("%s: mock %s %s sits on bus %04x:%02x, which the host's %s owns: no mock bridge can lead there", b.root.ID, d.Kind, d.Address, b.root.ID.Domain, bus, b.hostOwner(bus))}
		}
		parent, err := b.place(bus)
		if err != nil {
			return fmt.Errorf("%s: %w", b.root.ID, err)
		}
		for _, d := range byBus[bus] {
			n := endpointNode(d, parent)
			parent.Children = append(parent.Children, n)
		}
		b.cursor = bus
	}
	return nil
}

func d0(ds []*profile.Device) *profile.Device { return ds[0] }

func endpointNode(d *profile.Device, parent *Node) *Node {
	return &Node{
		Role: Endpoint, Address: d.Address, RootComplex: d.RootComplex, NUMANode: d.NUMANode,
		Identity: Identity{
			Vendor: d.Vendor, Device: d.DeviceID, SubsystemVendor: d.SubsystemVendor,
			SubsystemDevice: d.SubsystemDevice, Class: d.Class, Revision: d.Revision,
		},
		Link: d.Link, Device: d, Parent: parent,
	}
}

// freeRun counts the unused buses just below bus, down to the cursor.
func (b *rcBuilder) freeRun(bus uint8) int {
	n := 0
	for x := int(bus) - 1; x > int(b.cursor) && !b.isReservedBus(uint8(x)); x-- {
		n++
	}
	return n
}

// place returns the bridge whose secondary bus will be bus, building or
// extending a group for it.
func (b *rcBuilder) place(bus uint8) (*Node, error) {
	want := switchLevels(b.hierarchy)
	free := b.freeRun(bus)
	var last *group
	if len(b.groups) > 0 {
		last = b.groups[len(b.groups)-1]
	}
	canJoin := last != nil && last.levels > 0 && free == int(bus)-int(b.cursor)-1 && len(last.switches[len(last.switches)-1].Children) < maxPorts
	switch {
	case canJoin && last.levels == want && last.buses < pairSize && int(bus)-int(b.cursor) <= pairReach:
		return b.join(last, bus, free), nil
	case free >= 2*want:
		return b.newGroup(bus, want)
	case canJoin:
		return b.join(last, bus, free), nil
	default:
		return b.newGroup(bus, free/2)
	}
}

// newGroup builds a root port and levels switches whose last downstream
// port has bus as its secondary bus. The switches take the 2*levels buses
// just below bus.
func (b *rcBuilder) newGroup(bus uint8, levels int) (*Node, error) {
	dev, fn, ok := b.freeRootPortSlot()
	if !ok {
		return nil, fmt.Errorf("no free device number on root bus %02x for another root port", b.root.ID.Bus)
	}
	first := bus - uint8(2*levels)
	rp := b.addRootPort(dev, fn, first, bus)
	g := &group{rootPort: rp, levels: levels, buses: 1}
	b.groups = append(b.groups, g)
	parent := rp
	for l := 0; l < levels; l++ {
		up := b.addSwitch(parent, first+uint8(2*l))
		g.switches = append(g.switches, up)
		parent = up
	}
	if levels == 0 {
		return rp, nil
	}
	return b.addDownPort(parent, bus), nil
}

// addRootPort adds a root port at dev.fn of the root bus, for buses sec-sub.
func (b *rcBuilder) addRootPort(dev, fn, sec, sub uint8) *Node {
	rp := &Node{
		Role:        RootPort,
		Address:     pciaddr.Address{Domain: b.root.ID.Domain, Bus: b.root.ID.Bus, Device: dev, Function: fn},
		Identity:    rootPortIdentity(b.hierarchy),
		Secondary:   sec,
		Subordinate: sub,
	}
	b.root.Children = append(b.root.Children, rp)
	return rp
}

// addBridge adds a bridge of role below parent, as device 0 on bus, whose
// secondary and subordinate bus is the next one: the start of a chain that
// widen extends as devices go below it.
func (b *rcBuilder) addBridge(parent *Node, role Role, bus uint8, id Identity) *Node {
	n := &Node{
		Role:        role,
		Address:     pciaddr.Address{Domain: b.root.ID.Domain, Bus: bus},
		Identity:    id,
		Parent:      parent,
		Secondary:   bus + 1,
		Subordinate: bus + 1,
	}
	parent.Children = append(parent.Children, n)
	return n
}

// addSwitch adds a switch whose upstream port sits on bus. Below an
// upstream port, it hangs from a new downstream port of that switch.
func (b *rcBuilder) addSwitch(parent *Node, bus uint8) *Node {
	if parent.Role == SwitchUp {
		parent = b.addDownPort(parent, bus)
	}
	up := b.addBridge(parent, SwitchUp, bus, switchIdentity(b.hierarchy))
	widen(parent, bus+1)
	return up
}

// widen raises the subordinate bus of n and every bridge above it.
func widen(n *Node, bus uint8) {
	for ; n != nil; n = n.Parent {
		n.Subordinate = max(n.Subordinate, bus)
	}
}

// addDownPort adds a downstream port to the switch whose upstream port is up,
// with bus as its secondary bus, and widens every range above it.
func (b *rcBuilder) addDownPort(up *Node, bus uint8) *Node {
	down := &Node{
		Role:        SwitchDown,
		Address:     pciaddr.Address{Domain: b.root.ID.Domain, Bus: up.Secondary, Device: uint8(len(up.Children))},
		Identity:    up.Identity,
		Parent:      up,
		Secondary:   bus,
		Subordinate: bus,
	}
	up.Children = append(up.Children, down)
	widen(up, bus)
	return down
}

// join adds bus to an existing group: through a new lower-level switch when
// the free buses allow, else as one more port of the deepest switch.
func (b *rcBuilder) join(g *group, bus uint8, free int) *Node {
	g.buses++
	widen(g.rootPort, bus)
	if g.levels >= 2 && free >= 2 && len(g.switches[0].Children) < maxPorts {
		// A new second-level switch below the first-level one.
		up := b.addSwitch(g.switches[0], bus-2)
		g.switches = append(g.switches, up)
		return b.addDownPort(up, bus)
	}
	return b.addDownPort(g.switches[len(g.switches)-1], bus)
}

// freeRootPortSlot picks a device number on the root bus for a root port:
// 01.0, 02.0, ... as Intel numbers them, then further functions of the
// root ports' own device numbers.
func (b *rcBuilder) freeRootPortSlot() (uint8, uint8, bool) {
	for dev := uint8(1); dev < 32; dev++ {
		if !b.usedDev[dev] {
			b.usedDev[dev] = true
			return dev, 0, true
		}
	}
	for _, n := range b.root.Children {
		if n.Role != RootPort {
			continue
		}
		for fn := uint8(1); fn < 8; fn++ {
			a := pciaddr.Address{Domain: n.Address.Domain, Bus: n.Address.Bus, Device: n.Address.Device, Function: fn}
			if !b.hasChildAt(a) && !b.reserved[a] {
				return a.Device, fn, true
			}
		}
	}
	return 0, 0, false
}

func (b *rcBuilder) hasChildAt(a pciaddr.Address) bool {
	return slices.ContainsFunc(b.root.Children, func(n *Node) bool { return n.Address == a })
}
