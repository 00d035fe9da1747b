package plancheck

import (
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// addresses checks that every function has an address of its own, apart
// from the host's devices and their buses.
func (c *planChecker) addresses() {
	seen := map[pciaddr.Address]bool{}
	host := map[pciaddr.Address]bool{}
	hostBus := map[[2]uint16]pciaddr.Address{}
	for _, h := range c.p.HostDevices {
		host[h.Address] = true
		hostBus[[2]uint16{h.Address.Domain, uint16(h.Address.Bus)}] = h.Address
	}
	for _, n := range c.p.Tree.Nodes() {
		a := n.Address
		if seen[a] {
			c.fail("%s: two functions at one address", a)
		}
		seen[a] = true
		if host[a] {
			c.fail("%s: a mock %s at a host device's address", a, n.Role)
		}
		if !n.Role.IsBridge() {
			continue
		}
		for x := int(n.Secondary); x <= int(n.Subordinate); x++ {
			if h, ok := hostBus[[2]uint16{a.Domain, uint16(x)}]; ok {
				c.fail("%s: buses %02x-%02x hold host device %s", a, n.Secondary, n.Subordinate, h)
			}
		}
	}
}

// hcas checks the machine's HCAs against their GPUs.
func (c *planChecker) hcas() {
	spec := c.p.Machine.HCAs
	count := map[*plan.Node]int{}
	listed := map[*plan.Node]bool{}
	for _, h := range c.p.Tree.HCAs {
		n, g := h.Node, h.GPU
		listed[n] = true
		count[g]++
		a := n.Address
		switch {
		case spec == nil:
			c.fail("%s: an HCA, but the machine has no infiniband block", a)
			continue
		case n.Role != plan.Endpoint || n.Device == nil || n.Device.Kind != profile.HCA:
			c.fail("%s: listed as an HCA but is a %s", a, n.Role)
			continue
		case g.Device == nil || g.Device.Kind != profile.GPU:
			c.fail("%s: the HCA's GPU %s is not a GPU", a, g.Address)
			continue
		}
		id := n.Identity
		if id.Vendor != boards.VendorMellanox || id.Device != spec.Device || id.Class != spec.Class {
			c.fail("%s: HCA %04x:%04x class %06x, want %04x:%04x class %06x", a, id.Vendor, id.Device, id.Class, boards.VendorMellanox, spec.Device, spec.Class)
		}
		if n.RootComplex != g.RootComplex {
			c.fail("%s: HCA on %s, its GPU %s on %s", a, n.RootComplex, g.Address, g.RootComplex)
		}
		if n.NUMANode != g.NUMANode {
			c.fail("%s: HCA on NUMA node %d, its GPU %s on %d", a, n.NUMANode, g.Address, g.NUMANode)
		}
		switch p := n.Parent; {
		case p == nil:
			c.fail("%s: an HCA on the root bus", a)
		case p.Role == plan.RootPort:
			if len(p.Children) != 1 {
				c.fail("%s: the HCA's root port %s is shared", a, p.Address)
			}
		case p.Role == plan.SwitchDown:
			if g.Parent == nil || g.Parent.Role != plan.SwitchDown || g.Parent.Parent != p.Parent {
				c.fail("%s: HCA behind switch %s, not its GPU %s's", a, p.Parent.Address, g.Address)
			}
		default:
			c.fail("%s: an HCA behind a %s", a, p.Role)
		}
	}
	for _, n := range c.p.Tree.Nodes() {
		if n.Role != plan.Endpoint {
			continue
		}
		switch {
		case n.Device.Kind == profile.HCA && !listed[n]:
			c.fail("%s: an HCA no GPU owns", n.Address)
		case n.Device.Kind == profile.GPU && spec != nil && count[n] != spec.PerGPU:
			c.fail("%s: GPU with %d HCAs, want %d", n.Address, count[n], spec.PerGPU)
		}
	}
}
