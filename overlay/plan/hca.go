package plan

import (
	"fmt"
	"slices"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// HCA is one ConnectX adapter of the profile's infiniband block and the GPU
// it sits beside.
type HCA struct {
	Node *Node // the HCA's function; Node.Device.Kind is profile.HCA
	GPU  *Node
}

// hcaBARs is a ConnectX physical function's layout: one 64-bit
// prefetchable BAR0, and the ROM.
func hcaBARs() []barSpec {
	return []barSpec{{0, boards.HCABAR0Bytes, sysfs.ResourceFlagsMem64Pref}, {sysfs.ResourceROMLine, boards.HCAROMBytes, sysfs.ResourceFlagsROM}}
}

// placeHCAs gives each GPU that carries HCAs (HCASpec.Carries) those of the
// machine's infiniband block, once the GPUs' tree and its anchors are
// fixed, so that a machine's GPUs, bridges and anchors sit exactly where
// they would without the block.
//
// An HCA goes where real HGX and DGX boards put it: on a downstream port of
// its GPU's own PCIe switch, next to the GPU's, on the first bus after the
// switch's range, widening the ranges above it. Where the GPU has no
// switch (a flat or tightly numbered layout) or that bus is taken, the HCA
// gets a root port of its own on the GPU's root complex, on the highest bus
// no range holds. GPUs are served in index order, so adding a GPU moves no
// other GPU's HCA unless the new GPU, or a bridge of its own, takes that
// very bus. Every bus is checked against the live tree and the host's
// reserved buses before it is taken, so an HCA never collides with a GPU,
// a bridge or a host device.
func placeHCAs(m *profile.Machine, t *Tree, builders []*rcBuilder) error {
	spec := m.HCAs
	if spec == nil {
		return nil
	}
	byRC := map[pciaddr.RootComplex]*rcBuilder{}
	var gpus []*Node
	for _, b := range builders {
		byRC[b.root.ID] = b
		for _, n := range b.root.Children {
			walk(n, func(n *Node) {
				if n.Role == Endpoint && n.Device.Kind == profile.GPU {
					gpus = append(gpus, n)
				}
			})
		}
	}
	slices.SortFunc(gpus, func(a, b *Node) int { return a.Device.Index - b.Device.Index })
	var anchors []*Node
	for _, b := range builders {
		anchors = append(anchors, depth4Bridges(b.root.Children)...)
	}
	pick := newAnchorPicker(anchors)
	for _, g := range gpus {
		if !spec.Carries(g.Device.Index) {
			continue // a root without a NIC beside this GPU, as on PCIe servers
		}
		b := byRC[g.Device.RootComplex]
		for k := 0; k < spec.PerGPU; k++ {
			d := &profile.Device{
				Kind: profile.HCA, Index: len(t.HCAs), Name: spec.Name,
				RootComplex: g.Device.RootComplex, NUMANode: g.Device.NUMANode,
				Vendor: boards.VendorMellanox, DeviceID: spec.Device,
				SubsystemVendor: boards.VendorMellanox, SubsystemDevice: spec.Device,
				Revision: boards.HCARevision,
				Class:    spec.Class, Link: spec.Link,
			}
			parent, err := b.hcaParent(g)
			if err != nil {
				return fmt.Errorf("HCA %d of GPU %s: %w", k, g.Address, err)
			}
			d.Address = pciaddr.Address{Domain: b.root.ID.Domain, Bus: parent.Secondary}
			n := endpointNode(d, parent)
			parent.Children = append(parent.Children, n)
			n.Anchor = pick.pick(n)
			t.HCAs = append(t.HCAs, HCA{Node: n, GPU: g})
		}
	}
	return nil
}

// hcaParent adds the bridge an HCA of gpu hangs from and returns it.
func (b *rcBuilder) hcaParent(gpu *Node) (*Node, error) {
	if down := gpu.Parent; down != nil && down.Role == SwitchDown {
		up := down.Parent
		bus := int(up.Subordinate) + 1
		if bus <= 0xff && len(up.Children) < maxPorts && b.canWiden(up, uint8(bus)) {
			return b.addDownPort(up, uint8(bus)), nil
		}
	}
	bus, ok := b.highestFreeBus()
	if !ok {
		return nil, fmt.Errorf("no free bus left on %s for a root port of its own", b.root.ID)
	}
	dev, fn, ok := b.freeRootPortSlot()
	if !ok {
		return nil, fmt.Errorf("no free device number on root bus %02x for a root port of its own", b.root.ID.Bus)
	}
	return b.addRootPort(dev, fn, bus, bus), nil
}

// canWiden reports whether bridge n's range can grow by one bus to reach
// bus, its subordinate plus one: no sibling range, host device or other
// root complex holds it, at every level up to the root port.
func (b *rcBuilder) canWiden(n *Node, bus uint8) bool {
	if b.isReservedBus(bus) {
		return false
	}
	for ; n != nil; n = n.Parent {
		siblings := b.root.Children
		if n.Parent != nil {
			if bus <= n.Parent.Subordinate {
				return !claimed(n.Parent.Children, n, bus)
			}
			siblings = n.Parent.Children
		} else if bus > b.limit {
			return false
		}
		if claimed(siblings, n, bus) {
			return false
		}
	}
	return true
}

// claimed reports whether a bridge among nodes other than self holds bus.
func claimed(nodes []*Node, self *Node, bus uint8) bool {
	return slices.ContainsFunc(nodes, func(s *Node) bool {
		return s != self && s.Role.IsBridge() && s.Secondary <= bus && bus <= s.Subordinate
	})
}

// highestFreeBus finds the highest bus of the root complex that no bridge
// range and no host device holds. Counting down from the top keeps the
// choice apart from the low buses that profiles number GPUs on.
func (b *rcBuilder) highestFreeBus() (uint8, bool) {
	for x := int(b.limit); x > int(b.root.ID.Bus); x-- {
		if !b.isReservedBus(uint8(x)) && !claimed(b.root.Children, nil, uint8(x)) {
			return uint8(x), true
		}
	}
	return 0, false
}
